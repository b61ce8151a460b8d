"""Run the whole pipeline on this machine with the kfp local runner (SubprocessRunner).

Each task runs as a subprocess of this Python (our components are lightweight components over
the installed package, so no image is pulled), artifacts are passed between tasks on disk
under `<workdir>/pipeline_root`, the run's workspace (the train checkpoints) is
`<workdir>/workspace` (the local runner deletes it when the run ends), and a failing task (the
parity gate) stops the run before any task that depends on it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError, PipelineError
from ampflow.files import ensure_writable_dir
from ampflow.pipeline.parameters import check_model_names
from ampflow.pipeline.pipeline import PIPELINE_NAME, PipelineOptions, build_pipeline
from ampflow.serving.model_format import DEFAULT_MODEL_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalRunConfig:
    """Pipeline parameters for a local run, plus where to put it."""

    workdir: Path = field(metadata={"help": "Holds pipeline_root/ and serving/ of the run."})
    dataset: str = field(default="ampflow_digits", metadata={"help": "TFDS dataset name."})
    model: str = field(default="small_cnn", metadata={
        "help": "Architecture to train (as train --model): small_cnn, resnet50 or mobilenet_v2."})
    epochs: int = field(default=8, metadata={"help": "Training epochs."})
    batch_size: int = field(default=32, metadata={"help": "Training batch size."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Learning rate."})
    precision: str = field(default="mixed_float16", metadata={
        "choices": ("auto", "float32", "mixed_float16", "mixed_bfloat16"),
        "help": "Dtype policy. The demo default is mixed_float16 so that dynamic loss scaling "
                "and its telemetry run even on a CPU."})
    jit_compile: str = field(default="auto", metadata={"choices": ("auto", "true", "false"),
                                                       "help": "XLA for the train step."})
    seed: int = field(default=42, metadata={"help": "Seed."})
    autotune: bool = field(default=False, metadata={
        "help": "Time each (policy, XLA) candidate before training and use the fastest."})
    max_accuracy_drop: float = field(default=0.5, metadata={
        "help": "Parity gate: max accuracy drop of the AMP model vs its float32 twin (points)."})
    min_agreement: float = field(default=0.99, metadata={
        "help": "Parity gate: min argmax agreement of the AMP model and its float32 twin."})
    max_relative_logit_diff: float = field(default=-1.0, metadata={
        "help": "Parity gate: max |logit diff| / max |logit|; < 0 means the per-dtype default."})
    max_baseline_accuracy_drop: float = field(default=3.0, metadata={
        "help": "Parity gate: max accuracy drop of the AMP-trained model vs the float32-trained "
                "baseline (points)."})
    baseline_alpha: float = field(default=0.01, metadata={
        "help": "Parity gate: significance level of the one-sided paired (McNemar) test of "
                "AMP-trained vs float32-trained correctness."})
    tflite_variants: str = field(default="float32,float16,dynamic_range,full_int8", metadata={
        "help": "Comma-separated TFLite variants to convert and check."})
    model_name: str = field(default=DEFAULT_MODEL_NAME, metadata={
        "help": "Served model name (as export/serve/predict --model-name)."})
    train_workers: int = field(default=1, metadata={
        "help": "Train on this many local worker processes (MultiWorkerMirroredStrategy over "
                "loopback, the TF_CONFIG contract of a TFJob)."})
    with_float32_baseline: bool = field(default=True, metadata={
        "help": "Also train a float32 baseline (in parallel on a cluster): the gate then "
                "compares AMP-trained with float32-trained accuracy, and the report shows the "
                "AMP training speedup."})

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ConfigError(f"epochs must be > 0. Received: epochs={self.epochs}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0. Received: batch_size={self.batch_size}")
        check_model_names(self.model, self.model_name)

    @property
    def pipeline_root(self) -> Path:
        """Where the local runner writes every task's artifacts."""
        return Path(self.workdir) / "pipeline_root"

    @property
    def workspace(self) -> Path:
        """The run's KFP workspace (train checkpoints); the local runner removes it at the end."""
        return Path(self.workdir) / "workspace"

    @property
    def model_store(self) -> Path:
        """Where the deploy step pushes `<model_name>/<version>/` (a local model store)."""
        return Path(self.workdir) / "serving"

    @property
    def serving_model_name(self) -> str:
        """The served model name (`model_name`; the name demo.py reads)."""
        return self.model_name

    @property
    def serving_base(self) -> Path:
        """The TF Serving model base path of the served model (`<store>/<model_name>`)."""
        return self.model_store / self.model_name

    def arguments(self) -> dict[str, Any]:
        """The pipeline parameters of this run."""
        skip = {"workdir", "with_float32_baseline", "train_workers"}
        names = {f.name for f in fields(LocalRunConfig)} - skip  # not a subclass's extras
        args = {k: v for k, v in asdict(self).items() if k in names}
        args.update(serving_target="local", serving_model_store=str(self.model_store.resolve()))
        return args


@dataclass(frozen=True)
class LocalRunResult:
    """Where each task's artifacts are, and the run's key metrics."""

    run_dir: Path
    artifacts: dict[str, dict[str, Path]]
    serving_base: Path


def run_local(config: LocalRunConfig) -> LocalRunResult:
    """Run the pipeline with `kfp.local.SubprocessRunner`; PipelineError names a failed task."""
    from kfp import local

    ensure_writable_dir(config.workdir, "workdir")
    root = ensure_writable_dir(config.pipeline_root, "pipeline_root")
    config.model_store.mkdir(parents=True, exist_ok=True)
    before = set(root.iterdir())
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               raise_on_error=True, workspace_root=str(config.workspace))
    options = PipelineOptions(gpu=False, with_float32_baseline=config.with_float32_baseline,
                              model_store_pvc=None, train_workers=config.train_workers)
    pipeline = build_pipeline(options)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        pipeline(**config.arguments())
    except RuntimeError as e:
        reason = _gate_reason(root, before)
        raise PipelineError(f"the local pipeline run failed: {_plain(e)}{reason}. Each task's "
                            f"log is above; artifacts so far are under {root}") from e
    run_dir = _new_run_dir(root, before)
    return LocalRunResult(run_dir=run_dir, artifacts=_artifacts(run_dir),
                          serving_base=config.serving_base)


def _plain(error: Exception) -> str:
    """The local runner's message without its terminal colour codes."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", str(error))


def _gate_reason(root: Path, before: set[Path]) -> str:
    """'; the FP32-parity gate failed: <checks>' when that is why the run stopped, else ''."""
    from ampflow.components.evaluate_parity import load_verdict
    from ampflow.errors import ModelLoadError

    try:
        verdict = load_verdict(_new_run_dir(root, before) / "evaluate-parity" / "verdict")
    except (PipelineError, ModelLoadError, OSError):
        return ""
    return "" if verdict["passed"] else f"; {verdict['message']}"


def _new_run_dir(root: Path, before: set[Path]) -> Path:
    new = sorted((p for p in root.iterdir() if p not in before and p.is_dir()),
                 key=lambda p: p.stat().st_mtime)
    if not new:
        raise PipelineError(f"the local runner wrote no run dir under {root}")
    return new[-1]


def _artifacts(run_dir: Path) -> dict[str, dict[str, Path]]:
    """`{task: {output: path}}` from the local runner's layout `<run>/<task>/<output>`."""
    out: dict[str, dict[str, Path]] = {}
    for task_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        out[task_dir.name] = {o.name: o for o in sorted(task_dir.iterdir())}
    return out


__all__ = ["PIPELINE_NAME", "LocalRunConfig", "LocalRunResult", "run_local"]
