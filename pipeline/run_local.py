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
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

from ampflow.components.deploy_serving.config import (
    SERVING_FORMATS,
    TFLITE_VARIANTS,
    check_compute_precision_target,
)
from ampflow.components.prepare_data.config import PrepareDataConfig
from ampflow.components.train.config import DEFAULT_LEARNING_RATE, TrainConfig
from ampflow.components.train.precision.policy import POLICIES
from ampflow.errors import ConfigError, PipelineError
from ampflow.files import ensure_writable_dir
from ampflow.modeling.text_models import CHECKPOINT_LEARNING_RATE, ENCODER_LEARNING_RATE
from ampflow.pipeline.parameters import (
    check_data_arguments,
    check_gate_arguments,
    check_model_names,
    check_serving_format,
)
from ampflow.pipeline.pipeline import (
    AUTO_RELATIVE_LOGIT_DIFF,
    DATA_DEFAULTS,
    GATE_DEFAULTS,
    PIPELINE_NAME,
    SERVING_DEFAULTS,
    TEXT_DATA_PARAMETERS,
    TEXT_DEFAULTS,
    TEXT_TRAIN_PARAMETERS,
    TRAIN_DEFAULTS,
    XLA_VALUES,
    PipelineOptions,
    build_pipeline,
    step_names,
)
from ampflow.pipeline.task_logs import TaskLogRouter, plain, routed_output
from ampflow.serving.compute_precision import COMPUTE_PRECISIONS, check_supported
from ampflow.serving.model_format import DEFAULT_MODEL_NAME

log = logging.getLogger(__name__)
# run-local's flags that are PipelineOptions (compile time), not pipeline parameters; the
# all-reduce ones take PipelineOptions' defaults and help.
COMPILE_TIME = ("with_float32_baseline", "train_workers", "packed_allreduce",
                "allreduce_bytes_per_pack", "allreduce_dtype", "pretrain_epochs")
_OPTIONS = PipelineOptions.__dataclass_fields__
# How much of a failed task's log the error repeats (the whole log is in <workdir>/logs/).
LOG_TAIL_LINES = 15
# The text flags' help: prepare-data's and train's own (their configs' fields).
_TEXT_HELP = {**{name: PrepareDataConfig.__dataclass_fields__[name].metadata
                 for name in TEXT_DATA_PARAMETERS},
              **{name: TrainConfig.__dataclass_fields__[name].metadata
                 for name in TEXT_TRAIN_PARAMETERS}}
# The data sources a local run reads from this machine: each must exist before anything runs.
_LOCAL_SOURCES = {"image_folder": Path.is_dir, "text_folder": Path.is_dir,
                  "text_file": Path.is_file, "weights": Path.is_file}


def _gate_field(name: str):
    """A gate flag: the evaluate step's default and help (EvaluateConfig's field)."""
    from ampflow.components.evaluate_parity.config import EvaluateConfig

    source = EvaluateConfig.__dataclass_fields__[name]
    return field(default=GATE_DEFAULTS[name], metadata=source.metadata)


def _train_field(name: str):
    """A train flag: the pipeline parameter's default, train's own help (TrainConfig's field)."""
    return field(default=TRAIN_DEFAULTS[name],
                 metadata={"help": TrainConfig.__dataclass_fields__[name].metadata["help"]})


def _text_field(name: str):
    """A text flag: the pipeline parameter's default, the step's own help."""
    return field(default=TEXT_DEFAULTS[name], metadata={"help": _TEXT_HELP[name]["help"]})


