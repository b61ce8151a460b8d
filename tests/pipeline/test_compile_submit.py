import http.server
import socket
import threading
from pathlib import Path

import pytest
import yaml

from ampflow.errors import ConfigError, PipelineError
from ampflow.files import yaml_documents
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline
from ampflow.pipeline.submit import SubmitConfig, submit

IMAGE = "registry.example/ampflow:1.2.3"


@pytest.fixture(scope="module")
def default_ir(tmp_path_factory):
    """The IR of the default options, compiled once: (pipeline spec, platform spec)."""
    return _load(compile_pipeline(tmp_path_factory.mktemp("ir") / "p.yaml",
                                  PipelineOptions(image=IMAGE)))


def _load(path):
    from kfp import components

    components.load_component_from_file(str(path))  # the IR YAML loads back with kfp
    docs = yaml_documents(open(path))
    return docs[0], (docs[1] if len(docs) > 1 else {})


def test_compile_every_executor_runs_the_configured_image(default_ir):
    spec, _ = default_ir
    executors = spec["deploymentSpec"]["executors"]
    assert len(executors) >= 6
    assert {e["container"]["image"] for e in executors.values()} == {IMAGE}
    # lightweight components over our image: no pip install of kfp at run time
    for e in executors.values():
        assert "pip install" not in " ".join(e["container"].get("command", []))


def test_compile_train_task_requests_gpu_node_selector_and_toleration(default_ir):
    spec, platform = default_ir
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in ("exec-train", "exec-train-2"):  # AMP and float32 training alike
        train_exec = spec["deploymentSpec"]["executors"][name]["container"]
        accelerator = train_exec["resources"]["accelerator"]
        assert accelerator["resourceType"] == "nvidia.com/gpu"
        assert str(accelerator["resourceCount"]) == "1"
        assert executors[name]["nodeSelector"]["labels"] == {"nvidia.com/gpu.present": "true"}
        assert executors[name]["tolerations"][0]["key"] == "nvidia.com/gpu"
    deploy = executors["exec-deploy-serving"]
    assert deploy["podMetadata"]["labels"] == {"ampflow.dev/serving-client": "true"}
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["serving_target"]["defaultValue"] == "none"  # deploying is opt-in
    tasks = spec["root"]["dag"]["tasks"]
    assert tasks["train"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["train-2"]["retryPolicy"]["maxRetryCount"] == 2
    assert tasks["prepare-data"]["cachingOptions"].get("enableCache") is True
    for name, executor in spec["deploymentSpec"]["executors"].items():
        assert executor["container"]["resources"].get("resourceCpuRequest"), name
        assert executor["container"]["resources"].get("resourceMemoryRequest"), name


def _task_with_component(dag_tasks: dict, component: str) -> list[str]:
    return [name for name, t in dag_tasks.items() if t["componentRef"]["name"] == component]


def test_compile_deploy_and_its_pvc_mount_exist_only_under_a_serving_target_condition(default_ir):
    spec, platform = default_ir
    root_tasks = spec["root"]["dag"]["tasks"]
    # not a task of the root DAG: the default run (serving_target "none") never creates its pod
    assert _task_with_component(root_tasks, "comp-deploy-serving") == []
    (condition,) = [t for t in root_tasks.values()
                    if t["componentRef"]["name"].startswith("comp-condition")]
    assert condition["triggerPolicy"]["condition"] == (
        "inputs.parameter_values['pipelinechannel--serving_target'] != 'none'")
    inner = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"]
    assert _task_with_component(inner, "comp-deploy-serving") == ["deploy-serving"]
    assert inner["deploy-serving"]["cachingOptions"].get("enableCache") is not True
    # the comparison with the model serving runs first in the branch, never cached, and
    # deploy waits for its gate
    assert _task_with_component(inner, "comp-compare-serving") == ["compare-serving"]
    assert inner["compare-serving"]["cachingOptions"].get("enableCache") is not True
    assert inner["serving-gate"]["dependentTasks"] == ["compare-serving"]
    assert "serving-gate" in inner["deploy-serving"]["dependentTasks"]
    # the PVC mounts belong to the executors only that conditional branch runs: deploy, and
    # the comparison that reads the model serving from the same store
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mounts = {name: e["pvcMount"] for name, e in executors.items() if "pvcMount" in e}
    assert sorted(mounts) == ["exec-compare-serving", "exec-deploy-serving"]
    for mount in mounts.values():
        assert mount[0]["mountPath"] == "/models"
        assert mount[0]["constant"] == "tf-serving-models"


def test_compile_deploy_task_deploys_into_the_runs_own_namespace_by_default(default_ir, tmp_path):
    spec, _ = default_ir
    (condition,) = [t for t in spec["root"]["dag"]["tasks"].values()
                    if t["componentRef"]["name"].startswith("comp-condition")]
    deploy = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"][
        "deploy-serving"]
    # "": the pod's own namespace, where the model-store claim it mounts lives
    assert deploy["inputs"]["parameters"]["namespace"]["runtimeValue"]["constant"] == ""
    other, platform = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, serving_namespace="ampflow", model_store_pvc=None)))
    (condition,) = [t for t in other["root"]["dag"]["tasks"].values()
                    if t["componentRef"]["name"].startswith("comp-condition")]
    deploy = other["components"][condition["componentRef"]["name"]]["dag"]["tasks"][
        "deploy-serving"]
    assert deploy["inputs"]["parameters"]["namespace"]["runtimeValue"]["constant"] == "ampflow"
    assert "pvcMount" not in str(platform)  # another namespace's claim cannot be mounted


