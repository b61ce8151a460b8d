"""The distributed pipeline train task on a cluster: TFJob creation, waiting, failure reasons,
publishing the chief's model; and the pipeline's `train_workers` option.

No API server runs here, so a tiny fake on loopback answers the few TFJob and pod calls the
task makes over real HTTP (the real `kubernetes` client). It is not Kubernetes and not the
Training Operator: each test scripts what the "operator" does (publish a model, fail a pod).
"""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from ampflow.components.train import TrainConfig
from ampflow.components.train.clusters import kubeflow_job as kj

# Named, not built (the suite's hygiene check reads a test naming it as one that builds it)
WEIGHTS_BACKBONE = "mobilenet_v2"

TFJOBS = "/apis/kubeflow.org/v1/namespaces/ns/tfjobs"


class FakeApi:
    """TFJobs and pods of namespace `ns`; `on_create(job)` plays the operator."""

    def __init__(self, on_create=None, forbid_create=False):
        self.jobs: dict[str, dict] = {}
        self.pods: list[dict] = []
        self.pods_by_name: dict[str, dict] = {}
        self.logs: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.on_create = on_create
        self.forbid_create = forbid_create
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                api.calls.append(("GET", self.path))
                path = self.path.split("?")[0]
                if path.startswith(TFJOBS + "/"):
                    name = path.rsplit("/", 1)[1]
                    if name in api.jobs:
                        return self._send(200, api.jobs[name])
                    return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                if path.startswith("/api/v1/namespaces/ns/pods/") and not path.endswith("/log"):
                    pod = api.pods_by_name.get(path.rsplit("/", 1)[1])
                    if pod is not None:
                        return self._send(200, pod)
                    return self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                if path == "/api/v1/namespaces/ns/pods":
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1",
                                            "metadata": {}, "items": api.pods})
                if path.endswith("/log"):
                    return self._send(200, api.logs.get(path.split("/")[-2], ""))
                return self._send(404, {"kind": "Status", "code": 404})

            def do_POST(self):
                api.calls.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if api.forbid_create:
                    return self._send(403, {"kind": "Status", "code": 403,
                                            "reason": "Forbidden"})
                api.jobs[body["metadata"]["name"]] = body
                if api.on_create:
                    api.on_create(api, body)
                return self._send(201, body)

            def do_DELETE(self):
                api.calls.append(("DELETE", self.path))
                api.jobs.pop(self.path.split("?")[0].rsplit("/", 1)[1], None)
                return self._send(200, {"kind": "Status", "code": 200})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def client(self):
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return client.ApiClient(configuration)

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def fast_poll(monkeypatch):
    monkeypatch.setattr(kj, "_POLL_S", 0.05)


def _settings(tmp_path, **kw):
    return kj.TFJobSettings(image="registry.example/ampflow:1", workers=2, gpu=False,
                            mount=str(tmp_path / "claim"), **kw)


def _status(state, reason="", message=""):
    return {"conditions": [{"type": "Created", "status": "True"},
                           {"type": state, "status": "True", "reason": reason,
                            "message": message}]}


