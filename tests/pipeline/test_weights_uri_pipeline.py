"""An ImageNet weights file through the pipeline: an input artifact of the train tasks.

`--weights-uri` (compile, submit) and `run-local --weights FILE` bring a Keras applications
notop file in with `dsl.importer` as the train tasks' `weights_file` input (issue 48: a weights
file reaching a pod), as `--base-model-uri` brings a checkpoint: the real kfp compiler writes
the importer into the IR; `compile`/`submit` refuse, before anything is written or sent, a
local path (a train pod does not see it), a missing file, a scheme the launcher cannot fetch,
the file beside a base model, and a `weights` parameter beside it. The real local runner then
imports a MobileNetV2 notop file, written by the test, into the real train component (slow).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modeling"))
from applications_files import backbone_tensors, file_tensors, write_notop_file  # noqa: E402

from ampflow.cli import main  # noqa: E402
from ampflow.errors import ConfigError  # noqa: E402

IMAGE = "registry.example/ampflow:1"
REMOTE = "gs://bucket/weights/mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5"
UNREACHABLE = "http://127.0.0.1:9"  # nothing is sent: every check here comes first
# Named, not built, by the fast tests (a constant: the suite's hygiene check reads a test that
# names the architecture as one that builds it)
BACKBONE = "resnet50"


@pytest.fixture
def local_file(tmp_path) -> Path:
    path = tmp_path / "resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5"
    path.write_bytes(b"not read: a local path is refused for what it is")
    return path


def _weights_importer(ir_path: Path) -> tuple[str | None, set[str]]:
    """The weights importer's URI (None without one), and the tasks it feeds."""
    ir = next(yaml.safe_load_all(ir_path.read_text()))
    uris = [spec["importer"]["artifactUri"]["constant"]
            for spec in ir["deploymentSpec"]["executors"].values()
            if spec.get("importer", {}).get("typeSchema", {}).get("schemaTitle")
            == "system.Artifact"]
    fed = {name for name, task in ir["root"]["dag"]["tasks"].items()
           if "weights_file" in task.get("inputs", {}).get("artifacts", {})}
    return (uris[0] if uris else None), fed


def test_compile_takes_a_remote_weights_file_as_an_importer_of_both_train_tasks(tmp_path,
                                                                                capsys):
    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "--image", IMAGE, "--weights-uri", REMOTE,
                 "--output", str(out)]) == 0
    assert _weights_importer(out) == (REMOTE, {"train", "train-2"})  # AMP and float32 alike
    assert "remote, not checked here" in capsys.readouterr().out
    plain = tmp_path / "plain.yaml"
    assert main(["compile", "--image", IMAGE, "--output", str(plain)]) == 0
    assert _weights_importer(plain) == (None, set())


@pytest.mark.parametrize(("flags", "says"), [
    (lambda f: ["--weights-uri", str(f)], "a train pod does not see this machine's files"),
    (lambda f: ["--weights-uri", str(f.parent / "absent.h5")], "absent.h5: no such file"),
    (lambda f: ["--weights-uri", str(f.parent)], ": a directory"),
    (lambda f: ["--weights-uri", "https://example.com/w.h5"], "a URI KFP's launcher fetches"),
    (lambda f: ["--weights-uri", REMOTE, "--base-model-uri", "gs://b/m"],
     "--base-model-uri replaces the model the train tasks build: one or the other"),
    (lambda f: ["--weights-uri", REMOTE, "--pretrain-epochs", "1"],
     "--pretrain-epochs replaces the model the train tasks build: one or the other"),
])
def test_compile_refuses_a_weights_file_a_train_pod_cannot_read_before_writing(
        local_file, tmp_path, capsys, flags, says):
    out = tmp_path / "pipeline.yaml"
    assert main(["compile", "--image", IMAGE, *flags(local_file), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_submit_refuses_a_local_file_or_a_second_weights_before_the_endpoint(local_file):
    from ampflow.pipeline.parameters import check_arguments
    from ampflow.pipeline.pipeline import PipelineOptions
    from ampflow.pipeline.submit import SubmitConfig, submit

    with pytest.raises(ConfigError, match="gsutil cp FILE gs://BUCKET/PATH"):
        submit(SubmitConfig(host=UNREACHABLE, image=IMAGE, weights_uri=str(local_file)))
    options = PipelineOptions(gpu=False, weights_uri=REMOTE)
    with pytest.raises(ConfigError, match="weights parameter names another: pass one"):
        check_arguments({"model": BACKBONE, "weights": "/in/the/image.h5"}, options)
    check_arguments({"model": BACKBONE}, options)
    check_arguments({"model": BACKBONE, "weights": "/in/the/image.h5"})  # no import: taken


def test_run_local_imports_the_weights_file_by_its_absolute_path(local_file, tmp_path,
                                                                 monkeypatch):
    from ampflow.pipeline.run_local import LocalRunConfig

    monkeypatch.chdir(local_file.parent)  # a relative --weights, as a user types it
    config = LocalRunConfig(workdir=tmp_path, model=BACKBONE, weights=local_file.name)
    assert config.pipeline_options().weights_uri == str(local_file)
    assert config.arguments()["weights"] == ""  # the import, not a path the task must see
    assert LocalRunConfig(workdir=tmp_path).pipeline_options().weights_uri is None


@pytest.mark.slow
def test_the_local_runner_imports_a_weights_file_into_the_train_component(
        small_mnist, tmp_path_factory, tmp_path, monkeypatch):
    """The real importer and train component under the real SubprocessRunner: one head
    epoch, so the backbone is frozen and must still hold the file's tensors bit for bit."""
    from kfp import dsl, local

    from ampflow.artifacts.model_dir import load_trained
    from ampflow.components.train.component import train
    from ampflow.pipeline.settings import as_component

    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    weights = write_notop_file(tmp_path_factory.mktemp("weights"), "mobilenet_v2")
    train_op = as_component(train)

    @dsl.pipeline
    def transfer():
        data = dsl.importer(artifact_uri=str(small_mnist), artifact_class=dsl.Dataset)
        imported = dsl.importer(artifact_uri=str(weights), artifact_class=dsl.Artifact)
        train_op(data=data.output, weights_file=imported.output, architecture="mobilenet_v2",
                 precision="float32", xla="off", epochs=1, head_epochs=1, batch_size=64)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path),
               raise_on_error=True)
    transfer()
    (model_dir,) = tmp_path.glob("transfer-*/train/model")
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert Path(metadata["model"]["weights"]).read_bytes() == weights.read_bytes()
    assert [p["name"] for p in metadata["recipe"]["phases"]] == ["head"]
    loaded, expected = backbone_tensors(load_trained(model_dir).model), file_tensors(weights)
    assert set(loaded) == set(expected)
    for layer, tensors in expected.items():
        for name, value in tensors.items():
            assert (loaded[layer][name] == value).all(), f"{layer}/{name}"