def test_compile_deploy_task_takes_the_convert_output_and_the_serving_format(default_ir):
    spec, _ = default_ir
    (condition,) = [t for t in spec["root"]["dag"]["tasks"].values()
                    if t["componentRef"]["name"].startswith("comp-condition")]
    deploy = spec["components"][condition["componentRef"]["name"]]["dag"]["tasks"][
        "deploy-serving"]
    tflite = deploy["inputs"]["artifacts"]["tflite"]["componentInputArtifact"]
    assert tflite == "pipelinechannel--convert-tflite-tflite"  # what --serving-format tflite reads
    parameters = deploy["inputs"]["parameters"]
    for name in ("serving_format", "tflite_variant"):
        assert parameters[name]["componentInputParameter"] == f"pipelinechannel--{name}"
    defaults = spec["root"]["inputDefinitions"]["parameters"]
    assert defaults["serving_format"]["defaultValue"] == "saved_model"  # unchanged behaviour
    # serving_compute_precision=bfloat16: deploy's parity gate runs on prepare-data's test split
    assert (parameters["compute_precision"]["componentInputParameter"]
            == "pipelinechannel--serving_compute_precision")
    assert (deploy["inputs"]["artifacts"]["data"]["componentInputArtifact"]
            == "pipelinechannel--prepare-data-data")
    assert defaults["serving_compute_precision"]["defaultValue"] == "float32"


def test_compile_train_pods_are_kept_from_the_cluster_autoscaler(default_ir, tmp_path):
    # a deleted pod is not retried by KFP's retry strategy (no retry policy: Argo's OnFailure)
    executors = default_ir[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # and k8s/pipeline's PodDisruptionBudget (tests/k8s) selects them: a drain waits for them
    metadata = {"annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
                "labels": {"ampflow.dev/train-pod": "true"}}
    for name in ("exec-train", "exec-train-2"):
        assert executors[name]["podMetadata"] == metadata
    _, platform = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, gpu=False, train_workers=2)))
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in ("exec-train", "exec-train-2"):
        assert executors[name]["podMetadata"] == metadata


def test_compile_passes_the_allreduce_options_to_the_multi_worker_train_task(tmp_path):
    spec, _ = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, gpu=False, train_workers=2, allreduce_dtype="compute",
        allreduce_bytes_per_pack=1 << 20)))
    tasks = spec["root"]["dag"]["tasks"]
    constants = {name: value["runtimeValue"]["constant"]
                 for name, value in tasks["train"]["inputs"]["parameters"].items()
                 if "runtimeValue" in value}
    assert {k: constants[k] for k in ("packed_allreduce", "allreduce_bytes_per_pack",
                                      "allreduce_dtype")} == {
        "packed_allreduce": True, "allreduce_bytes_per_pack": 1 << 20,
        "allreduce_dtype": "compute"}
    # the float32 baseline is one process: no all-reduce to set
    assert "allreduce_dtype" not in tasks["train-2"]["inputs"]["parameters"]


@pytest.mark.parametrize("options, message", [
    ({"allreduce_dtype": "compute"}, "they need train_workers > 1"),
    ({"train_workers": 2, "allreduce_dtype": "half"}, "allreduce_dtype must be one of"),
    ({"train_workers": 2, "packed_allreduce": False, "allreduce_bytes_per_pack": 4096},
     "they need packed_allreduce"),
])
def test_compile_refuses_allreduce_options_that_would_do_nothing_or_fail(options, message):
    with pytest.raises(ConfigError, match=message):
        PipelineOptions(image=IMAGE, gpu=False, **options)