@dataclass(frozen=True)
class LocalRunConfig:
    """Pipeline parameters for a local run, plus where to put it."""

    workdir: Path = field(metadata={"help": "Holds pipeline_root/ and serving/ of the run."})
    dataset: str = field(default=DATA_DEFAULTS["dataset"], metadata={
        "help": "TFDS dataset name, or an offline one (as prepare-data --dataset)."})
    test_fraction: float = field(default=DATA_DEFAULTS["test_fraction"], metadata={
        "help": "Share of each class held out as the test split the gate decides on, for "
                "data without a test split (as prepare-data --test-fraction)."})
    image_folder: str = field(default="", metadata={
        "help": "A folder of images, one sub-folder per class (optional train/ and test/ "
                "level), read instead of --dataset (as prepare-data --image-folder)."})
    image_size: str = field(default="", metadata={
        "help": "Train and serve at this size: 'H W', 'HxW' or one number for a square "
                "(needed for images of varying size; as prepare-data --image-size)."})
    text_folder: str = _text_field("text_folder")
    text_file: str = _text_field("text_file")
    text_column: str = _text_field("text_column")
    label_column: str = _text_field("label_column")
    text_feature: str = _text_field("text_feature")
    max_text_bytes: int = _text_field("max_text_bytes")
    model: str = field(default=TRAIN_DEFAULTS["model"], metadata={
        "help": "What to train (as train --model): small_cnn, resnet50, mobilenet_v2, your "
                "builder package.module:function, or a .keras file or pretrained BERT "
                "checkpoint dir to fine-tune (brought in with dsl.importer, as on a "
                "cluster)."})
    model_path: str = field(default="", metadata={
        "help": "Directory to import a --model builder from (as train --model-path)."})
    weights: str = _train_field("weights")
    head_epochs: int = _train_field("head_epochs")
    head_learning_rate: float = _train_field("head_learning_rate")
    epochs: int = field(default=TRAIN_DEFAULTS["epochs"], metadata={"help": "Training epochs."})
    batch_size: int = field(default=TRAIN_DEFAULTS["batch_size"], metadata={
        "help": "Training batch size per replica."})
    accumulation_steps: int = field(default=TRAIN_DEFAULTS["accumulation_steps"], metadata={
        "help": "Micro-batches of --batch-size summed per applied step, as train "
                "--accumulation-steps (1 = off)."})
    learning_rate: float = field(default=TRAIN_DEFAULTS["learning_rate"], metadata={
        "help": "Learning rate; 0 = the model's own, train --learning-rate's default "
                f"({ENCODER_LEARNING_RATE:g} for the bert_* encoders, "
                f"{CHECKPOINT_LEARNING_RATE:g} for a pretrained checkpoint, "
                f"{DEFAULT_LEARNING_RATE:g} for the others)."})
    precision: str = field(default="mixed_float16", metadata={
        "choices": POLICIES,
        "help": "Dtype policy. The demo default is mixed_float16 so that dynamic loss scaling "
                "and its telemetry run even on a CPU."})
    xla: str = field(default=TRAIN_DEFAULTS["xla"], metadata={
        "choices": XLA_VALUES,
        "deprecated": (("--jit-compile", {"auto": "auto", "true": "on", "false": "off"}, None),),
        "help": "XLA for the train step, as train --xla: auto = the train step's rule."})
    max_sequence_length: int = _text_field("max_sequence_length")
    vocabulary_size: int = _text_field("vocabulary_size")
    seed: int = field(default=TRAIN_DEFAULTS["seed"], metadata={
        "help": "Seed for weights, shuffling and dropout."})
    autotune: bool = field(default=False, metadata={
        "help": "Time each (policy, XLA) candidate before training and use the fastest."})
    max_accuracy_drop: float = field(default=GATE_DEFAULTS["max_accuracy_drop"], metadata={
        "help": "Parity gate: max accuracy drop of the AMP model vs its float32 twin (points)."})
    min_agreement: float = field(default=GATE_DEFAULTS["min_agreement"], metadata={
        "help": "Parity gate: min argmax agreement of the AMP model and its float32 twin."})
    max_relative_logit_diff: float = field(default=AUTO_RELATIVE_LOGIT_DIFF, metadata={
        "help": "Parity gate: max |logit diff| / max |logit|; < 0 means the per-dtype default."})
    max_baseline_accuracy_drop: float = field(
        default=GATE_DEFAULTS["max_baseline_accuracy_drop"], metadata={
        "help": "Parity gate: max accuracy drop of the AMP-trained model vs the float32-trained "
                "baseline (points)."})
    baseline_alpha: float = field(default=GATE_DEFAULTS["baseline_alpha"], metadata={
        "help": "Parity gate: significance level of the one-sided paired (McNemar) test of "
                "AMP-trained vs float32-trained correctness."})
    chance_alpha: float = field(default=GATE_DEFAULTS["chance_alpha"], metadata={
        "help": "Release gate: significance level of the one-sided binomial test that the "
                "accuracy is above chance (the test split's majority-class rate)."})
    min_accuracy: float = field(default=GATE_DEFAULTS["min_accuracy"], metadata={
        "help": "Release gate: min test accuracy, 0 to 1 (0: not gated)."})
    metric_thresholds: str = field(default=GATE_DEFAULTS["metric_thresholds"], metadata={
        "metavar": "NAME>=VALUE,...",
        "help": "Release gate: more absolute thresholds, NAME>=VALUE or NAME<=VALUE, "
                "comma-separated, on the evaluate step's metrics.json numbers."})
    serving_alpha: float = field(default=GATE_DEFAULTS["serving_alpha"], metadata={
        "help": "Release gate: significance level of the one-sided paired (McNemar) test "
                "against the model serving from <workdir>/serving (its latest version), on "
                "the same test examples."})
    serving_rule: str = _gate_field("serving_rule")
    non_inferiority_margin: float = _gate_field("non_inferiority_margin")
    max_detectable_drop: float = _gate_field("max_detectable_drop")
    force: bool = _gate_field("force")
    tflite_variants: str = field(default=DATA_DEFAULTS["tflite_variants"], metadata={
        "help": "Comma-separated TFLite variants to convert and check."})
    model_name: str = field(default=DEFAULT_MODEL_NAME, metadata={
        "help": "Served model name (as export/serve/predict --model-name)."})
    serving_format: str = field(default=SERVING_DEFAULTS["serving_format"], metadata={
        "choices": SERVING_FORMATS,
        "help": "What the deploy step publishes into <workdir>/serving: the SavedModel, or "
                "the --tflite-variant the convert step produced (ampflow serve loads both)."})
    tflite_variant: str = field(default=SERVING_DEFAULTS["tflite_variant"], metadata={
        "choices": TFLITE_VARIANTS,
        "help": "With --serving-format tflite: the variant to publish (it must be among "
                "--tflite-variants and pass its gate)."})
    serving_compute_precision: str = field(
        default=SERVING_DEFAULTS["compute_precision"], metadata={
            "choices": COMPUTE_PRECISIONS,
            "help": "What ampflow serve computes the published SavedModel in: bfloat16 (this "
                    "CPU must have AVX512_BF16 or AMX-BF16) publishes it only after deploy's "
                    "parity gate against float32 on the test split."})
    train_workers: int = field(default=1, metadata={
        "help": "Train on this many local worker processes (MultiWorkerMirroredStrategy over "
                "loopback, the TF_CONFIG contract of a TFJob)."})
    packed_allreduce: bool = field(default=_OPTIONS["packed_allreduce"].default,
                                   metadata=_OPTIONS["packed_allreduce"].metadata)
    allreduce_bytes_per_pack: int = field(default=_OPTIONS["allreduce_bytes_per_pack"].default,
                                          metadata=_OPTIONS["allreduce_bytes_per_pack"].metadata)
    allreduce_dtype: str = field(default=_OPTIONS["allreduce_dtype"].default,
                                 metadata=_OPTIONS["allreduce_dtype"].metadata)
    pretrain_epochs: int = field(default=_OPTIONS["pretrain_epochs"].default,
                                 metadata=_OPTIONS["pretrain_epochs"].metadata)
    with_float32_baseline: bool = field(default=True, metadata={
        "help": "Also train a float32 baseline (in parallel on a cluster): the gate then "
                "compares AMP-trained with float32-trained accuracy, and the report shows the "
                "AMP training speedup."})

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ConfigError(f"epochs must be > 0. Received: epochs={self.epochs}")
        if self.batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0. Received: batch_size={self.batch_size}")
        if self.accumulation_steps <= 0:
            raise ConfigError("accumulation_steps must be > 0. Received: "
                              f"accumulation_steps={self.accumulation_steps}")
        check_model_names(self.model, self.model_name)
        self._check_checkpoint()
        check_serving_format(self.serving_format, self.tflite_variant, self.tflite_variants,
                             "local")
        check_compute_precision_target(self.serving_compute_precision, "local",
                                       self.serving_format)
        check_supported(self.serving_compute_precision)  # deploy runs its gate on this CPU
        check_gate_arguments({name: getattr(self, name) for name in GATE_DEFAULTS})
        self._check_local_sources()
        # the options' own checks first (the all-reduce flags need train_workers > 1)
        check_data_arguments(self.arguments(), self.pipeline_options())

    def _check_checkpoint(self) -> None:
        """A checkpoint dir is read now, as train reads it: a bad one is one line before a step.

        Its position table bounds --max-sequence-length (train's own rule).
        """
        from ampflow.components.train.config import parsed_model_spec

        if parsed_model_spec(self.model).kind == "checkpoint":
            from ampflow.modeling.pretrained_text import read_checkpoint_for

            read_checkpoint_for(self.model, self.max_sequence_length)

    def _check_local_sources(self) -> None:
        """A folder or table to read must be on this machine: said now, not after a step ran."""
        for name, is_there in _LOCAL_SOURCES.items():
            value = getattr(self, name)
            if value and not is_there(Path(value)):
                what = "an existing folder" if is_there is Path.is_dir else "an existing file"
                raise ConfigError(f"{name} must be {what}. Received: {name}={value!r}")

    def pipeline_options(self) -> PipelineOptions:
        """The compile-time options of a local run: no GPU, no model-store claim."""
        return PipelineOptions(gpu=False, model_store_pvc=None,
                               base_model_uri=self.base_model_uri,
                               weights_uri=self.weights_uri,
                               **{name: getattr(self, name) for name in COMPILE_TIME})

    @property
    def pipeline_root(self) -> Path:
        """Where the local runner writes every task's artifacts."""
        return Path(self.workdir) / "pipeline_root"

    @property
    def log_dir(self) -> Path:
        """One log file per task of the latest run (`<task>.log`), and the runner's own."""
        return Path(self.workdir) / "logs"

    @property
    def workspace(self) -> Path:
        """The run's KFP workspace (train checkpoints); the local runner removes it at the end."""
        return Path(self.workdir) / "workspace"

    @property
    def model_store(self) -> Path:
        """Where the deploy step pushes `<model_name>/<version>/` (a local model store)."""
        return Path(self.workdir) / "serving"

    @property
    def serving_base(self) -> Path:
        """The TF Serving model base path of the served model (`<store>/<model_name>`)."""
        return self.model_store / self.model_name

    def arguments(self) -> dict[str, Any]:
        """The pipeline parameters of this run."""
        skip = {"workdir", *COMPILE_TIME}
        names = {f.name for f in fields(LocalRunConfig)} - skip  # not a subclass's extras
        args = {k: v for k, v in asdict(self).items() if k in names}
        args.update(serving_target="local", serving_model_store=str(self.model_store.resolve()))
        for name in ("model_path", *_LOCAL_SOURCES):  # the step runs in another working dir
            if args[name]:
                args[name] = str(Path(args[name]).resolve())
        args["weights"] = ""  # imported instead (weights_uri), as on a cluster
        return args

    @property
    def weights_uri(self) -> str | None:
        """`--weights FILE`, imported by the pipeline's `dsl.importer` by its absolute path.

        As on a cluster (`--weights-uri`): the train tasks get it as their `weights_file`
        input artifact, not as a path the task must see.
        """
        return str(Path(self.weights).expanduser().resolve()) if self.weights else None

    @property
    def base_model_uri(self) -> str | None:
        """A `.keras` or checkpoint-dir --model, imported by the pipeline's `dsl.importer`.

        As on a cluster: the train tasks get it as their `base_model` input artifact (a
        compile option), by its absolute path, whatever the task's working dir.
        """
        from ampflow.components.train.config import parsed_model_spec

        if parsed_model_spec(self.model).kind in ("file", "checkpoint"):
            return str(Path(self.model).expanduser().resolve())
        return None


