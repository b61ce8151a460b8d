"""The ampflow KFP pipeline: data → AMP + float32 training → parity gate → export → TFLite → deploy.

This file only wires tasks; every step's logic lives in `components/<step>/step.py` and each
component is a thin wrapper over it (`components/<step>/component.py`). What depends on the
cluster (the image, GPU requests, node selectors, tolerations, resources, retries, where the
checkpoints live, the float32 baseline branch) is a compile-time `PipelineOptions`; what a user
changes per run (dataset, model, epochs, precision, thresholds, serving target) is a pipeline
parameter.

How it behaves on a KFP backend, and why it is wired this way:
- `evaluate-parity` always succeeds and publishes its report, metrics and verdict (KFP uploads
  a task's outputs only when it exits 0); `parity-gate`, a small task after it, fails the run
  before export with the failed checks in its message.
- A retried train pod resumes: its checkpoint dir is on the run's KFP workspace (a PVC that KFP
  creates per run and mounts only into the tasks that use it), one dir per train task. Within
  one parameter value KFP's driver substitutes only `{{$.workspace_path}}`; the run-id and task
  placeholders are substituted only when they are the whole value, so they cannot build a path
  (pipeline/backend_rules.py holds these rules, with the backend's file and lines).
- The workspace PVC spec is explicit: a stock API server has no default one, and the backend
  refuses a workspace without `accessModes` (every version) or, on 2.15/2.16, without
  `storageClassName` (`submit` fills in the cluster's default class there, or says so).
- `evaluate-parity` blesses the model on its own (above chance, thresholds, parity). Against
  the model now serving it is compared by `compare-serving`, then `serving-gate` fails
  the run as `parity-gate` does: the first tasks under `serving_target != "none"`. They read
  the highest version under `<serving_model_store>/<model_name>` (where deploy writes: the
  model-store claim, which only this branch's tasks mount), score it on the examples evaluate
  judged, and stop a significantly worse model before deploy (paired test). Export and
  convert write only the run's own artifacts, so nothing reaches a server. A gs:// store is
  read with tf.io.gfile, as TF Serving reads it.
- The deploy task (and the model-store PVC mounts) exist only under `serving_target != "none"`,
  and deploys into the run's own namespace unless `serving_namespace` is set: a PVC belongs to
  one namespace, and a pod that mounts a missing PVC stays Pending forever (`submit` checks the
  claim exists first). Serving in another namespace needs a gs:// model store and no PVC.
- Retries: KFP emits an Argo retry strategy without a retry policy, so a train pod that fails
  is retried (and resumes), but a pod that is deleted (an eviction, a drained node) ends the
  run; train pods are annotated so that the cluster autoscaler does not evict them.
- The float32 baseline is a compile-time option: a run-time switch needs `dsl.OneOf` over the
  two evaluate branches' artifacts, which kfp 2.17.3's local runner cannot run ("Expected 1
  artifact in ArtifactSelectorSpec. Got: 2").
"""


import dataclasses
import re
from dataclasses import dataclass, field

from ampflow.cliutil import TRISTATE, invalid_choice
from ampflow.components.convert_tflite.config import ConvertConfig
from ampflow.components.deploy_serving.config import MODEL_STORE_MOUNT, OVERLAYS, DeployConfig
from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.components.train.config import TrainConfig, check_allreduce_options
from ampflow.components.train.kubeflow_job import (
    GPU_NODE_LABEL,
    GPU_RESOURCE,
    GPU_TOLERATION,
    TRAIN_CPU,
    TRAIN_MEMORY,
)
from ampflow.errors import ConfigError
from ampflow.pipeline.settings import LOCAL_IMAGE, as_component

PIPELINE_NAME = "ampflow"
CHECKPOINT_STORES = ("workspace", "none")
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MODEL_STORE_PVC = "tf-serving-models"  # k8s/model-store
# Where each train task keeps its resumable state on the run's workspace (one dir per task).
AMP_CHECKPOINTS = "checkpoints/train-amp"
FLOAT32_CHECKPOINTS = "checkpoints/train-float32"
# The parity gate's thresholds as pipeline parameters: the evaluate step's own defaults
# (EvaluateConfig, where their reasons are written). A parameter is a float, so the auto bound
# of the relative logit check (None there) is any value < 0 here.
AUTO_RELATIVE_LOGIT_DIFF = -1.0
GATE_DEFAULTS = {name: EvaluateConfig.__dataclass_fields__[name].default for name in (
    "max_accuracy_drop", "min_agreement", "max_baseline_accuracy_drop", "baseline_alpha",
    "chance_alpha", "min_accuracy", "metric_thresholds", "serving_alpha")}