@pytest.mark.slow
def test_tfjob_success_publishes_the_chiefs_model_in_the_task_output(
        trained_model, prepared_digits, tmp_path, fast_poll):
    published = trained_model("mixed_float16")
    seen = {}

    def operator(api, job):  # the chief publishes into --output-dir on the claim, then done
        args = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
        seen["args"] = args
        output_dir = args[args.index("--output-dir") + 1]
        shutil.copytree(published, output_dir)
        job["status"] = _status("Succeeded", "TFJobSucceeded", "all workers finished")

    fake = FakeApi(on_create=operator)
    try:
        # a fine-tune: the .keras file lives in the launcher pod (an importer artifact)
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "artifact",
                             epochs=3, workers=2, model=str(published / "model.keras"))
        result = kj.run_training_job(config, _settings(tmp_path), "run-1/train",
                                     api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    name = kj.job_name("run-1/train")
    assert result.metadata["kubeflow_job"] == {"kind": "TFJob", "name": name, "namespace": "ns"}
    assert (tmp_path / "artifact" / "model.keras").is_file()
    assert (tmp_path / "artifact" / "metadata.json").is_file()
    root = tmp_path / "claim" / "runs" / name
    assert (root / "data" / "dataset_info.json").is_file()  # the data went onto the claim
    args = seen["args"]
    assert args[0] == "train" and "--workers" not in args
    assert args[args.index("--data-dir") + 1] == str(root / "data")
    assert args[args.index("--checkpoint-dir") + 1] == str(root / "checkpoints")
    assert args[args.index("--epochs") + 1] == "3"
    # the workers read the model to fine-tune from the claim, not from the launcher's disk
    assert args[args.index("--model") + 1] == str(root / "base_model.keras")
    assert (root / "base_model.keras").read_bytes() == (published / "model.keras").read_bytes()


def test_tfjob_workers_read_a_pretrained_checkpoint_dir_from_the_claim(prepared_digits, tmp_path,
                                                                       fast_poll):
    """An imported checkpoint dir lives in the launcher pod: staged whole onto the claim."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "modeling"))
    from hf_bert_files import write_hf_bert

    checkpoint = tmp_path / "imported" / "bert"
    write_hf_bert(checkpoint, layers=1, hidden=16, heads=2, intermediate=32)
    seen = {}
    fake = FakeApi(on_create=_publishing_chief(seen))
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "artifact",
                             workers=2, model=str(checkpoint))
        kj.run_training_job(config, _settings(tmp_path), "run-3/train",
                            api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    staged = tmp_path / "claim" / "runs" / kj.job_name("run-3/train") / "base_model"
    assert seen["args"][seen["args"].index("--model") + 1] == str(staged)
    assert sorted(p.name for p in staged.iterdir()) == sorted(p.name for p in checkpoint.iterdir())
    for item in checkpoint.iterdir():
        assert (staged / item.name).read_bytes() == item.read_bytes()


def _publishing_chief(seen: dict):
    """An operator whose chief publishes a (stand-in) model, then is done; `seen["args"]`: the
    workers' command line."""
    def operator(api, job):
        args = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
        seen["args"] = args
        output_dir = Path(args[args.index("--output-dir") + 1])
        output_dir.mkdir(parents=True)
        (output_dir / "metadata.json").write_text("{}")
        job["status"] = _status("Succeeded", "TFJobSucceeded", "all workers finished")
    return operator


def test_tfjob_workers_read_an_imported_weights_file_from_the_claim(prepared_digits, tmp_path,
                                                                   fast_poll):
    """An imported ImageNet weights file lives in the launcher pod: staged onto the claim."""
    imported = tmp_path / "imported" / "notop.h5"
    imported.parent.mkdir()
    imported.write_bytes(b"the file's bytes, as KFP's launcher downloaded them")
    seen = {}
    fake = FakeApi(on_create=_publishing_chief(seen))
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "artifact",
                             workers=2, model=WEIGHTS_BACKBONE, weights=str(imported))
        kj.run_training_job(config, _settings(tmp_path), "run-4/train",
                            api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    staged = tmp_path / "claim" / "runs" / kj.job_name("run-4/train") / "weights.h5"
    assert seen["args"][seen["args"].index("--weights") + 1] == str(staged)
    assert staged.read_bytes() == imported.read_bytes()


def test_tfjob_failure_names_the_pod_its_exit_code_and_error(prepared_digits, tmp_path,
                                                             fast_poll):
    name = kj.job_name("run-2/train")

    def operator(api, job):
        job["status"] = _status("Failed", "TFJobFailed", "TFJob ns/x has failed because 1 "
                                "Worker replica(s) failed.")
        api.pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-worker-1", "namespace": "ns"},
            "status": {"containerStatuses": [{
                "name": "tensorflow", "image": "i", "imageID": "", "ready": False,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]}})
        api.logs[f"{name}-worker-1"] = ("some log\nampflow train: error: batch_size must be "
                                        "<= the training split size\n")

    fake = FakeApi(on_create=operator)
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "artifact",
                             workers=2)
        with pytest.raises(kj.TrainingJobError, match=(
                rf"TFJob ns/{name} failed: TFJobFailed: .*1 Worker replica\(s\) failed.*; "
                rf"{name}-worker-1: exit 2 \(Error\): batch_size must be <= the training")):
            kj.run_training_job(config, _settings(tmp_path), "run-2/train",
                                api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    assert not (tmp_path / "artifact" / "metadata.json").exists()


@pytest.mark.slow
def test_a_retried_task_replaces_its_failed_tfjob(trained_model, prepared_digits, tmp_path,
                                                  fast_poll):
    name = kj.job_name("run-3/train")
    published = trained_model("mixed_float16")

    def operator(api, job):
        args = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"]
        shutil.copytree(published, args[args.index("--output-dir") + 1], dirs_exist_ok=True)
        job["status"] = _status("Succeeded")

    fake = FakeApi(on_create=operator)
    fake.jobs[name] = {"metadata": {"name": name}, "status": _status("Failed", "TFJobFailed")}
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "artifact",
                             workers=2)
        kj.run_training_job(config, _settings(tmp_path), "run-3/train",
                            api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    methods = [m for m, path in fake.calls if name in path or path.startswith(TFJOBS)]
    assert methods[:3] == ["GET", "DELETE", "GET"] and "POST" in methods


def test_tfjob_forbidden_says_which_role_to_bind(prepared_digits, tmp_path, fast_poll):
    fake = FakeApi(forbid_create=True)
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "a", workers=2)
        with pytest.raises(kj.TrainingJobError,
                           match="HTTP 403.*k8s/training/rbac.*pipeline-runner"):
            kj.run_training_job(config, _settings(tmp_path), "r/t", api_client=fake.client(),
                                namespace="ns")
    finally:
        fake.close()