@dataclass(frozen=True)
class LocalRunResult:
    """Where each task's artifacts are, and the run's key metrics."""

    run_dir: Path
    artifacts: dict[str, dict[str, Path]]
    serving_base: Path
    logs: dict[str, Path] = field(default_factory=dict)  # task → its log file


def run_local(config: LocalRunConfig, *, verbose: bool = False,
              console: TextIO | None = None) -> LocalRunResult:
    """Run the pipeline with `kfp.local.SubprocessRunner`; PipelineError names a failed task.

    Each task's output goes to `<workdir>/logs/<task>.log` and `console` (default: stdout) gets
    one line as each task starts and one as it ends, with its time and headline number;
    `verbose` also streams every line of the run to `console`, as the local runner prints it.
    """
    from kfp import local

    console = console or sys.stdout
    ensure_writable_dir(config.workdir, "workdir")
    root = ensure_writable_dir(config.pipeline_root, "pipeline_root")
    config.model_store.mkdir(parents=True, exist_ok=True)
    _forget_latest_run(config)
    before = set(root.iterdir())
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               raise_on_error=True, workspace_root=str(config.workspace))
    options = config.pipeline_options()
    pipeline = build_pipeline(options)
    names = step_names(pipeline)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    progress = _Progress(console, lambda: _new_run_dir(root, before), names)
    router = TaskLogRouter(config.log_dir, on_start=progress.started, on_end=progress.ended,
                           echo=console if verbose else None, step_names=names)
    print(f"ampflow: running pipeline '{PIPELINE_NAME}' with the kfp local runner; each "
          f"step's full log goes to {config.log_dir}/<step>.log", file=console, flush=True)
    try:
        with routed_output(router):
            pipeline(**config.arguments())
    except RuntimeError as e:
        task = router.running or _failed_task(plain(str(e)))
        if router.running:
            progress.ended(router.running, False)
        raise PipelineError(_failure_message(config, root, before, task, router,
                                             show_log_tail=not verbose)) from e
    # The artifacts stay under the runner's task names (its dirs); logs go by the step's name.
    run_dir = _new_run_dir(root, before)
    return LocalRunResult(run_dir=run_dir, artifacts=_artifacts(run_dir),
                          serving_base=config.serving_base,
                          logs={names.get(t, t): router.log_path(t) for t in progress.tasks})