# The training parameters' defaults: the train step's own (TrainConfig), read by the pipeline's
# signature, its parameter table (parameters.py), run-local/demo and tied to the KFP component's
# spelt-out defaults by tests/pipeline/test_train_defaults.py. XLA is `auto|on|off` everywhere
# (TrainConfig's None is auto); `model` is train's --model (the architecture).
XLA_VALUES = tuple(TRISTATE)
# TrainConfig's learning_rate None (the model's own) is 0 here: a KFP parameter has no None.
MODEL_LEARNING_RATE = 0.0
# The data and TFLite parameters' defaults: prepare-data's and convert's own.
DATA_DEFAULTS = {
    "dataset": PrepareDataConfig.__dataclass_fields__["dataset"].default,
    "tflite_variants": ",".join(ConvertConfig.__dataclass_fields__["variants"].default),
}
# The text parameters' defaults: prepare-data's own (PrepareDataConfig: the text source and
# how it is read) and train's (TrainConfig, which takes them from TokenizerConfig). A path or
# name that is None there (not given) is "" here: a KFP parameter has no None.
_DATA_FIELDS = PrepareDataConfig.__dataclass_fields__
TEXT_DATA_PARAMETERS = ("text_folder", "text_file", "text_column", "label_column",
                        "text_feature", "max_text_bytes")
TEXT_TRAIN_PARAMETERS = ("max_sequence_length", "vocabulary_size")
TEXT_DEFAULTS = {
    **{name: "" if _DATA_FIELDS[name].default is None else _DATA_FIELDS[name].default
       for name in TEXT_DATA_PARAMETERS},
    **{name: TrainConfig.__dataclass_fields__[name].default for name in TEXT_TRAIN_PARAMETERS},
}
# The k8s overlay the deploy step renders (a run-time parameter): the deploy step's own default.
SERVING_OVERLAYS = OVERLAYS
DEFAULT_SERVING_OVERLAY = DeployConfig.__dataclass_fields__["overlay"].default
# What the deploy step publishes (the SavedModel, or one TFLite variant): its own defaults.
SERVING_DEFAULTS = {name: DeployConfig.__dataclass_fields__[name].default
                    for name in ("serving_format", "tflite_variant")}
_TRAIN_FIELDS = TrainConfig.__dataclass_fields__
TRAIN_DEFAULTS = {
    **{name: _TRAIN_FIELDS[name].default for name in (
        "model", "epochs", "batch_size", "precision", "seed")},
    "learning_rate": _TRAIN_FIELDS["learning_rate"].default or MODEL_LEARNING_RATE,
    "xla": next(word for word, value in TRISTATE.items()
                if value is _TRAIN_FIELDS["jit_compile"].default),
}

# The train step's all-reduce flags (PipelineOptions with train_workers > 1) and defaults.
_DEFAULT_ALLREDUCE = {name: _TRAIN_FIELDS[name].default for name in (
    "packed_allreduce", "allreduce_bytes_per_pack", "allreduce_dtype")}


@dataclass(frozen=True)
class Resources:
    """CPU/memory requests and limits of one task (Kubernetes quantities)."""

    cpu_request: str = "1"
    memory_request: str = "2G"
    cpu_limit: str = "2"
    memory_limit: str = "8G"