@pytest.mark.parametrize("run_key", [
    "{{$.pipeline_job_uuid}}/{{$.pipeline_task_name}}",  # what KFP passed through before
    "{{$.pipeline_job_uuid}}", ""])
def test_an_unresolved_run_key_is_refused_before_anything_is_created(prepared_digits, tmp_path,
                                                                      run_key):
    fake = FakeApi()
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "a", workers=2)
        with pytest.raises(kj.ConfigError, match="run_key must be the run id KFP resolved"):
            kj.run_training_job(config, _settings(tmp_path), run_key, api_client=fake.client(),
                                namespace="ns")
    finally:
        fake.close()
    assert fake.calls == [] and not (tmp_path / "claim").exists()


def test_two_runs_get_two_jobs_and_the_job_is_owned_by_the_runs_workflow(
        prepared_digits, tmp_path, fast_poll, monkeypatch):
    """Each run its own TFJob, owned by the Argo Workflow that owns the task's pod: deleting
    the run deletes the job (and its pods, owned by the job)."""
    monkeypatch.setenv("HOSTNAME", "ampflow-abc-system-container-impl-1")

    def operator(api, job):
        job["status"] = _status("Failed", "TFJobFailed", "stop here")

    fake = FakeApi(on_create=operator)
    fake.pods_by_name["ampflow-abc-system-container-impl-1"] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ampflow-abc-system-container-impl-1", "namespace": "ns",
                     "uid": "pod-uid",
                     "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1",
                                          "kind": "Workflow", "name": "ampflow-abc",
                                          "uid": "wf-uid", "controller": True}]}}
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "a", workers=2)
        for run in ("run-a", "run-b"):
            with pytest.raises(kj.TrainingJobError, match="stop here"):
                kj.run_training_job(config, _settings(tmp_path), run,
                                    api_client=fake.client(), namespace="ns")
    finally:
        fake.close()
    assert sorted(fake.jobs) == sorted([kj.job_name("run-a"), kj.job_name("run-b")])
    for job in fake.jobs.values():
        assert job["metadata"]["ownerReferences"] == [{
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "ampflow-abc",
            "uid": "wf-uid"}]


def test_sigterm_deletes_the_tfjob_so_a_cancelled_run_frees_its_gpus(prepared_digits, tmp_path,
                                                                       fast_poll):
    import os
    import signal

    def operator(api, job):  # running until the task is cancelled
        job["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()

    fake = FakeApi(on_create=operator)
    before = signal.getsignal(signal.SIGTERM)
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "a", workers=2)
        with pytest.raises(kj.TaskCancelled, match="cancelled: TFJob ns/.* deleted"):
            kj.run_training_job(config, _settings(tmp_path), "run-c", api_client=fake.client(),
                                namespace="ns")
    finally:
        fake.close()
    assert fake.jobs == {}
    assert ("DELETE", f"{TFJOBS}/{kj.job_name('run-c')}") in [
        (m, p.split("?")[0]) for m, p in fake.calls]
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is gone after the task


def test_a_claim_this_user_cannot_write_is_one_clear_line(prepared_digits, tmp_path,
                                                         monkeypatch):
    import os
    from pathlib import Path

    claim = tmp_path / "claim"
    claim.mkdir()
    claim.chmod(0o555)  # a fresh block-storage volume: root's, 0755; here: not ours to write
    if os.getuid() == 0:  # root writes anywhere: answer as the kernel would for uid 10001
        real_access = os.access
        monkeypatch.setattr(kj.os, "access", lambda path, mode: Path(path) != claim
                            and real_access(path, mode))
    fake = FakeApi()
    try:
        config = TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "a", workers=2)
        with pytest.raises(kj.ConfigError, match=(
                r"the training claim ampflow-training is not writable by this pod's user "
                r"\(uid \d+, gid \d+\): .*claim belongs to uid \d+ gid \d+ with mode 0555, "
                r"and KFP sets no fsGroup")):
            kj.run_training_job(config, _settings(tmp_path), "run-d",
                                api_client=fake.client(), namespace="ns")
    finally:
        claim.chmod(0o755)
        fake.close()
    assert fake.calls == []  # nothing created