def _forget_latest_run(config: LocalRunConfig) -> None:
    """Remove the logs and results of the workdir's previous run: they describe the latest."""
    from ampflow.pipeline.report import RESULTS_JSON, RESULTS_TEXT

    for old in [*config.log_dir.glob("*.log"), Path(config.workdir) / RESULTS_JSON,
                Path(config.workdir) / RESULTS_TEXT]:
        old.unlink(missing_ok=True)


class _Progress:
    """Prints one line as a task starts and one as it ends (time, headline number)."""

    def __init__(self, console: TextIO, run_dir: Callable[[], Path],
                 names: dict[str, str] | None = None) -> None:
        self._console, self._run_dir = console, run_dir
        self._names = dict(names or {})  # task -> the step name KFP shows
        self._started: dict[str, float] = {}
        self.tasks: list[str] = []

    def started(self, task: str) -> None:
        self._started[task] = time.monotonic()
        self.tasks.append(task)
        self._say(f"  {self._names.get(task, task):<18} started")

    def ended(self, task: str, succeeded: bool) -> None:
        from ampflow.pipeline.report import step_headline

        elapsed = time.monotonic() - self._started.get(task, time.monotonic())
        step = self._names.get(task, task)
        if not succeeded:
            self._say(f"  {step:<18} FAILED after {elapsed:.1f} s")
            return
        try:
            headline = step_headline(task, self._run_dir() / task)
        except PipelineError:
            headline = ""
        self._say(f"  {step:<18} done in {elapsed:5.1f} s  {headline}".rstrip())

    def _say(self, line: str) -> None:
        print(line, file=self._console, flush=True)