@dataclass(frozen=True)
class PipelineOptions:
    """Compile-time settings: where and how the steps run on a cluster.

    The fields with a `help` are `ampflow compile`/`submit` flags (pipeline/cli.py builds them
    from here, defaults and all); the rest are Python-only.
    """

    image: str = field(default=LOCAL_IMAGE, metadata={
        "help": "Image every step runs in, pinned (name:tag or name@digest): the one you built "
                "from the Dockerfile and pushed. Required unless $AMPFLOW_IMAGE names it."})
    gpu: bool = field(default=True, metadata={
        "help": "Request GPUs for the train tasks (resource, node selector, toleration)."})
    accelerator_type: str = field(default=GPU_RESOURCE, metadata={
        "help": "GPU resource name the train tasks request."})
    accelerator_count: int = field(default=1, metadata={
        "flag": "--train-gpus", "metavar": "N",
        "help": "GPUs per train task (per worker with --train-workers)."})
    # Label set by NVIDIA GPU feature discovery on GPU nodes; GKE sets its own (see the help).
    gpu_node_selector: str | None = field(default="=".join(GPU_NODE_LABEL), metadata={
        "metavar": "K=V",
        "help": "Node label the train tasks' nodes must have, KEY=VALUE, or none. The default "
                "is NVIDIA GPU feature discovery's; on GKE use "
                "cloud.google.com/gke-accelerator=<type> (e.g. nvidia-l4), the label GKE puts "
                "on its GPU nodes."})
    gpu_toleration: str | None = field(default=f"{GPU_TOLERATION['key']}:"
                                               f"{GPU_TOLERATION['effect']}", metadata={
        "metavar": "KEY[=VALUE]:EFFECT",
        "help": "Taint of the GPU nodes the train tasks tolerate, KEY[=VALUE]:EFFECT (EFFECT: "
                "NoSchedule, PreferNoSchedule or NoExecute; without =VALUE any value), or none. "
                "GKE taints its GPU nodes nvidia.com/gpu=present:NoSchedule."})
    train_cpu: str = field(default=":".join(TRAIN_CPU), metadata={
        "metavar": "REQUEST[:LIMIT]",
        "help": "CPU of each train task (per worker with --train-workers), as Kubernetes "
                "quantities: request, or request:limit."})
    train_memory: str = field(default=":".join(TRAIN_MEMORY), metadata={
        "metavar": "REQUEST[:LIMIT]",
        "help": "Memory of each train task, as Kubernetes quantities (16G, 12Gi): request, or "
                "request:limit."})
    train_retries: int = field(default=2, metadata={
        "help": "Times a failed train pod is retried (it resumes from its checkpoint)."})
    # The PVC that k8s/ mounts into TF Serving as its model store; the deploy task (which runs
    # only when serving_target != "none") and the serving gate before it (which reads the
    # model serving) mount it at `model_store_mount`, so that `serving_model_store` (a pipeline
    # parameter) can point there. None: no mount (gs://).
    model_store_pvc: str | None = MODEL_STORE_PVC
    model_store_mount: str = MODEL_STORE_MOUNT
    # The float32-trained baseline: a second train task in parallel with the AMP one, so that
    # the gate also compares AMP-trained with float32-trained accuracy (training parity).
    with_float32_baseline: bool = field(default=True, metadata={
        "help": "Train a float32 baseline in parallel with the AMP model: the gate then also "
                "compares AMP-trained with float32-trained accuracy."})
    # "workspace": train checkpoints on the run's KFP workspace PVC (KFP backend >= 2.15), so
    # a retried train pod resumes; "none": inside the output artifact (not kept on a retry).
    checkpoints: str = field(default="workspace", metadata={
        "choices": CHECKPOINT_STORES,
        "help": "Where a train task keeps its resumable checkpoint: the run's KFP workspace PVC "
                "(a retried pod resumes; KFP backend >= 2.15) or none."})
    workspace_size: str = field(default="20Gi", metadata={
        "help": "Size of the run's workspace PVC (a Kubernetes quantity)."})
    # The workspace PVC spec, always written into the IR (a stock API server has none; see
    # backend_rules.py). None: the cluster's default storage class, which KFP 2.17 accepts and
    # 2.15/2.16 refuse (`submit` then fills in the default class it reads from the cluster).
    # The two train tasks mount the workspace at once: with ReadWriteOnce they run at the same
    # time only on one node (otherwise one waits for the other); ReadWriteMany (a class that
    # offers it) lets them run on different nodes.
    workspace_storage_class: str | None = field(default=None, metadata={
        "help": "Storage class of the workspace PVC (default: the cluster's default class; "
                "KFP 2.15/2.16 refuse the run without one named, which submit then reads from "
                "the cluster)."})
    workspace_access_mode: str = field(default="ReadWriteOnce", metadata={
        "choices": ACCESS_MODES,
        "help": "Access mode of the workspace PVC (a KFP backend refuses the run without one); "
                "ReadWriteMany lets the two train tasks run on different nodes at once."})
    # The namespace the deploy task deploys TF Serving into. None: the run's own namespace,
    # where the model-store PVC must then exist (k8s/model-store). Another namespace: the PVC
    # cannot be mounted from the run's namespace, so the model-store PVC is not mounted and
    # the store must be gs://.
    serving_namespace: str | None = field(default=None, metadata={
        "help": "Namespace the deploy task deploys TF Serving into (default: the run's own, "
                "with the model-store claim there; another namespace mounts no claim and needs "
                "--param serving_model_store=gs://...). The k8s overlay is the run-time "
                "parameter serving_overlay."})
    # > 1: the AMP train task runs a TFJob of this many workers (the local runner: local
    # processes); the float32 baseline stays one process.
    train_workers: int = field(default=1, metadata={
        "help": "> 1: the AMP train task runs a TFJob with this many workers (checkpoints on "
                "the training claim, not the workspace)."})
    # How the AMP train task's workers all-reduce (train_workers > 1): the train step's flags,
    # with its defaults (TrainConfig, measured in docs/how-to/multi-worker.md). The float32
    # baseline is one process and has no all-reduce.
    packed_allreduce: bool = field(default=_TRAIN_FIELDS["packed_allreduce"].default, metadata={
        "help": "With --train-workers > 1: all-reduce gradients and step statistics in one packed "
                "collective per step (train --packed-allreduce)."})
    allreduce_bytes_per_pack: int = field(
        default=_TRAIN_FIELDS["allreduce_bytes_per_pack"].default, metadata={
            "help": "With --train-workers > 1: split the packed all-reduce into packs of about "
                    "this many bytes; 0 = one pack (train --allreduce-bytes-per-pack)."})
    allreduce_dtype: str = field(default=_TRAIN_FIELDS["allreduce_dtype"].default, metadata={
        "choices": _TRAIN_FIELDS["allreduce_dtype"].metadata["choices"],
        "help": "With --train-workers > 1: sum gradients across workers in float32 or in the "
                "policy's compute dtype (half the bytes; train --allreduce-dtype)."})
    cache_data: bool = True
    default_resources: Resources = field(default_factory=Resources)
    gate_resources: Resources = field(
        default_factory=lambda: Resources("100m", "256M", "500m", "1G"))
    # A trained model to fine-tune: a `.keras` file (or a model dir holding model.keras) at a
    # URI the backend's launcher can fetch (gs://, s3://, minio://; a local path under the local
    # runner), brought in with `dsl.importer` as the train tasks' `base_model` input. A
    # compile-time option: a run-time switch needs `dsl.OneOf` (see the module docstring).
    base_model_uri: str | None = field(default=None, metadata={
        "help": "Fine-tune this trained .keras file (or model dir) instead of building `model`: "
                "a URI the cluster's launcher fetches (gs://, s3://, minio://), brought in with "
                "dsl.importer."})

    def __post_init__(self) -> None:
        if not self.image or ":" not in self.image.rsplit("/", 1)[-1] and "@" not in self.image:
            raise ConfigError("image must be a pinned image reference (name:tag or name@digest). "
                              f"Received: image={self.image!r}")
        if self.accelerator_count < 1:
            raise ConfigError("accelerator_count must be >= 1 (--no-gpu for none). "
                              f"Received: accelerator_count={self.accelerator_count}")
        if self.train_workers < 1:
            raise ConfigError(f"train_workers must be >= 1. Received: {self.train_workers}")
        if self.train_retries < 0:
            raise ConfigError(f"train_retries must be >= 0. Received: {self.train_retries}")
        check_allreduce_options(self.packed_allreduce, self.allreduce_bytes_per_pack,
                                self.allreduce_dtype)
        changed = [f"{name}={getattr(self, name)!r}" for name, default in
                   _DEFAULT_ALLREDUCE.items() if getattr(self, name) != default]
        if self.train_workers == 1 and changed:
            raise ConfigError("packed_allreduce, allreduce_bytes_per_pack and allreduce_dtype "
                              "set how train workers all-reduce: they need train_workers > 1. "
                              f"Received: train_workers=1, {', '.join(changed)}")
        if self.checkpoints not in CHECKPOINT_STORES:
            raise ConfigError(invalid_choice("checkpoints", self.checkpoints, CHECKPOINT_STORES))
        if self.workspace_access_mode not in ACCESS_MODES:
            raise ConfigError(invalid_choice("workspace_access_mode", self.workspace_access_mode,
                                             ACCESS_MODES) + " (a KFP backend refuses a "
                              "workspace without one)")
        if self.workspace_storage_class == "":
            raise ConfigError("workspace_storage_class must be a class name, or None for the "
                              "cluster's default. Received: workspace_storage_class=''")
        for name in ("gpu_node_selector", "gpu_toleration"):  # "none" (a flag's word) is None
            if (getattr(self, name) or "none").lower() == "none":
                object.__setattr__(self, name, None)
        self.node_selector  # noqa: B018  (each parses its text, or raises ConfigError)
        self.toleration  # noqa: B018
        self.train_resources  # noqa: B018
        if self.serving_namespace and self.model_store_pvc == MODEL_STORE_PVC:
            # another namespace's claim cannot be mounted from the run's: gs:// there
            object.__setattr__(self, "model_store_pvc", None)
        if self.serving_namespace and self.model_store_pvc:
            raise ConfigError(
                "a PVC belongs to one namespace: the deploy task (in the run's namespace) cannot "
                f"mount {self.model_store_pvc!r} of serving_namespace={self.serving_namespace!r}"
                ". Deploy into the run's namespace (serving_namespace=None), or set "
                "model_store_pvc=None and serving_model_store=gs://...")
        if self.checkpoints == "workspace":
            from kfp import dsl

            try:
                dsl.WorkspaceConfig(size=self.workspace_size)
            except ValueError as e:
                raise ConfigError(f"workspace_size must be a Kubernetes quantity such as 20Gi. "
                                  f"Received: workspace_size={self.workspace_size!r}") from e

    @property
    def node_selector(self) -> tuple[str, str] | None:
        """`gpu_node_selector` as (label, value)."""
        if self.gpu_node_selector is None:
            return None
        key, sep, value = self.gpu_node_selector.partition("=")
        if not sep or not _LABEL.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise ConfigError("gpu_node_selector must be KEY=VALUE, a node label (e.g. "
                              "cloud.google.com/gke-accelerator=nvidia-l4), or none. "
                              f"Received: gpu_node_selector={self.gpu_node_selector!r}")
        return key, value

    @property
    def toleration(self) -> dict[str, str] | None:
        """`gpu_toleration` as the arguments of `kfp.kubernetes.add_toleration`."""
        if self.gpu_toleration is None:
            return None
        taint, _, effect = self.gpu_toleration.rpartition(":")
        key, sep, value = taint.partition("=")
        if effect not in TAINT_EFFECTS or not _LABEL.fullmatch(key) or (
                sep and not _LABEL_VALUE.fullmatch(value)):
            from ampflow.cliutil import did_you_mean

            raise ConfigError(
                f"gpu_toleration must be KEY[=VALUE]:EFFECT with EFFECT one of "
                f"{', '.join(TAINT_EFFECTS)} (e.g. nvidia.com/gpu:NoSchedule), or none. "
                f"Received: gpu_toleration={self.gpu_toleration!r}"
                + (did_you_mean(effect, TAINT_EFFECTS) if effect and ":" in
                   self.gpu_toleration else ""))
        if sep:
            return {"key": key, "operator": "Equal", "value": value, "effect": effect}
        return {"key": key, "operator": "Exists", "effect": effect}

    @property
    def train_resources(self) -> Resources:
        """The train tasks' requests and limits, from `train_cpu` and `train_memory`."""
        cpu = _request_limit("train_cpu", self.train_cpu)
        memory = _request_limit("train_memory", self.train_memory)
        return Resources(cpu[0], memory[0], cpu[1], memory[1])

    def pipeline_config(self):
        """The KFP PipelineConfig: the per-run workspace that holds the train checkpoints."""
        from kfp import dsl

        if self.checkpoints != "workspace":
            return None
        patch = {"accessModes": [self.workspace_access_mode]}
        if self.workspace_storage_class:
            patch["storageClassName"] = self.workspace_storage_class
        return dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(
            size=self.workspace_size, kubernetes=dsl.KubernetesWorkspaceConfig(patch)))

    def checkpoint_dir(self, subdir: str) -> str:
        """A train task's `checkpoint_dir` argument ("" keeps it in the output artifact)."""
        from kfp import dsl

        if self.checkpoints != "workspace":
            return ""
        return f"{dsl.WORKSPACE_PATH_PLACEHOLDER}/{subdir}"


