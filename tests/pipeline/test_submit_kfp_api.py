"""A successful `ampflow submit`, end to end against a loopback KFP REST API (fake_kfp_api.py).

The real `kfp.Client` talks to the fake over HTTP: the test checks what reached "KFP" (the
experiment, the run, its parameters, the pipeline IR inside it) against what `compile` writes
for the same flags. KFP's own behaviour after that (scheduling, the driver) is not here.
"""

from __future__ import annotations

import json

import pytest
import yaml
from fake_kfp_api import FakeKfpApi
from google.protobuf import json_format

from ampflow.cli import main

IMAGE = "registry.example/ampflow:1.2.3"
CLUSTER_FLAGS = ["--image", IMAGE, "--gpu-node-selector",
                 "cloud.google.com/gke-accelerator=nvidia-l4", "--gpu-toleration",
                 "nvidia.com/gpu=present:NoSchedule", "--train-gpus", "2",
                 "--train-cpu", "6:12", "--train-memory", "24Gi"]


@pytest.fixture
def kfp_api():
    with FakeKfpApi() as api:
        yield api


def _as_protos(docs: list[dict]):
    """(PipelineSpec, PlatformSpec) of IR documents: equal when the IR is, whatever its JSON."""
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
    platform = json_format.ParseDict(docs[1] if len(docs) > 1 else {},
                                     pipeline_spec_pb2.PlatformSpec())
    return spec, platform


def _compiled(tmp_path, flags: list[str]) -> list[dict]:
    out = tmp_path / "compiled.yaml"
    assert main(["compile", "--output", str(out), *flags]) == 0
    return list(yaml.safe_load_all(out.read_text()))


def test_submit_creates_a_run_of_the_compiled_ir_with_its_parameters(kfp_api, tmp_path, capsys):
    code = main(["submit", "--host", kfp_api.url, "--no-check-cluster", "--run-name", "r1",
                 *CLUSTER_FLAGS, "--param", "epochs=3", "--param", "xla=on"])
    out = capsys.readouterr().out
    assert code == 0, out
    (run,) = kfp_api.runs.values()
    assert f"/#/runs/details/{run['run_id']}" in out
    (experiment,) = kfp_api.experiments.values()
    assert experiment["display_name"] == "ampflow" and run["experiment_id"] == \
        experiment["experiment_id"]
    assert run["display_name"] == "r1"
    assert run["runtime_config"]["parameters"] == {"epochs": 3, "xla": "on"}
    sent = run["pipeline_spec"]
    assert _as_protos([sent["pipeline_spec"], sent["platform_spec"]]) == _as_protos(
        _compiled(tmp_path, CLUSTER_FLAGS))
    # the cluster flags reached the train task of the IR that was sent
    executors = sent["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-train"]["nodeSelector"]["labels"] == {
        "cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert executors["exec-train"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
         "effect": "NoSchedule"}]
    train = sent["pipeline_spec"]["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert str(train["resources"]["accelerator"]["resourceCount"]) == "2"
    assert train["resources"]["resourceCpuRequest"] == "6"
    assert train["resources"]["resourceCpuLimit"] == "12"
    assert train["resources"]["resourceMemoryLimit"] == "24Gi"


def test_a_second_submit_reuses_the_experiment(kfp_api, capsys):
    for _ in range(2):
        assert main(["submit", "--host", kfp_api.url, "--no-check-cluster", "--image",
                     IMAGE]) == 0
    assert len(kfp_api.runs) == 2 and len(kfp_api.experiments) == 1
    capsys.readouterr()


def test_submit_behind_auth_sends_the_token_and_says_what_to_set_without_it(monkeypatch,
                                                                            capsys):
    with FakeKfpApi(token="s3cret") as api:
        code = main(["submit", "--host", api.url, "--no-check-cluster", "--image", IMAGE])
        err = capsys.readouterr().err
        assert code == 1 and "HTTP 401" in err and "$KFP_TOKEN" in err, err
        assert api.runs == {}
        monkeypatch.setenv("KFP_TOKEN", "s3cret")
        assert main(["submit", "--host", api.url, "--no-check-cluster", "--image",
                     IMAGE]) == 0
        assert len(api.runs) == 1


def test_the_fake_keeps_an_uploaded_pipeline_and_version_as_compiled(kfp_api, tmp_path):
    """The upload endpoints of the fake, through the real client (for a future `--upload`)."""
    import kfp

    docs = _compiled(tmp_path, ["--image", IMAGE])
    client = kfp.Client(host=kfp_api.url)
    pipeline = client.upload_pipeline(str(tmp_path / "compiled.yaml"), pipeline_name="ampflow")
    version = client.upload_pipeline_version(str(tmp_path / "compiled.yaml"),
                                             pipeline_version_name="v2",
                                             pipeline_id=pipeline.pipeline_id)
    stored = [v for v in kfp_api.versions.values() if v["pipeline_id"] == pipeline.pipeline_id]
    assert [v["display_name"] for v in stored] == ["ampflow", "v2"]
    assert version.pipeline_version_id == stored[1]["pipeline_version_id"]
    for v in stored:
        assert _as_protos(v["ir"]) == _as_protos(docs)
    assert json.loads(json.dumps(stored[0]["ir"])) == docs