def _failed_task(message: str) -> str | None:
    """The innermost failed task named in the local runner's error, if any."""
    match = re.search(r"Inner task failed: '([^']+)'", message) or re.search(
        r"Task '([^']+)' finished with status", message)
    return match.group(1) if match else None


def _failure_message(config: LocalRunConfig, root: Path, before: set[Path], task: str | None,
                     router: TaskLogRouter, *, show_log_tail: bool) -> str:
    """Which task stopped the run and why, then where the logs, report and artifacts are.

    Why: the failed gate checks from the evaluate task's verdict, else the end of the log.
    """
    from ampflow.pipeline.report import gate_failure, serving_failure

    step = router.step_names.get(task, task) if task else None
    lines = [f"the local pipeline run stopped at step '{step or '?'}'."]
    try:
        run_dir: Path | None = _new_run_dir(root, before)
    except PipelineError:
        run_dir = None
    failed_checks, notes = gate_failure(run_dir / "evaluate-parity") if run_dir else ([], [])
    worse = serving_failure(run_dir / "compare-serving") if run_dir else None
    if worse:
        lines.append(f"The comparison with the model serving stopped the run before deploy: "
                     f"{worse}")
        lines.append(f"comparison:      {run_dir / 'compare-serving' / 'comparison'}")
    elif failed_checks:
        lines.append(f"The FP32-parity gate failed {len(failed_checks)} check(s), so nothing "
                     "was exported:")
        lines += [f"  - {check}" for check in failed_checks]
        lines += [f"  note: {note}" for note in notes]
        lines.append(f"evaluate report: {run_dir / 'evaluate-parity' / 'report'}")
        lines.append(f"evaluate log:    {router.log_path('evaluate-parity')}")
    elif task:
        log = router.log_path(task)
        if show_log_tail and log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            lines.append(f"The last {len(tail)} lines of its log:")
            lines += [f"  | {line}" for line in tail]
        lines.append(f"its log: {log}")
    lines.append(f"all logs: {config.log_dir}; artifacts so far: {run_dir or root}")
    return "\n".join(lines)


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