_LABEL = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


def _request_limit(name: str, text: str) -> tuple[str, str]:
    """`"4:8"` -> ("4", "8"); `"4"` -> ("4", "4"): Kubernetes quantities, request <= limit."""
    request, _, limit = text.partition(":")
    limit = limit or request
    if not (_QUANTITY.fullmatch(request) and _QUANTITY.fullmatch(limit)):
        raise ConfigError(f"{name} must be REQUEST or REQUEST:LIMIT, Kubernetes quantities "
                          f"such as 4, 500m, 16G or 12Gi. Received: {name}={text!r}")
    return request, limit


def cli_fields() -> tuple[str, ...]:
    """The PipelineOptions fields that are `compile`/`submit` flags (those with a help)."""
    return tuple(f.name for f in dataclasses.fields(PipelineOptions) if "help" in f.metadata)


def options_from(config: PipelineOptions) -> PipelineOptions:
    """The plain PipelineOptions of a subclass's instance (a SubmitConfig)."""
    return PipelineOptions(**{f.name: getattr(config, f.name)
                              for f in dataclasses.fields(PipelineOptions) if f.init})


def _setters_without_a_stack_walk() -> None:
    """Make kfp's task setters (set_cpu_request, set_env_variable, ...) cheap: same check.

    Each calls `PipelineTask._ensure_container_spec_exists`, which runs `inspect.stack()` only to
    name the setter in its error. `inspect.stack()` looks up the module of every frame on the
    stack, scanning all of `sys.modules` for each frame that has none (`<string>`, `<frozen
    runpy>`); with TensorFlow imported (5,000 modules) under a deep caller, such as pytest-xdist,
    the ~35 setter calls of one build took seconds, nearly all of a compile. The replacement
    makes the same check and raises the same error, naming the setter from its frame alone.
    """
    import sys

    from kfp.dsl import pipeline_task

    def ensure_container_spec_exists(task) -> None:
        if task.container_spec is None:
            setter = sys._getframe(1).f_code.co_name
            raise ValueError(
                f"{setter} can only be used on single-step components, not pipelines used as "
                "components, or special components like importers.")

    pipeline_task.PipelineTask._ensure_container_spec_exists = ensure_container_spec_exists