def test_compile_gate_task_stops_the_run_before_export(default_ir):
    spec, _ = default_ir
    tasks = spec["root"]["dag"]["tasks"]
    assert "evaluate-parity" in tasks["parity-gate"]["dependentTasks"]
    assert tasks["parity-gate"]["inputs"]["artifacts"]["verdict"]["taskOutputArtifact"] == {
        "outputArtifactKey": "verdict", "producerTask": "evaluate-parity"}
    assert "parity-gate" in tasks["export-savedmodel"]["dependentTasks"]
    # evaluate publishes the outcome as output parameters too (shown in the KFP UI)
    outputs = spec["components"]["comp-evaluate-parity"]["outputDefinitions"]
    assert outputs["parameters"]["gate_passed"]["parameterType"] == "BOOLEAN"
    assert set(outputs["artifacts"]) == {"metrics", "confusion", "report", "verdict"}


def test_compile_two_train_tasks_amp_and_float32_feed_the_parity_evaluation(default_ir):
    spec, _ = default_ir
    tasks = spec["root"]["dag"]["tasks"]
    assert _task_with_component(tasks, "comp-train") + _task_with_component(
        tasks, "comp-train-2") == ["train", "train-2"]
    assert tasks["train"]["taskInfo"]["name"] == "train-amp"
    assert tasks["train-2"]["taskInfo"]["name"] == "train-float32"
    assert tasks["train"]["inputs"]["parameters"]["precision"] == {
        "componentInputParameter": "precision"}
    params = tasks["train-2"]["inputs"]["parameters"]
    assert params["precision"]["runtimeValue"]["constant"] == "float32"
    # the two run in parallel: neither depends on the other
    assert "train" not in tasks["train-2"].get("dependentTasks", [])
    assert "train-2" not in tasks["train"].get("dependentTasks", [])
    evaluate = tasks["evaluate-parity"]["inputs"]["artifacts"]
    assert evaluate["model"]["taskOutputArtifact"]["producerTask"] == "train"
    assert evaluate["baseline_model"]["taskOutputArtifact"]["producerTask"] == "train-2"
    for name in ("max_baseline_accuracy_drop", "baseline_alpha"):
        assert tasks["evaluate-parity"]["inputs"]["parameters"][name] == {
            "componentInputParameter": name}


def test_compile_without_float32_baseline_has_one_train_task(tmp_path):
    spec, _ = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, with_float32_baseline=False)))
    tasks = spec["root"]["dag"]["tasks"]
    assert "train-2" not in tasks
    assert "baseline_model" not in tasks["evaluate-parity"]["inputs"].get("artifacts", {})


def test_compile_train_checkpoints_on_the_runs_workspace_one_dir_per_task(default_ir):
    spec, platform = default_ir
    tasks = spec["root"]["dag"]["tasks"]
    dirs = {name: tasks[name]["inputs"]["parameters"]["checkpoint_dir"]["runtimeValue"]["constant"]
            for name in ("train", "train-2")}
    assert dirs == {"train": "{{$.workspace_path}}/checkpoints/train-amp",
                    "train-2": "{{$.workspace_path}}/checkpoints/train-float32"}
    # KFP creates the per-run workspace PVC; a stock API server has no default spec and refuses
    # one without access modes (tests/pipeline/test_backend_rules.py), so the IR names them
    assert platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"] == {
        "size": "20Gi", "kubernetes": {"pvcSpecPatch": {"accessModes": ["ReadWriteOnce"]}}}


def test_compile_every_placeholder_is_one_the_kfp_driver_resolves(tmp_path):
    """KFP's driver (backend/src/v2/driver/resolve.go) replaces `{{$.workspace_path}}` inside a
    constant, but the run/task placeholders only when they are the whole value: a path built
    from them would reach the container unresolved."""
    text = Path(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image=IMAGE))).read_text()
    spec = next(yaml.safe_load_all(text))
    assert yaml_documents(text)[0] == spec  # the fast reader every other test and submit use
    whole_value_only = ("{{$.pipeline_job_uuid}}", "{{$.pipeline_task_name}}",
                        "{{$.pipeline_task_uuid}}", "{{$.pipeline_job_name}}",
                        "{{$.pipeline_root}}")
    constants = []

    def walk(node):
        if isinstance(node, dict):
            if "runtimeValue" in node and "constant" in node["runtimeValue"]:
                constants.append(node["runtimeValue"]["constant"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec["root"])
    walk(spec["components"])
    placeholders = [c for c in constants if isinstance(c, str) and "{{$." in c]
    assert placeholders  # the checkpoint dirs at least
    for constant in placeholders:
        for placeholder in whole_value_only:
            assert placeholder not in constant or constant == placeholder, constant


def test_compile_checkpoints_none_keeps_them_in_the_output_artifact(tmp_path):
    spec, platform = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, checkpoints="none")))
    params = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
    assert params["checkpoint_dir"]["runtimeValue"]["constant"] == ""
    assert "pipelineConfig" not in platform.get("platforms", {}).get("kubernetes", {})


