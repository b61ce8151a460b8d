import http.server
import socket
import threading

import pytest
import yaml

from ampflow.errors import ConfigError, PipelineError
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline
from ampflow.pipeline.submit import SubmitConfig, submit

IMAGE = "registry.example/ampflow:1.2.3"


def _load(path):
    from kfp import components

    components.load_component_from_file(str(path))  # the IR YAML loads back with kfp
    docs = list(yaml.safe_load_all(open(path)))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def test_compile_every_executor_runs_the_configured_image(tmp_path):
    spec, _ = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image=IMAGE)))
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) >= 6
    assert {e["container"]["image"] for e in executors.values()} == {IMAGE}
    # lightweight components over our image: no pip install of kfp at run time
    for e in executors.values():
        assert "pip install" not in " ".join(e["container"].get("command", []))


def test_compile_train_task_requests_gpu_node_selector_and_toleration(tmp_path):
    spec, platform = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image=IMAGE)))
    train_exec = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    accelerator = train_exec["resources"]["accelerator"]
    assert accelerator["resourceType"] == "nvidia.com/gpu"
    assert str(accelerator["resourceCount"]) == "1"
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    k8s = executors["exec-train"]
    assert k8s["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
    assert k8s["tolerations"][0]["key"] == "nvidia.com/gpu"
    deploy = executors["exec-deploy-serving"]
    assert deploy["podMetadata"]["labels"] == {"ampflow.dev/serving-client": "true"}
    assert deploy["pvcMount"][0]["mountPath"] == "/models"
    assert deploy["pvcMount"][0]["constant"] == "tf-serving-models"
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["serving_target"]["defaultValue"] == "none"  # deploying is opt-in
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["prepare-data"]["cachingOptions"].get("enableCache") is True
    for name, executor in spec["deploymentSpec"]["executors"].items():
        assert executor["container"]["resources"].get("resourceCpuRequest"), name
        assert executor["container"]["resources"].get("resourceMemoryRequest"), name


def test_compile_cpu_cluster_switches_gpu_off(tmp_path):
    spec, platform = _load(compile_pipeline(tmp_path / "p.yaml",
                                            PipelineOptions(image=IMAGE, gpu=False)))
    train_exec = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert "accelerator" not in train_exec["resources"]
    assert "exec-train" not in str(platform)


def test_compile_float32_baseline_branch_adds_a_second_train_task(tmp_path):
    spec, _ = _load(compile_pipeline(tmp_path / "p.yaml",
                                     PipelineOptions(image=IMAGE, with_float32_baseline=True)))
    tasks = spec["root"]["dag"]["tasks"]
    assert "train-2" in tasks
    params = tasks["train-2"]["inputs"]["parameters"]
    assert params["precision"]["runtimeValue"]["constant"] == "float32"


def test_pipeline_options_unpinned_image_is_rejected():
    with pytest.raises(ConfigError, match="pinned image reference"):
        PipelineOptions(image="ampflow")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_submit_with_nothing_listening_fails_fast_with_clear_error():
    port = _free_port()
    with pytest.raises(PipelineError, match=rf"cannot reach the KFP endpoint http://127.0.0.1:{port}"):
        submit(SubmitConfig(host=f"http://127.0.0.1:{port}", image=IMAGE, connect_timeout_s=2))


class _Refuser(http.server.BaseHTTPRequestHandler):
    def _refuse(self):
        body = b'{"error": "forbidden", "code": 7, "message": "forbidden"}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, *args):
        pass


def test_submit_to_an_endpoint_that_refuses_names_the_refusal():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuser)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(PipelineError, match=rf"KFP at {host} refused the run"):
            submit(SubmitConfig(host=host, image=IMAGE, connect_timeout_s=2))
    finally:
        server.shutdown()


def test_submit_config_rejects_a_host_that_is_not_a_url():
    with pytest.raises(ConfigError, match="host must be an http"):
        SubmitConfig(host="localhost:8080")
