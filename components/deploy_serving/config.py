"""What the deploy step takes and gives back: its config and its result.

Shared by `step.py` (the local target and the dispatch) and `kubernetes_target.py`, which
both import from here and never from each other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampflow.artifacts.canary_examples import CanaryExamples
from ampflow.artifacts.tflite_variants import VARIANTS
from ampflow.components.deploy_serving import model_store
from ampflow.errors import ConfigError
from ampflow.serving.compute_precision import COMPUTE_PRECISIONS
from ampflow.serving.model_format import check_model_name, parse_version_name

TARGETS = ("local", "kubernetes", "kserve")
# What the version dir holds: the exported SavedModel, or one TFLite variant the convert step
# produced and checked (tflite_variant.py); the plain kubernetes target serves only the first
SERVING_FORMATS = ("saved_model", "tflite")
TFLITE_VARIANTS = VARIANTS
# Where the pipeline's deploy task mounts the model-store claim, and so the default model store
# of a pipeline run (pipeline.py, parameters.py, preflight.py; component.py's default repeats it
# because a KFP component's source runs alone in its pod: tests/pipeline/test_model_store_mount.py)
MODEL_STORE_MOUNT = "/models"
OVERLAYS = ("cpu", "gpu")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# KServe's InferenceService name rule (IsvcNameFmt, pkg/apis/serving/v1beta1 at v0.19.0); its
# Knative service "<name>-predictor" must stay a 63-character DNS label
_ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ISVC_NAME_MAX = 63 - len("-predictor")
# Node Feature Discovery's labels for the CPUs that compute bfloat16 natively (AVX512_BF16, AMX
# with bfloat16 tiles): its cpuid source publishes `cpu-cpuid.<flag>=true`, flags named as
# github.com/klauspost/cpuid names them (NFD docs, "Feature labels": X86 CPUID flags). Neither
# flag is in NFD's default blacklist.
BF16_NODE_LABELS = ("feature.node.kubernetes.io/cpu-cpuid.AVX512BF16=true",
                    "feature.node.kubernetes.io/cpu-cpuid.AMXBF16=true")
_NODE_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_NODE_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def check_tflite_target(target: str) -> None:
    """ConfigError for a target whose servers cannot load a TFLite version (kubernetes)."""
    if target == "kubernetes":
        raise ConfigError(
            "serving_format='tflite' needs target 'local' or 'kserve' (both run ampflow "
            "serve). Received: target='kubernetes', whose tensorflow/serving Deployment "
            "runs tensorflow_model_server, which does not load a version dir holding only "
            "a .tflite file")


def check_compute_precision_target(compute_precision: str, target: str,
                                   serving_format: str) -> None:
    """ConfigError unless `target` runs ampflow serve on the SavedModel (bfloat16 only)."""
    if compute_precision == "float32":
        return
    if serving_format != "saved_model":
        raise ConfigError("compute_precision='bfloat16' rewrites a SavedModel's graph; a "
                          "TFLite variant computes in the precision it was converted to. "
                          f"Received: serving_format={serving_format!r}")
    if target not in ("local", "kserve"):
        raise ConfigError(
            "compute_precision='bfloat16' needs target 'local' or 'kserve' (both run ampflow "
            "serve --compute-precision bfloat16; tensorflow_model_server has no such option). "
            f"Received: target={target!r}")


@dataclass(frozen=True)
class DeployConfig:
    """What to deploy, and where; validated before anything is copied or applied."""

    saved_model_dir: Path = field(
        metadata={"help": "the exported version dir <export_base>/<model_name>/<version>"}
    )
    target: str = field(
        default="local", metadata={"help": "where to deploy", "choices": list(TARGETS)}
    )
    model_store: str | None = field(
        default=None,
        metadata={
            "help": "where model servers read models: a local dir (local target, or the PVC "
            "mounted where this step runs) or gs://... (kubernetes target); the version lands "
            "in <model_store>/<model_name>/<version>"
        },
    )
    model_name: str | None = field(
        default=None,
        metadata={"help": "served model name; unset: the name of saved_model_dir's parent"},
    )
    version: int | None = field(
        default=None,
        metadata={
            "help": "version number, claimed as given; unset: in a directory store the next "
            "free number (at least saved_model_dir's name) claimed under the store's lock, or "
            "the newest version if it holds this model already; in gs:// saved_model_dir's name"
        },
    )
    server_address: str | None = field(
        default=None,
        metadata={
            "help": "gRPC host:port of the server that must answer for the version (local "
            "target: optional, unset = no check; kubernetes: the promoted Service, unset = "
            "<prefix>tf-serving.<namespace>.svc:8500; kserve: optional, a predictor pod's gRPC "
            "port 9000, e.g. through kubectl port-forward)"
        },
    )
    canary_timeout_s: float = field(
        default=60.0, metadata={"help": "seconds to wait for the new version to be AVAILABLE"}
    )
    canary_atol: float = field(
        default=1e-3,
        metadata={
            "help": "max |probability - recorded| allowed in the answers to the recorded "
            "examples (the class of an example whose top two recorded probabilities are closer "
            "than 2*atol may differ)"
        },
    )
    # --- what is published ---
    serving_format: str = field(
        default="saved_model",
        metadata={
            "help": "what the version serves: the exported SavedModel, or the TFLite variant "
            "--tflite-variant from the convert step's --tflite-dir (targets local and kserve)",
            "choices": list(SERVING_FORMATS),
        },
    )
    tflite_dir: Path | None = field(
        default=None,
        metadata={
            "help": "serving_format tflite: the convert step's output dir (<variant>.tflite, "
            "<variant>.json, report.json)"
        },
    )
    tflite_variant: str = field(
        default="full_int8",
        metadata={
            "help": "serving_format tflite: the variant to publish; it must be in the convert "
            "report and have passed its gate",
            "choices": list(TFLITE_VARIANTS),
        },
    )
    # --- what the server computes in (bf16_parity.py) ---
    compute_precision: str = field(
        default="float32",
        metadata={
            "help": "what the server computes the version in: bfloat16 (ampflow serve "
            "--compute-precision bfloat16, local and kserve targets, on a CPU with "
            "AVX512_BF16/AMX-BF16) "
            "publishes only after its parity gate against float32 on data_dir's test split",
            "choices": list(COMPUTE_PRECISIONS),
        },
    )
    data_dir: Path | None = field(
        default=None,
        metadata={"help": "compute_precision bfloat16: the prepared dataset whose test split "
                          "the parity gate runs on"},
    )
    bfloat16_test_limit: int | None = field(
        default=None, metadata={"help": "bfloat16 gate: the first N test examples only "
                                        "(default: the whole test split)"}
    )
    bfloat16_min_agreement: float = field(
        default=0.995, metadata={"help": "bfloat16 gate: argmax agreement with float32 "
                                         "(fraction; the float16 TFLite variant's)"}
    )
    bfloat16_max_accuracy_drop: float = field(
        default=0.5, metadata={"help": "bfloat16 gate: top-1 accuracy drop vs float32 "
                                       "(percentage points; the float16 TFLite variant's)"}
    )
    bfloat16_max_prob_diff: float = field(
        default=0.02, metadata={"help": "bfloat16 gate: max |probability difference| vs "
                                        "float32 (float16's 0.01, doubled: bfloat16 rounds "
                                        "8x coarser)"}
    )
    # --- kubernetes target ---
    namespace: str = field(default="ampflow", metadata={"help": "Kubernetes namespace"})
    name_prefix: str = field(
        default="", metadata={"help": "prefix of every object name (kustomize namePrefix)"}
    )
    overlay: str = field(
        default="cpu", metadata={"help": "k8s overlay to render", "choices": list(OVERLAYS)}
    )
    manifests_dir: Path | None = field(
        default=None, metadata={"help": "the k8s/ kustomize dir; unset: the one in this repo"}
    )
    image: str | None = field(
        default=None, metadata={"help": "override the serving image, e.g. a mirror:tag"}
    )
    server_model_base: str | None = field(
        default=None,
        metadata={
            "help": "the model store as the servers see it; unset: /models (the PVC mount) "
            "for a volume, the URI itself for gs://"
        },
    )
    canary_replicas: int = field(
        default=1,
        metadata={
            "help": "replicas of the canary Deployment; behind the same Service it gets about "
            "canary/(canary + stable) of the traffic while it is checked"
        },
    )
    canary_address: str | None = field(
        default=None,
        metadata={
            "help": "gRPC host:port that reaches only the canary pods; unset = "
            "<prefix>tf-serving-canary.<namespace>.svc:8500"
        },
    )
    canary_soak_s: float = field(
        default=0.0,
        metadata={
            "help": "keep the canary serving its share this long, re-checking its answers "
            "every 10 s, before promoting it"
        },
    )
    kubeconfig: Path | None = field(
        default=None,
        metadata={
            "help": "kubeconfig file; unset: $KUBECONFIG, ~/.kube/config, "
            "else the in-cluster service account"
        },
    )
    context: str | None = field(default=None, metadata={"help": "kubeconfig context"})
    connect_timeout_s: float = field(
        default=3.0, metadata={"help": "seconds to wait for the API server to answer"}
    )
    rollout_timeout_s: float = field(
        default=600.0, metadata={"help": "seconds to wait for the rollout to complete"}
    )
    # --- kserve target ---
    canary_traffic_percent: int = field(
        default=10,
        metadata={
            "help": "kserve target: percent of the InferenceService's traffic the new revision "
            "gets while the previous ready revision keeps the rest (100: promote at once; a "
            "first deploy gets all of it)"
        },
    )
    bfloat16_node_labels: str | None = field(
        default=",".join(BF16_NODE_LABELS),
        metadata={
            "metavar": "K=V[,K=V]",
            "help": "kserve target with compute_precision bfloat16: the predictor's pods run "
            "only on nodes with at least one of these labels (a required node affinity), "
            "where the parity gate's measurements hold and bfloat16 is fast. The default is "
            "Node Feature Discovery's labels for AVX512_BF16 and AMX-BF16 CPUs; none: any node"
        },
    )
    model_store_claim: str = field(
        default="tf-serving-models",
        metadata={
            "help": "kserve target with a directory model store: the PVC that holds it (mounted "
            "at model_store here); the InferenceService reads pvc://<claim>/<model_name>"
        },
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "saved_model_dir", Path(self.saved_model_dir))
        if self.target not in TARGETS:
            raise ConfigError(f"target must be one of {TARGETS}. Received: target={self.target!r}")
        if self.overlay not in OVERLAYS:
            raise ConfigError(
                f"overlay must be one of {OVERLAYS}. Received: overlay={self.overlay!r}"
            )
        if self.target == "local":
            self._check_local_store()
        elif not self.model_store:
            raise ConfigError(
                f"model_store is required for target={self.target!r} (a dir on the PVC mounted "
                "here, or gs://bucket/path). Received: model_store=None"
            )
        if self.model_name is not None:
            check_model_name(self.model_name)
        else:  # the served name comes from the export layout, and must follow the same rule
            check_model_name(self.resolved_model_name, "saved_model_dir's parent dir name")
        if self.version is not None and self.version <= 0:
            raise ConfigError(f"version must be > 0. Received: version={self.version}")
        if not _DNS_LABEL.match(self.namespace) or len(self.namespace) > 63:
            raise ConfigError(
                "namespace must be a DNS label (lower-case letters, digits, '-'). "
                f"Received: namespace={self.namespace!r}"
            )
        if self.name_prefix and not _DNS_LABEL.match(self.name_prefix.rstrip("-")):
            raise ConfigError(
                "name_prefix must be lower-case letters, digits and '-'. "
                f"Received: name_prefix={self.name_prefix!r}"
            )
        for name in ("canary_timeout_s", "connect_timeout_s", "rollout_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0. Received: {name}={getattr(self, name)}")
        if not self.canary_atol >= 0:
            raise ConfigError(f"canary_atol must be >= 0. Received: canary_atol={self.canary_atol}")
        if not self.canary_soak_s >= 0:
            raise ConfigError(
                f"canary_soak_s must be >= 0. Received: canary_soak_s={self.canary_soak_s}"
            )
        if self.canary_replicas < 1:
            raise ConfigError(
                f"canary_replicas must be >= 1. Received: canary_replicas={self.canary_replicas}"
            )
        model_store.refuse_unsupported_uri(self.model_store)
        if (self.bfloat16_node_labels or "none").lower() == "none":  # a flag's word for None
            object.__setattr__(self, "bfloat16_node_labels", None)
        self.bfloat16_node_selector  # noqa: B018  (parses its text, or raises ConfigError)
        self._check_serving_format()
        self._check_compute_precision()
        if self.target == "kserve":
            self._check_kserve()

    def _check_serving_format(self) -> None:
        """A TFLite version needs the convert output, a known variant, a server that loads it."""
        if self.serving_format not in SERVING_FORMATS:
            raise ConfigError(f"serving_format must be one of {SERVING_FORMATS}. Received: "
                              f"serving_format={self.serving_format!r}")
        if self.tflite_variant not in TFLITE_VARIANTS:
            raise ConfigError(f"tflite_variant must be one of {TFLITE_VARIANTS}. Received: "
                              f"tflite_variant={self.tflite_variant!r}")
        if self.serving_format != "tflite":
            return
        if self.tflite_dir is None:
            raise ConfigError("serving_format='tflite' needs tflite_dir, the convert step's "
                              "output dir. Received: tflite_dir=None")
        object.__setattr__(self, "tflite_dir", Path(self.tflite_dir))
        check_tflite_target(self.target)
        if model_store.is_uri(str(self.model_store)):
            raise ConfigError(
                "serving_format='tflite' publishes into a directory (a temp dir, then one "
                "rename); a bucket has no rename, and a server polling it could see the dir "
                f"before its .tflite file. Received: model_store={self.model_store!r}")

    def _check_compute_precision(self) -> None:
        """bfloat16: a SavedModel, on the local target (ampflow serve), with data to check on."""
        if self.compute_precision not in COMPUTE_PRECISIONS:
            raise ConfigError(f"compute_precision must be one of {COMPUTE_PRECISIONS}. "
                              f"Received: compute_precision={self.compute_precision!r}")
        for name in ("bfloat16_min_agreement", "bfloat16_max_accuracy_drop",
                     "bfloat16_max_prob_diff"):
            value = getattr(self, name)
            if not 0 <= value < float("inf") or (name.endswith("agreement") and value > 1):
                raise ConfigError(f"{name} must be a finite number >= 0 (an agreement <= 1). "
                                  f"Received: {name}={value}")
        if self.bfloat16_test_limit is not None and self.bfloat16_test_limit <= 0:
            raise ConfigError("bfloat16_test_limit must be > 0. Received: "
                              f"bfloat16_test_limit={self.bfloat16_test_limit}")
        if self.compute_precision == "float32":
            return
        check_compute_precision_target(self.compute_precision, self.target, self.serving_format)
        if self.data_dir is None:
            raise ConfigError("compute_precision='bfloat16' needs data_dir, the prepared "
                              "dataset whose test split its parity gate runs on. Received: "
                              "data_dir=None")
        object.__setattr__(self, "data_dir", Path(self.data_dir))

    def _check_kserve(self) -> None:
        """The InferenceService name and the canary share KServe's webhook would refuse."""
        if not 0 <= self.canary_traffic_percent <= 100:
            raise ConfigError("canary_traffic_percent must be in 0..100. Received: "
                              f"canary_traffic_percent={self.canary_traffic_percent}")
        name = self.inference_service_name
        if not _ISVC_NAME.match(name) or len(name) > _ISVC_NAME_MAX:
            raise ConfigError(
                "for target='kserve' the InferenceService is named <name_prefix><model_name>, "
                "which must start with a lower-case letter, hold only lower-case letters, digits "
                f"and '-', and be at most {_ISVC_NAME_MAX} characters (KServe's rule); pass "
                f"--model-name. Received: {name!r}"
            )
        if not _DNS_LABEL.match(self.model_store_claim):
            raise ConfigError("model_store_claim must be a PVC name (lower-case letters, digits, "
                              f"'-'). Received: model_store_claim={self.model_store_claim!r}")

    @property
    def bfloat16_node_selector(self) -> tuple[tuple[str, str], ...]:
        """`bfloat16_node_labels` as (label, value) pairs, any one of which a node must have."""
        if self.bfloat16_node_labels is None:
            return ()
        labels = []
        for text in self.bfloat16_node_labels.split(","):
            key, sep, value = text.strip().partition("=")
            if not sep or not _NODE_LABEL_KEY.fullmatch(key) or not (
                    _NODE_LABEL_VALUE.fullmatch(value)) or len(value) > 63:
                raise ConfigError(
                    "bfloat16_node_labels must be KEY=VALUE node labels, comma-separated (e.g. "
                    f"{BF16_NODE_LABELS[0]}), or none. "
                    f"Received: bfloat16_node_labels={self.bfloat16_node_labels!r}")
            labels.append((key, value))
        return tuple(labels)

    @property
    def inference_service_name(self) -> str:
        """The kserve target's InferenceService: `<name_prefix><model_name>`."""
        return f"{self.name_prefix}{self.resolved_model_name}"

    def _check_local_store(self) -> None:
        """The local target writes with a rename, which only a local dir gives."""
        if not self.model_store:
            raise ConfigError(
                "model_store is required for target='local' (the dir holding <model_name>/ "
                "that the server polls). Received: model_store=None"
            )
        if model_store.is_uri(self.model_store):
            raise ConfigError(
                "model_store must be a local directory for target='local'. "
                f"Received: model_store={self.model_store!r}"
            )

    @property
    def resolved_model_name(self) -> str:
        """The served name: given, or the export layout's `<model_name>` dir."""
        return self.model_name or self.saved_model_dir.resolve().parent.name

    @property
    def resolved_version(self) -> int:
        """The version: given, or the export layout's numbered `<version>` dir."""
        if self.version is not None:
            return self.version
        version = parse_version_name(self.saved_model_dir.name)
        if version is None or version <= 0:
            raise ConfigError(
                "saved_model_dir must end in a positive version number "
                "(<export_base>/<model_name>/<version>), or pass version. "
                f"Received: saved_model_dir={str(self.saved_model_dir)!r}"
            )
        return version

    @contextlib.contextmanager
    def claimed(self, source: Path) -> Iterator[DeployConfig]:
        """This config with its version claimed in a directory store, the claim freed at the end.

        Every target calls it once its cluster answered, so `ampflow deploy` and the pipeline
        number and lock alike (model_store.claim_version): an unset `version` is the next free
        number, at least the export's (or the newest version if it holds `source` already); a
        given one is claimed as it is. `push_local` frees the claim once the version is
        published; a deploy failing before frees it here. A gs:// store has no lock.
        """
        if model_store.is_uri(str(self.model_store)):
            yield self
            return
        model_base = Path(str(self.model_store)) / self.resolved_model_name
        version = model_store.claim_version(
            model_base, at_least=self.resolved_version, exactly=self.version, same_as=source)
        try:
            yield dataclasses.replace(self, version=version)
        finally:
            model_store.release_claim(model_base, version)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config, JSON-ready (written next to the deployed version)."""
        out = dataclasses.asdict(self)
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}
        out["model_name"] = self.resolved_model_name
        out["version"] = self.resolved_version
        return out


@dataclass(frozen=True)
class Payload:
    """What a deploy publishes as the version, and the answers its server must give.

    `expected` None: the answers export recorded in `source` (a SavedModel version), read only
    when a server is checked. A TFLite variant brings its own (tflite_variant.py says why).
    """

    source: Path  # the dir copied into <model_store>/<model_name>/<version>/
    model_format: str = "tensorflow"  # KServe's modelFormat name: "tensorflow" or "tflite"
    expected: CanaryExamples | None = None
    tflite_variant: str | None = None  # the TFLite variant published (None: the SavedModel)
    # the signature the canary calls: None = the SavedModel's serving_default; a TFLite
    # variant's own (a text model's takes token ids on `token_ids`)
    spec: model_store.SignatureSpec | None = None
    bf16_parity: dict[str, Any] | None = None  # compute_precision bfloat16: the gate's evidence


@dataclass(frozen=True)
class DeployResult:
    """Where the version went and what is served now."""

    target: str
    model_name: str
    version: int
    model_path: str
    endpoint: str | None
    served_version: int | None
    previous_version: int | None = None
    already_present: bool = False
    canary_address: str | None = None
    canary_share: float | None = None  # approximate share of the Service's traffic it served
    promoted: bool | None = None
    tflite_variant: str | None = None  # set when the version is a TFLite variant
    compute_precision: str | None = None  # set when not float32 (bfloat16: bf16_parity.py)
    bf16_parity: dict[str, Any] | None = None  # that gate's evidence, as in the deploy record

    def summary(self) -> dict[str, Any]:
        """Rows for the CLI's closing summary (the bf16 gate's evidence in one line)."""
        rows = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if self.bf16_parity is not None:
            e = self.bf16_parity
            rows["bf16_parity"] = (
                f"passed on {e['num_examples']} test examples: agreement {e['agreement']:.4f}, "
                f"accuracy drop {e['accuracy_drop_points']:.2f} points, max |p diff| "
                f"{e['max_abs_prob_diff']:.3g} (all of it in the version's ampflow_deploy.json)")
        return rows