def build_pipeline(options: PipelineOptions | None = None):
    """Return the `@dsl.pipeline` function for `options` (compile it or run it locally)."""
    from kfp import dsl

    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.deploy_serving.component import deploy_serving
    from ampflow.components.evaluate_parity.component import (
        compare_serving,
        evaluate_parity,
        parity_gate,
        serving_gate,
    )
    from ampflow.components.export_savedmodel.component import export_savedmodel
    from ampflow.components.prepare_data.component import prepare_data
    from ampflow.components.train.component import train
    from ampflow.pipeline.distributed_task import (
        configure_train_workers_task,
        train_workers_arguments,
    )

    _setters_without_a_stack_walk()
    options = options or PipelineOptions()
    ops = {f.__name__: as_component(f, options.image) for f in (
        prepare_data, train, evaluate_parity, parity_gate, export_savedmodel, convert_tflite,
        compare_serving, serving_gate, deploy_serving)}

    @dsl.pipeline(name=PIPELINE_NAME, description=__doc__.splitlines()[0],
                  pipeline_config=options.pipeline_config())
    def ampflow_pipeline(
        dataset: str = DATA_DEFAULTS["dataset"],
        model: str = TRAIN_DEFAULTS["model"],
        epochs: int = TRAIN_DEFAULTS["epochs"],
        batch_size: int = TRAIN_DEFAULTS["batch_size"],
        learning_rate: float = TRAIN_DEFAULTS["learning_rate"],
        precision: str = TRAIN_DEFAULTS["precision"],
        xla: str = TRAIN_DEFAULTS["xla"],
        seed: int = TRAIN_DEFAULTS["seed"],
        autotune: bool = False,
        max_accuracy_drop: float = GATE_DEFAULTS["max_accuracy_drop"],
        min_agreement: float = GATE_DEFAULTS["min_agreement"],
        max_relative_logit_diff: float = AUTO_RELATIVE_LOGIT_DIFF,
        max_baseline_accuracy_drop: float = GATE_DEFAULTS["max_baseline_accuracy_drop"],
        baseline_alpha: float = GATE_DEFAULTS["baseline_alpha"],
        chance_alpha: float = GATE_DEFAULTS["chance_alpha"],
        min_accuracy: float = GATE_DEFAULTS["min_accuracy"],
        metric_thresholds: str = GATE_DEFAULTS["metric_thresholds"],
        serving_alpha: float = GATE_DEFAULTS["serving_alpha"],
        tflite_variants: str = DATA_DEFAULTS["tflite_variants"],
        model_name: str = "ampflow",
        serving_target: str = "none",
        serving_model_store: str = MODEL_STORE_MOUNT,
        serving_address: str = "",
        serving_overlay: str = DEFAULT_SERVING_OVERLAY,
        serving_format: str = SERVING_DEFAULTS["serving_format"],
        tflite_variant: str = SERVING_DEFAULTS["tflite_variant"],
        model_path: str = "",
        image_size: str = "",
        image_folder: str = "",
        text_folder: str = TEXT_DEFAULTS["text_folder"],
        text_file: str = TEXT_DEFAULTS["text_file"],
        text_column: str = TEXT_DEFAULTS["text_column"],
        label_column: str = TEXT_DEFAULTS["label_column"],
        text_feature: str = TEXT_DEFAULTS["text_feature"],
        max_text_bytes: int = TEXT_DEFAULTS["max_text_bytes"],
        max_sequence_length: int = TEXT_DEFAULTS["max_sequence_length"],
        vocabulary_size: int = TEXT_DEFAULTS["vocabulary_size"],
    ):
        data = ops["prepare_data"](dataset=dataset, image_size=image_size,
                                   image_folder=image_folder, text_folder=text_folder,
                                   text_file=text_file, text_column=text_column,
                                   label_column=label_column, text_feature=text_feature,
                                   max_text_bytes=max_text_bytes)
        data.set_caching_options(options.cache_data)
        _resources(data, options.default_resources)

        train_args = dict(data=data.outputs["data"], architecture=model, epochs=epochs,
                          batch_size=batch_size, learning_rate=learning_rate,
                          xla=xla, seed=seed, model_path=model_path,
                          max_sequence_length=max_sequence_length,
                          vocabulary_size=vocabulary_size)
        if options.base_model_uri:
            base = dsl.importer(artifact_uri=options.base_model_uri, artifact_class=dsl.Model,
                                reimport=False)
            base.set_display_name("base-model")
            train_args["base_model"] = base.output
        # A TFJob's workers do not mount the run's workspace: with train_workers > 1 the
        # checkpoints live on the training claim (kubeflow_job.py), so none is passed here.
        amp_checkpoints = "" if options.train_workers > 1 else options.checkpoint_dir(
            AMP_CHECKPOINTS)
        trained = ops["train"](precision=precision, autotune=autotune,
                               checkpoint_dir=amp_checkpoints, **train_args,
                               **train_workers_arguments(options))
        trained.set_display_name("train-amp")
        if options.train_workers > 1:
            configure_train_workers_task(trained, options)
        else:
            _train_task(trained, options)

        baseline_args = {}
        if options.with_float32_baseline:
            # one process at the AMP task's global batch: the two differ only in precision
            baseline = ops["train"](precision="float32",
                                    checkpoint_dir=options.checkpoint_dir(FLOAT32_CHECKPOINTS),
                                    batch_size_multiplier=options.train_workers, **train_args)
            baseline.set_display_name("train-float32")
            _train_task(baseline, options)
            baseline_args["baseline_model"] = baseline.outputs["model"]

        parity = ops["evaluate_parity"](
            data=data.outputs["data"], model=trained.outputs["model"],
            **baseline_args, max_accuracy_drop=max_accuracy_drop,
            min_agreement=min_agreement, max_relative_logit_diff=max_relative_logit_diff,
            max_baseline_accuracy_drop=max_baseline_accuracy_drop,
            baseline_alpha=baseline_alpha, chance_alpha=chance_alpha, min_accuracy=min_accuracy,
            metric_thresholds=metric_thresholds)
        _resources(parity, options.default_resources)

        gate = ops["parity_gate"](verdict=parity.outputs["verdict"])
        _resources(gate, options.gate_resources)

        exported = ops["export_savedmodel"](
            model=trained.outputs["model"], verdict=parity.outputs["verdict"],
            data=data.outputs["data"], model_name=model_name).after(gate)
        _resources(exported, options.default_resources)

        converted = ops["convert_tflite"](
            saved_model=exported.outputs["saved_model"], data=data.outputs["data"],
            variants=tflite_variants)
        _resources(converted, options.default_resources)

        with dsl.If(serving_target != "none", name="serving-target-set"):
            claim = {"model_store_claim": options.model_store_pvc} if options.model_store_pvc \
                else {}  # the claim a kserve InferenceService reads (pvc://<claim>/...)
            # the model now serving is read where deploy writes: on the model-store claim,
            # which only the tasks of this branch mount (the default run needs no claim)
            compared = ops["compare_serving"](
                data=data.outputs["data"], verdict=parity.outputs["verdict"],
                serving_model_store=serving_model_store, model_name=model_name,
                serving_alpha=serving_alpha)
            _resources(compared, options.default_resources)
            compared.set_caching_options(False)  # what is serving changes between runs
            _mount_model_store(compared, options)
            release = ops["serving_gate"](comparison=compared.outputs["comparison"])
            _resources(release, options.gate_resources)
            deployed = ops["deploy_serving"](
                saved_model=exported.outputs["saved_model"], target=serving_target,
                model_store=serving_model_store, server_address=serving_address,
                namespace=options.serving_namespace or "", overlay=serving_overlay,
                tflite=converted.outputs["tflite"], serving_format=serving_format,
                tflite_variant=tflite_variant, **claim).after(release)
            _resources(deployed, options.default_resources)
            deployed.set_caching_options(False)  # a deployment is a side effect, never cached
            _serving_client(deployed)
            _mount_model_store(deployed, options)

    return ampflow_pipeline