def test_tfjob_settings_round_trip_and_reject_one_worker():
    settings = kj.TFJobSettings(image="i:1", workers=3)
    assert kj.TFJobSettings.from_json(settings.to_json()) == settings
    with pytest.raises(Exception, match="workers must be >= 2"):
        kj.TFJobSettings(image="i:1", workers=1)
    assert kj.job_name("a/b") == kj.job_name("a/b") != kj.job_name("a/c")
    assert len(kj.job_name("x" * 500)) <= 63


def _compiled_train_task(tmp_path, **options):
    from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(**options))
    docs = list(yaml.safe_load_all(open(path)))
    spec = docs[0]
    task = spec["root"]["dag"]["tasks"]["train"]
    executor = spec["deploymentSpec"]["executors"][
        spec["components"][task["componentRef"]["name"]]["executorLabel"]]
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] \
        if len(docs) > 1 else {}
    return task, executor, platform.get(
        spec["components"][task["componentRef"]["name"]]["executorLabel"], {})


def test_pipeline_train_workers_compiles_a_tfjob_launching_train_task(tmp_path):
    task, executor, platform = _compiled_train_task(tmp_path, train_workers=4)
    params = task["inputs"]["parameters"]
    assert params["workers"]["runtimeValue"]["constant"] == 4
    settings = kj.TFJobSettings.from_json(params["tfjob_settings"]["runtimeValue"]["constant"])
    assert (settings.workers, settings.gpu, settings.claim) == (4, True, "ampflow-training")
    # the run id as the whole value: the only form KFP's driver resolves (test_backend_rules)
    assert params["run_key"] == {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}
    assert "accelerator" not in json.dumps(executor["container"].get("resources", {}))
    assert platform["pvcMount"][0]["mountPath"] == "/mnt/ampflow"
    assert task["retryPolicy"]["maxRetryCount"] == 2


def test_pipeline_default_train_task_is_unchanged_single_worker(tmp_path):
    task, executor, _ = _compiled_train_task(tmp_path)
    assert "workers" not in task["inputs"]["parameters"]
    assert "accelerator" in json.dumps(executor["container"]["resources"])


def test_pipeline_train_workers_below_one_is_rejected():
    from ampflow.errors import ConfigError
    from ampflow.pipeline.pipeline import PipelineOptions

    with pytest.raises(ConfigError, match="train_workers must be >= 1"):
        PipelineOptions(train_workers=0)


# The kfp local run with train_workers=2 is the second run of tests/pipeline/test_demo.py.


def test_pipeline_autotune_parameter_reaches_the_train_task_not_the_float32_baseline(tmp_path):
    from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(with_float32_baseline=True))
    spec = next(yaml.safe_load_all(open(path)))
    assert spec["root"]["inputDefinitions"]["parameters"]["autotune"]["defaultValue"] is False
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["train"]["inputs"]["parameters"]["autotune"] == {
        "componentInputParameter": "autotune"}
    baseline = next(t for name, t in tasks.items() if name != "train" and name.startswith("train"))
    assert "autotune" not in baseline["inputs"]["parameters"]


def test_float32_baseline_of_a_multi_worker_task_trains_at_the_same_global_batch(tmp_path):
    """N workers train at N x batch_size; the one-process baseline must too, or the training
    parity gate compares two batch sizes (and half the steps) instead of two precisions."""
    from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

    for workers in (1, 3):
        path = compile_pipeline(tmp_path / f"p{workers}.yaml",
                                PipelineOptions(with_float32_baseline=True, train_workers=workers))
        tasks = next(yaml.safe_load_all(open(path)))["root"]["dag"]["tasks"]
        baseline = next(t for name, t in tasks.items()
                        if name != "train" and name.startswith("train"))
        multiplier = baseline["inputs"]["parameters"]["batch_size_multiplier"]
        assert multiplier["runtimeValue"]["constant"] == workers


def test_the_pipelines_default_tfjob_is_the_tfjob_settings_default():
    """One home for where a train pod runs: PipelineOptions' defaults (the compile flags) and
    TFJobSettings' own are the same constants (kubeflow_job.GPU_NODE_LABEL, ...)."""
    from ampflow.pipeline.distributed_task import train_workers_arguments
    from ampflow.pipeline.pipeline import PipelineOptions

    options = PipelineOptions(train_workers=2)
    sent = kj.TFJobSettings.from_json(train_workers_arguments(options)["tfjob_settings"])
    assert sent == kj.TFJobSettings(image=options.image, workers=2)