def test_compile_workspace_pvc_patch_from_options(tmp_path):
    _, platform = _load(compile_pipeline(tmp_path / "p.yaml", PipelineOptions(
        image=IMAGE, workspace_size="50Gi", workspace_storage_class="nfs",
        workspace_access_mode="ReadWriteMany")))
    assert platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"] == {
        "size": "50Gi", "kubernetes": {"pvcSpecPatch": {
            "storageClassName": "nfs", "accessModes": ["ReadWriteMany"]}}}


@pytest.mark.parametrize("kwargs, message", [
    ({"checkpoints": "s3"}, "checkpoints must be one of"),
    ({"workspace_size": "lots"}, "workspace_size must be a Kubernetes quantity"),
    ({"workspace_access_mode": "ReadMany"}, "workspace_access_mode must be one of"),
    ({"workspace_access_mode": None}, "a KFP backend refuses a workspace without one"),
    ({"workspace_storage_class": ""}, "workspace_storage_class must be a class name"),
    ({"serving_namespace": "ampflow", "model_store_pvc": "mine"}, "a PVC belongs to one namespace"),
    ({"gpu_node_selector": "gke-accelerator"}, "gpu_node_selector must be KEY=VALUE"),
    ({"gpu_toleration": "nvidia.com/gpu:NoSchedul"}, "did you mean NoSchedule"),
    ({"train_cpu": "four"}, "train_cpu must be REQUEST or REQUEST:LIMIT"),
    ({"accelerator_count": 0}, "accelerator_count must be >= 1"),
])
def test_pipeline_options_bad_checkpoint_settings_rejected(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PipelineOptions(image=IMAGE, **kwargs)


def test_compile_saved_model_and_tflite_outputs_are_typed_models(default_ir):
    spec, _ = default_ir
    components = spec["components"]

    def schema(component, side, name):
        return components[component][side]["artifacts"][name]["artifactType"]["schemaTitle"]

    assert schema("comp-export-savedmodel", "outputDefinitions", "saved_model") == "system.Model"
    assert schema("comp-convert-tflite", "inputDefinitions", "saved_model") == "system.Model"
    assert schema("comp-convert-tflite", "outputDefinitions", "tflite") == "system.Model"
    assert schema("comp-deploy-serving", "inputDefinitions", "saved_model") == "system.Model"


def test_compile_cpu_cluster_switches_gpu_off(tmp_path):
    spec, platform = _load(compile_pipeline(tmp_path / "p.yaml",
                                            PipelineOptions(image=IMAGE, gpu=False)))
    train_exec = spec["deploymentSpec"]["executors"]["exec-train"]["container"]
    assert "accelerator" not in train_exec["resources"]
    train_platform = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-train"]
    assert set(train_platform) == {"podMetadata"}  # no GPU node selector or toleration


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
            submit(SubmitConfig(host=host, image=IMAGE, connect_timeout_s=30))
    finally:
        server.shutdown()


def test_submit_misspelt_param_is_refused_before_anything_is_sent():
    port = _free_port()  # nothing listens: a refusal here comes before any connection
    with pytest.raises(ConfigError, match=r"--param epoch is not a pipeline parameter; did you "
                                          r"mean epochs\?"):
        submit(SubmitConfig(host=f"http://127.0.0.1:{port}", image=IMAGE, connect_timeout_s=2),
               {"epoch": 3, "epochs": 3})


def test_submit_config_rejects_a_host_that_is_not_a_url():
    with pytest.raises(ConfigError, match="host must be an http"):
        SubmitConfig(host="localhost:8080")


def test_compiled_parameters_are_the_documented_table(default_ir):
    # `submit --help` and the --param checks read PIPELINE_PARAMETERS without compiling: the
    # compiled pipeline must take exactly those names, types and defaults.
    from ampflow.pipeline.parameters import PIPELINE_PARAMETERS

    kfp_types = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", bool: "BOOLEAN"}
    compiled = default_ir[0]["root"]["inputDefinitions"]["parameters"]
    assert set(compiled) == set(PIPELINE_PARAMETERS)
    for name, (kind, default, _help) in PIPELINE_PARAMETERS.items():
        assert compiled[name]["parameterType"] == kfp_types[kind], name
        assert compiled[name].get("defaultValue", "") == default, name


def test_compiled_architecture_and_served_name_reach_train_and_export(default_ir):
    tasks = default_ir[0]["root"]["dag"]["tasks"]
    channel = {"componentInputParameter": "model"}
    assert tasks["train"]["inputs"]["parameters"]["architecture"] == channel
    assert tasks["train-2"]["inputs"]["parameters"]["architecture"] == channel
    assert tasks["export-savedmodel"]["inputs"]["parameters"]["model_name"] == {
        "componentInputParameter": "model_name"}


def test_compiled_text_parameters_reach_prepare_data_and_both_train_tasks(default_ir):
    # the whole pipeline on text: the data parameters go to prepare-data, the tokenizer's to
    # the AMP and the float32 train tasks alike (the two must tokenize the same way)
    from ampflow.pipeline.pipeline import TEXT_DATA_PARAMETERS, TEXT_TRAIN_PARAMETERS

    tasks = default_ir[0]["root"]["dag"]["tasks"]
    for task, names in (("prepare-data", TEXT_DATA_PARAMETERS),
                        ("train", TEXT_TRAIN_PARAMETERS), ("train-2", TEXT_TRAIN_PARAMETERS)):
        given = tasks[task]["inputs"]["parameters"]
        for name in names:
            assert given[name] == {"componentInputParameter": name}, (task, name)


def test_local_run_config_refuses_an_architecture_as_the_served_name(tmp_path):
    from ampflow.modeling.models import image_model_names
    from ampflow.pipeline.demo import DemoConfig as LocalRunConfig
    from ampflow.pipeline.parameters import check_arguments  # run-local's, + demo's own

    # an image model (the default data is images), not built here
    other = next(name for name in image_model_names() if name != "small_cnn")
    with pytest.raises(ConfigError, match=r"model_name is the served model name.*"
                                          rf"did you mean model='{other}'"):
        LocalRunConfig(workdir=tmp_path, model_name=other)
    with pytest.raises(ConfigError, match=r"model must be a built-in name"):
        LocalRunConfig(workdir=tmp_path, model="ampflow")
    config = LocalRunConfig(workdir=tmp_path, model=other, model_name=other)
    assert config.arguments()["model"] == config.arguments()["model_name"] == other
    check_arguments(config.arguments())  # run-local passes exactly the pipeline's parameters


@pytest.mark.parametrize("params, message", [
    ({"tflite_variants": "float32,float16"}, r"tflite_variant must be one of the variants the "
                                             r"run converts \(tflite_variants=float32,float16\)"),
    ({"serving_target": "kubernetes"}, "tensorflow_model_server"),
])
def test_tflite_serving_parameters_refused_before_anything_runs(tmp_path, params, message):
    from ampflow.pipeline.demo import DemoConfig  # a LocalRunConfig
    from ampflow.pipeline.parameters import check_arguments

    arguments = {"serving_format": "tflite", "tflite_variant": "full_int8", **params}
    with pytest.raises(ConfigError, match=message):
        check_arguments(arguments)
    check_arguments({**arguments, "serving_format": "saved_model"})  # the default: no check
    if "tflite_variants" in params:  # run-local (and the demo) deploy to a local store
        with pytest.raises(ConfigError, match=message):
            DemoConfig(workdir=tmp_path, serving_format="tflite", **params)


def test_compile_never_walks_the_stack_and_a_setter_on_an_importer_still_names_itself(
        tmp_path, monkeypatch):
    """kfp's setters called inspect.stack() to name themselves in an error: a scan of all of
    sys.modules per frame without a module, seconds per compile under pytest-xdist with TF
    imported. The build must not walk the stack; the check and its message stay."""
    import inspect

    from kfp import dsl

    def walk(*args, **kwargs):
        raise AssertionError("inspect.stack() called while building the pipeline")

    monkeypatch.setattr(inspect, "stack", walk)
    compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image="registry.example/a:1"))

    def uses_an_importer():
        dsl.importer(artifact_uri="gs://b/m", artifact_class=dsl.Model).set_cpu_limit("1")

    with pytest.raises(ValueError, match="^set_cpu_limit can only be used on single-step "
                                         "components"):
        dsl.pipeline(name="importer-setter")(uses_an_importer)  # builds the graph at once