def step_names(pipeline) -> dict[str, str]:
    """`{task name: step name}` of a built pipeline: the name KFP shows for each task.

    A task's name is its component's (`train`, `train-2`); where the pipeline gives it a
    display name (`train-amp`, `train-float32`), KFP's UI shows that, and so do the local run's
    lines and log files, so that a step has one name wherever it is read.
    """
    spec = pipeline.pipeline_spec
    names: dict[str, str] = {}
    dags = [spec.root.dag, *(c.dag for c in spec.components.values() if c.HasField("dag"))]
    for dag in dags:
        for name, task in dag.tasks.items():
            if not name.startswith("condition-"):
                names[name] = task.task_info.name or name
    return names


def _train_task(task, options: PipelineOptions) -> None:
    """GPU request, node placement and retries for a training task."""
    _resources(task, options.train_resources)
    task.set_retry(num_retries=options.train_retries, backoff_duration="30s",
                   backoff_factor=2.0)
    from kfp import kubernetes

    from ampflow.pipeline.distributed_task import keep_from_autoscaler

    keep_from_autoscaler(task)
    if not options.gpu:
        return

    task.set_accelerator_type(options.accelerator_type)
    task.set_accelerator_limit(options.accelerator_count)
    if options.node_selector:
        kubernetes.add_node_selector(task, *options.node_selector)
    if options.toleration:
        kubernetes.add_toleration(task, **options.toleration)


def _mount_model_store(task, options: PipelineOptions) -> None:
    """Mount the model-store claim (if any) where `serving_model_store` points by default."""
    if options.model_store_pvc:
        from kfp import kubernetes

        kubernetes.mount_pvc(task, pvc_name=options.model_store_pvc,
                             mount_path=options.model_store_mount)


def _serving_client(task) -> None:
    """Label the deploy pod so k8s/'s NetworkPolicy lets its canary requests reach TF Serving."""
    from kfp import kubernetes

    kubernetes.add_pod_label(task, "ampflow.dev/serving-client", "true")


def _resources(task, resources: Resources) -> None:
    task.set_cpu_request(resources.cpu_request).set_cpu_limit(resources.cpu_limit)
    task.set_memory_request(resources.memory_request).set_memory_limit(resources.memory_limit)


def compile_pipeline(path, options: PipelineOptions | None = None) -> str:
    """Compile the pipeline to KFP IR YAML at `path`; return the path."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(options), package_path=str(path))
    return str(path)
