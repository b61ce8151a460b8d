"""`PipelineOptions`: the compile-time settings, where and how the steps run on a cluster.

What depends on the cluster (the image, GPU requests, node selectors, tolerations, resources,
retries, where the checkpoints live, the float32 baseline branch, the all-reduce of a TFJob's
workers) is fixed when the pipeline is compiled; what a user changes per run is a pipeline
parameter (pipeline.py). Each field with a `help` is an `ampflow compile`/`submit` flag
(pipeline/cli.py builds them from here, defaults and all). Checked once, in `__post_init__`,
so a bad value is one `ConfigError` line before anything is compiled or submitted.
"""

import dataclasses
import re
from dataclasses import dataclass, field

from ampflow.cliutil import invalid_choice
from ampflow.components.deploy_serving.config import MODEL_STORE_MOUNT
from ampflow.components.train.clusters.kubeflow_job import (
    GPU_NODE_LABEL,
    GPU_RESOURCE,
    GPU_TOLERATION,
    TRAIN_CPU,
    TRAIN_MEMORY,
)
from ampflow.components.train.config import TrainConfig, check_allreduce_options
from ampflow.errors import ConfigError
from ampflow.pipeline.settings import LOCAL_IMAGE

CHECKPOINT_STORES = ("workspace", "none")
ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MODEL_STORE_PVC = "tf-serving-models"  # k8s/model-store
_TRAIN_FIELDS = TrainConfig.__dataclass_fields__
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
    # A model to fine-tune: a `.keras` file, a model dir holding model.keras, or a pretrained
    # BERT checkpoint dir, at a URI the backend's launcher fetches (gs://, s3://, minio://; a
    # local path under the local runner), brought in with `dsl.importer` as the train tasks'
    # `base_model` input (ampflow.modeling.base_model). A compile-time option: a run-time
    # switch needs `dsl.OneOf` (see the module docstring).
    base_model_uri: str | None = field(default=None, metadata={
        "metavar": "URI",
        "help": "Fine-tune this instead of building `model`: a trained .keras file (or model "
                "dir), or a pretrained BERT checkpoint dir (Hugging Face's layout or a "
                "keras-hub preset), uploaded where the cluster's launcher fetches it (gs://, "
                "s3://, minio://) and brought in with dsl.importer."})

    # An ImageNet weights file for a built-in image backbone (the `..._notop.h5` of Keras
    # applications), brought in the same way, as the train tasks' `weights_file` input: what
    # the `weights` run parameter names must already be where the task runs (image, volume).
    weights_uri: str | None = field(default=None, metadata={
        "metavar": "URI",
        "help": "Load this ImageNet weights file (a Keras applications ..._notop.h5) into "
                "resnet50's or mobilenet_v2's backbone and train the transfer recipe, uploaded "
                "where the cluster's launcher fetches it (gs://, s3://, minio://) and brought "
                "in with dsl.importer; instead of the `weights` parameter, a path in the pod."})

    # Masked-LM pretraining of a BERT encoder on the run's own prepared texts (components/
    # pretrain), fed to the train tasks as their `base_model`, where base_model_uri's importer
    # goes otherwise. One number both switches it and sizes it (its cost is epochs x corpus);
    # the encoder's other settings are the pretrain step's defaults (bert_tiny's sizes), its
    # position table the run's max_sequence_length (what train fine-tunes at) and its seed
    # the run's. Compile time: it adds a task, as the importer does.
    pretrain_epochs: int = field(default=0, metadata={
        "metavar": "N",
        "help": "> 0: pretrain a BERT encoder (masked LM, bert_tiny's sizes, the pretrain "
                "step's defaults) for N epochs on the prepared texts' training split, and "
                "fine-tune it in the train tasks instead of `model`. Text data only; not with "
                "a base model to import. 0: off."})

    def __post_init__(self) -> None:
        self._check_pretraining()
        self._check_weights_uri()
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

    def _check_weights_uri(self) -> None:
        """ImageNet weights go into a built-in backbone, which a base model would replace."""
        if self.weights_uri and (self.base_model_uri or self.pretrain_epochs):
            other = ("base_model_uri" if self.base_model_uri else "pretrain_epochs")
            raise ConfigError(
                f"weights_uri loads ImageNet weights into a built-in image backbone, and "
                f"{other} replaces the model the train tasks build: one or the other. "
                f"Received: weights_uri={self.weights_uri!r}, {other}="
                f"{getattr(self, other)!r}")

    def _check_pretraining(self) -> None:
        """A count of epochs >= 0, and one source of the train tasks' base model."""
        epochs = self.pretrain_epochs
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ConfigError("pretrain_epochs must be an integer >= 0 (0: no pretraining). "
                              f"Received: pretrain_epochs={epochs!r}")
        if epochs and self.base_model_uri:
            raise ConfigError(
                "pretrain_epochs and base_model_uri both give the train tasks their base model "
                "(run-local imports a .keras or checkpoint --model as base_model_uri): pretrain "
                f"or import, not both. Received: pretrain_epochs={epochs}, "
                f"base_model_uri={self.base_model_uri!r}")

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

    def check_base_model_for_cluster(self) -> str | None:
        """`base_model_uri` as a cluster's run takes it (compile, submit); what was checked.

        A local path is refused (the train pod cannot read it), after what it holds is checked.
        """
        if not self.base_model_uri:
            return None
        from ampflow.modeling.base_model import check_base_model_uri

        return check_base_model_uri(self.base_model_uri, cluster=True)

    def check_weights_for_cluster(self) -> str | None:
        """`weights_uri` as a cluster's run takes it (compile, submit); what was checked."""
        if not self.weights_uri:
            return None
        from ampflow.modeling.base_model import check_weights_uri

        return check_weights_uri(self.weights_uri, cluster=True)

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
