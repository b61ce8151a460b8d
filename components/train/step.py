"""train: mixed-precision (AMP) training with XLA, loss-scale telemetry and resumable checkpoints.

Writes into `output_dir` (docs/ARTIFACTS.md): `model.keras`, `loss_scale_history.json`,
`tensorboard/`, `config.json` (the resolved config) and, LAST, `metadata.json`, whose presence
marks the model as published. The state dir's `backup/` (a `tf.train.Checkpoint` that
`loop.py`'s CheckpointManager writes at each epoch's end, or every N steps) lets a killed run
resume; it is kept when the loss-scale guard stops a run and removed once the model is
published.

`metadata.json`'s `architecture` is what `--model` was (a built-in, a builder, a `.keras` path);
models written before it was named so hold it as `model_name`, which `load_trained_model` still
reads. The model dir's contract and its loaders are artifacts.py's.

Text data (dataset_info.json `"modality": "text"`) trains the same way: the tokenizer
(tokenizer.py) is fitted on the training split only (or, to fine-tune a `.keras` text model,
the one saved beside it is reused), tokenizes in the tf.data input pipeline (build.py), sizes
the text model's input and embedding table, and is published beside `model.keras` as
`vocab.txt` and `tokenizer.json`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ampflow.artifacts.model_dir import (
    CONFIG_FILE,
    EPOCH_LOG_FILE,
    HISTORY_FILE,
    METADATA_FILE,
    MODEL_FILE,
)
from ampflow.artifacts.throughput import throughput_unit
from ampflow.components.train.clusters.tf_config import PEER_LOST_EXIT_CODE
from ampflow.components.train.config import AUTO_BATCH, TrainConfig
from ampflow.components.train.precision.policy import HardwareInfo, PrecisionSetup
from ampflow.components.train.run.strategy import make_runtime
from ampflow.data.modalities import modality_of
from ampflow.errors import AmpflowError, ConfigError, TrainingDivergedError
from ampflow.files import ensure_writable_dir, read_json, write_json_atomic

log = logging.getLogger(__name__)

FEW_STEPS_PER_EPOCH = 5  # fewer optimizer steps per epoch get a warning at train start
@dataclass(frozen=True)
class TrainResult:
    """The published model dir and its metadata."""

    output_dir: Path
    metadata: dict[str, Any]

    @property
    def model_path(self) -> Path:
        """Path of the saved `.keras` model."""
        return self.output_dir / MODEL_FILE


def run_train(config: TrainConfig, hardware: HardwareInfo | None = None) -> TrainResult:
    """Train `config.model` on the prepared data; publish the model only if training is healthy.

    With `workers > 1` (and no TF_CONFIG) this only starts the local workers
    (components/train/clusters/launcher.py) and returns the chief's result. Under a multi-worker
    TF_CONFIG every worker trains, and only the chief writes into `output_dir`.
    """
    from ampflow.data import load_dataset_info

    info = load_dataset_info(config.data_dir)  # a bad data_dir fails before any compute
    check_options_fit_data(config, info)
    if config.workers > 1:  # the launcher: no TF here (its start-up delayed the workers' ~5 s)
        return _run_local_workers(config)
    checkpoint = refuse_before_tensorflow(config)  # a pretrained one is read here, once
    searched = None
    if config.autotune:  # in a child process, before this one touches TF (autotune.py says why)
        from ampflow.components.train.precision.autotune import search

        searched = search(config, hardware)
    import keras

    from ampflow.components.train.precision.policy import configure_precision

    runtime = make_runtime(config)  # first TF call: MultiWorkerMirroredStrategy requires it
    if config.batch_size != AUTO_BATCH:
        _check_batch_fits_split(config, info, runtime)
    elif runtime.num_workers > 1:
        raise ConfigError("batch_size auto searches one process's memory: under a multi-worker "
                          "TF_CONFIG pass a number. Received: batch_size='auto'")
    output_dir = (ensure_writable_dir(config.output_dir, "output_dir") if runtime.is_chief
                  else Path(config.output_dir))  # the other workers write nowhere shared
    previous_policy = keras.mixed_precision.global_policy().name
    try:
        autotune_report = None
        if config.autotune:
            from ampflow.components.train.precision.autotune import choose
            from ampflow.components.train.precision.policy import detect_hardware

            setup, autotune_report = choose(searched, runtime, hardware or detect_hardware(),
                                            config)
        else:
            setup = configure_precision(config.precision, config.jit_compile, hardware,
                                        modality=info.get("modality"))
        from ampflow.components.train.run.build import preprocessor_of

        tokenizer = preprocessor_of(config, info, checkpoint)  # text: its vocabulary
        model_block, amp_report, checked = preflight_model(config, info, tokenizer,
                                                           runtime)  # before epochs
        extra: dict = {}
        if config.batch_size == AUTO_BATCH:
            config, extra["batch_size_auto"] = _resolve_auto_batch(config, info, setup, runtime)
            _check_batch_fits_split(config, info, runtime)
        return _train(config, info, setup, runtime, output_dir, autotune_report,
                      (model_block, amp_report), extra, tokenizer, checked)
    except Exception as e:
        if runtime.num_workers > 1 and _is_peer_loss(e):
            raise PeerLostError(
                f"lost contact with another worker ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:160]}); exiting with code "
                f"{PeerLostError.exit_code} so that the job restarts every worker, which "
                "resume from the checkpoint dir") from e
        raise
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


def check_options_fit_data(config: TrainConfig, info: dict) -> None:
    """An option the data cannot use is one line, not silently ignored (modalities.py).

    Which models fit which data is models.py's rule, said when the model is built.
    """
    from ampflow.components.train.modalities import training_of

    training_of(info).check_options(config, info)


def _check_batch_fits_split(config: TrainConfig, info: dict, runtime) -> None:
    steps = config.accumulation_steps
    if info["splits"]["train"] < config.batch_size * steps * runtime.num_replicas:
        per = (f"the replicas ({runtime.num_replicas})" if steps == 1 else
               f"the replicas ({runtime.num_replicas}) x accumulation_steps ({steps})")
        raise ConfigError(
            f"batch_size must be <= the training split size ({info['splits']['train']}) divided "
            f"by {per}. Received: batch_size={config.batch_size}")


def _resolve_auto_batch(config: TrainConfig, info: dict, setup: PrecisionSetup,
                        runtime) -> tuple[TrainConfig, dict]:
    """`--batch-size auto`: trial train steps of the real model (components/train/run/memory.py)."""
    from ampflow.components.train.run.build import make_optimizer
    from ampflow.components.train.run.memory import (
        auto_batch_size,
        train_step_probe,
        with_accumulation,
    )
    from ampflow.modeling.models import build_model

    probe = train_step_probe(
        lambda shape, classes: build_model(config.model_spec, shape, classes,
                                           image_size=config.image_size,
                                           model_path=config.model_path),
        tuple(info["image_shape"]), info["num_classes"], setup.policy,
        jit_compile=setup.jit_compile,
        optimizer_factory=lambda: make_optimizer(config, setup, config.learning_rate))
    limit_mb = config.auto_batch_memory_limit_mb
    limit = info["splits"]["train"] // runtime.num_replicas
    wanted = config.effective_batch_size
    if wanted is not None:  # nothing above the wanted batch is worth trying
        if wanted > limit:
            raise ConfigError(f"effective_batch_size must be <= the training split size "
                              f"({info['splits']['train']}) divided by the replicas "
                              f"({runtime.num_replicas}). Received: effective_batch_size={wanted}")
        limit = wanted
    choice = auto_batch_size(probe, limit=limit,
                             memory_limit_bytes=limit_mb * 2**20 if limit_mb else None)
    if wanted is not None:
        choice = with_accumulation(choice, wanted)
    # The resolved config (config.json) holds numbers; batch_size_auto keeps what was wanted.
    return dataclasses.replace(config, batch_size=choice.batch_size, effective_batch_size=None,
                               accumulation_steps=choice.accumulation_steps), choice.to_json()


def preflight_model(config: TrainConfig, info: dict, tokenizer=None,
                    runtime=None) -> tuple[dict, dict, SeededModel | None]:
    """Build the model once under the current policy and check it, before any compute.

    A builder that does not import, a file that does not load, a model whose input or output
    does not fit the data, a model the AMP check refuses (components/train/preflight/rules.py): each
    is one ConfigError line here, before the output dir holds anything. Returns the `model`
    block of metadata.json (what `--model` was, what ampflow changed, each layer's compute and
    variable dtype) and the AMP report (`amp_report.json`). A text model is checked on the
    `tokenizer`'s shapes: its sequence length and the ids in use.

    Under the default strategy (one process; `runtime`) the checked model is also the one
    that trains (the third item, else None): it is built under `config.seed` as `_train`
    would build it, so its initial weights are the same, and a ResNet-50 is built once, not
    twice (~4.8 CPU-s saved).
    """
    from ampflow.components.train.preflight.rules import check_built, model_to_check

    shapes = {} if tokenizer is None else {"sequence_length": tokenizer.sequence_length,
                                           "vocabulary_size": tokenizer.vocabulary_size,
                                           "checkpoint": getattr(tokenizer, "checkpoint", None)}
    reused = runtime is not None and runtime.name == "default"
    if reused:
        import keras

        keras.utils.set_random_seed(config.seed)  # as `_train` seeds before its build
    built, input_shape, num_classes = model_to_check(
        config.model_spec, info, model_path=config.model_path, image_size=config.image_size,
        weights=config.weights, **shapes)
    seeded = SeededModel(built.model, _host_random_state()) if reused else None
    report = check_built(built, input_shape, num_classes)
    for line in report.table().splitlines():
        log.info("%s", line)
    if report.errors:
        raise ConfigError(f"model {config.model!r} cannot train under {report.policy}: "
                          + "; ".join(report.errors))
    from ampflow.components.train.preflight.reload_check import check_reloads
    from ampflow.modeling.user_model import layer_dtypes

    spec = config.model_spec
    check_reloads(report.model, spec, config.model_path)

    block = {"spec": config.model, "kind": spec.kind,
             "model_path": config.model_path, "policy": report.policy,
             "fixes": list(report.fixes), "amp_check": report.summary(),
             "layer_dtypes": layer_dtypes(report.model), "weights": config.weights}
    return block, report.to_json(), seeded


@dataclasses.dataclass(frozen=True)
class SeededModel:
    """A model built right after `keras.utils.set_random_seed(seed)`, and what it left behind.

    `random_state`: the Python and NumPy random states after the build, which `_train` restores
    in place of building it again, so that every draw after the build is what it was.
    """

    model: object
    random_state: tuple


def _host_random_state() -> tuple:
    import random

    import numpy as np

    return random.getstate(), np.random.get_state()


def _restore_host_random_state(state: tuple) -> None:
    import random

    import numpy as np

    random.setstate(state[0])
    np.random.set_state(state[1])


def _run_local_workers(config: TrainConfig) -> TrainResult:
    """`config.workers` local processes (launcher.py); what their chief published."""
    from ampflow.components.train.clusters.launcher import WorkerFailedError, launch_local_workers

    output_dir = launch_local_workers(config)
    metadata_path = output_dir / METADATA_FILE
    if not metadata_path.is_file():
        raise WorkerFailedError(f"every worker exited cleanly but the chief published nothing in "
                                f"{output_dir}")
    return TrainResult(output_dir=output_dir, metadata=read_json(metadata_path))


class PeerLostError(AmpflowError):
    """A worker of a multi-worker run died or became unreachable; restart them all."""

    exit_code = PEER_LOST_EXIT_CODE  # retryable: see cluster.py


def _is_peer_loss(error: BaseException) -> bool:
    """Whether `error` is TF telling that a collective's peer is gone (not a bug of ours)."""
    import tensorflow as tf

    peer_errors = (tf.errors.UnavailableError, tf.errors.AbortedError,
                   tf.errors.CancelledError, tf.errors.DeadlineExceededError)
    return isinstance(error, peer_errors) or "Collective ops is aborted" in str(error)


def refuse_before_tensorflow(config: TrainConfig):
    """What can be refused without TensorFlow is refused before it starts.

    A malformed TF_CONFIG, this worker's port already taken, a `--model` that names nothing, a
    builder module that does not import or lacks its function, a bad pretrained checkpoint:
    each is one ConfigError line at once, not after the ~3-4 CPU-seconds of TensorFlow's
    start-up (on a cluster, every restart of a bad worker paid it). The same checks run again
    where they are used, except the checkpoint's: returned, it is the one the run trains from
    (the tokenizer keeps it for the model: read once per run). None for other models.
    """
    from ampflow.components.train.clusters.tf_config import check_own_port_free, read_tf_config
    from ampflow.modeling.user_model import import_builder

    cluster = read_tf_config()
    if cluster is not None and cluster.num_workers > 1 and config.strategy in (
            "auto", "multi_worker"):
        check_own_port_free(cluster)
    spec = config.model_spec
    if spec.kind == "builder":
        import_builder(spec, config.model_path)
    if spec.kind == "checkpoint":  # a bad checkpoint is one line before anything is written
        from ampflow.modeling.pretrained_text import read_checkpoint_for

        return read_checkpoint_for(spec.text, config.max_sequence_length)
    if config.weights:  # another architecture's file: one line before anything is written
        from ampflow.modeling.imagenet_weights import check_weights_file

        check_weights_file(config.weights, spec.text)
    return None


def _train(config: TrainConfig, info: dict, setup: PrecisionSetup, runtime, output_dir: Path,
           autotune_report: dict | None, model_report: tuple[dict, dict], extra: dict,
           tokenizer=None, checked: SeededModel | None = None):
    import keras
    import tensorflow as tf

    from ampflow.components.train.run.build import (
        build_compiled_model,
        compile_phase,
        training_data,
    )
    from ampflow.components.train.run.loop import LoopConfig, backup_dir
    from ampflow.components.train.run.memory import PeakMemory
    from ampflow.components.train.run.phases import plan_phases, resumable, run_phases
    from ampflow.components.train.run.telemetry import EpochLog, LossScaleTelemetry, read_epoch_log

    keras.utils.set_random_seed(config.seed)  # the same on every worker
    # The batch of one applied step: K micro-batches of batch_size on every replica.
    global_batch = config.batch_size * config.accumulation_steps * runtime.num_replicas
    learning_rate = config.learning_rate * (runtime.num_replicas if config.scale_learning_rate
                                            else 1)
    train_ds, test_ds, steps = training_data(config, info, global_batch, tokenizer)
    capped = config.steps_per_epoch is not None and steps == config.steps_per_epoch
    # said now, so that a model that then learns nothing is no surprise; an epoch capped on
    # purpose by --steps-per-epoch (a smoke run, a benchmark) is the user's choice, not the data's
    if steps < FEW_STEPS_PER_EPOCH and not capped:
        log.warning("an epoch is %d step(s) (%d training examples at a global batch of %d): too "
                    "few to learn from; lower --batch-size or add training examples", steps,
                    info["splits"]["train"], global_batch)
    if checked is not None:  # preflight's model, built under this seed: not built again
        _restore_host_random_state(checked.random_state)
    model = build_compiled_model(config, info, setup, runtime, learning_rate,
                                 total_steps=steps * config.epochs, tokenizer=tokenizer,
                                 model=checked.model if checked is not None else None)

    state_dir = config.checkpoint_dir or str(config.output_dir)
    chief = runtime.is_chief
    if chief:
        _makedirs(state_dir)
    phases = plan_phases(config, learning_rate)
    resumed = resumable(state_dir, phases)
    loop_config = LoopConfig(
        epochs=config.epochs, steps_per_epoch=steps, global_batch_size=global_batch,
        label_smoothing=config.label_smoothing,
        jit_compile=setup.jit_compile, loss_scaling=setup.loss_scaling, state_dir=state_dir,
        checkpoint_every_n_steps=config.checkpoint_every_n_steps,
        packed_allreduce=config.packed_allreduce,
        allreduce_bytes_per_pack=config.allreduce_bytes_per_pack,
        allreduce_dtype=config.allreduce_dtype, item=throughput_unit(info.get("modality")).item,
        accumulation_steps=config.accumulation_steps)
    limits = config.guard_limits()
    # Every worker runs the guard on the same agreed numbers, so all stop at the same step;
    # only the chief writes telemetry, the epoch log and TensorBoard.
    telemetry = LossScaleTelemetry(limits, every_n=config.telemetry_every_n_steps,
                                   tensorboard_dir=output_dir / "tensorboard" if chief else None)
    callbacks: list = [telemetry]
    epoch_log_path = _join(state_dir, EPOCH_LOG_FILE)
    epoch_log = None
    if chief:
        epoch_log = EpochLog(epoch_log_path, global_batch, fresh=not resumed)
        callbacks += [epoch_log, keras.callbacks.TensorBoard(
            str(output_dir / "tensorboard"), update_freq="epoch", profile_batch=0,
            write_graph=False)]
    if resumed:
        log.info("found a checkpoint in %s: resuming", backup_dir(state_dir))
    train_dist, test_dist = _distribute(runtime, train_ds, test_ds)
    try:
        with PeakMemory() as peak:  # AMP's second promise: half-precision activations
            loop, result = run_phases(model, phases, loop_config, runtime, lambda phase: (
                compile_phase(model, config, setup, runtime, phase, steps)),
                (train_dist, test_dist), callbacks)
    except TrainingDivergedError:
        if chief:
            telemetry.save(output_dir / HISTORY_FILE)
            log.error("training stopped by the loss-scale guard; checkpoint kept in %s, no "
                      "model published", backup_dir(state_dir))
        raise
    resumed_at = (result.resumed_at_step // steps + 1) if result.resumed_at_step else None
    epochs = read_epoch_log(epoch_log_path) if chief else []
    metadata = _metadata(config, info, setup, epochs, telemetry.summary(), result.train_seconds,
                         resumed_at, steps)
    if tokenizer is not None:
        metadata.update(_text_metadata(config, tokenizer))
    metadata["distribution"] = {
        **runtime.describe(), "per_replica_batch_size": config.batch_size,
        "global_batch_size": global_batch, "learning_rate": learning_rate,
        "learning_rate_scaled": config.scale_learning_rate}
    metadata["xla"]["scope"] = loop.describe_jit_scope()
    metadata["distribution"]["allreduce"] = loop.describe_allreduce()
    metadata["accumulation"] = _accumulation_block(config, runtime, loop)
    digest, identical = loop.weights_fingerprint()
    metadata["weights_sha256"] = digest
    metadata["distribution"]["weights_identical_on_all_workers"] = identical
    metadata["checkpoint"] = {
        "dir": backup_dir(state_dir), "mechanism": "tf.train.Checkpoint + CheckpointManager",
        "every_n_steps": config.checkpoint_every_n_steps or steps,
        "resumed_at_step": result.resumed_at_step}
    metadata["model"] = model_report[0]
    metadata["memory"] = peak.result.to_json()
    metadata.update(extra)
    metadata["recipe"] = {**_recipe(config, learning_rate, steps),
                          "phases": [phase.to_json() for phase in phases]}
    if autotune_report is not None:
        metadata["autotune"] = autotune_report
    if chief:
        _publish(model, telemetry, epochs, metadata, output_dir, config.checkpoint_dir,
                 model_report[1], tokenizer)
        tf.io.gfile.rmtree(backup_dir(state_dir))  # after publishing: a crash in between resumes
    return TrainResult(output_dir=output_dir, metadata=metadata)


def _accumulation_block(config: TrainConfig, runtime, loop) -> dict:
    """metadata.json's `accumulation`: micro-batch, K, the effective batch, all-reduces per step.

    `allreduce_calls_per_applied_step` is counted as the steps ran (None with one replica):
    1 under accumulation, the K micro-batches' sum reduced once.
    """
    steps = config.accumulation_steps
    micro = config.batch_size
    return {
        "accumulation_steps": steps,
        "micro_batch_size": micro,  # per replica
        "global_micro_batch_size": micro * runtime.num_replicas,
        "effective_batch_size": micro * steps * runtime.num_replicas,  # per applied step
        "accumulator_dtype": "float32" if steps > 1 else None,
        "allreduce_calls_per_applied_step": loop.allreduce_calls_per_step(),
        "batch_statistics": ("per micro-batch: BatchNormalization normalizes each micro-batch "
                             "with its own statistics and updates its moving averages once per "
                             "micro-batch" if steps > 1 else "per batch"),
    }


def _recipe(config: TrainConfig, learning_rate: float, steps: int) -> dict:
    """The training recipe as it ran: optimizer, schedule, regularization, augmentation."""
    return {"optimizer": config.optimizer, "learning_rate": learning_rate,
            "weight_decay": config.weight_decay, "lr_schedule": config.lr_schedule,
            "warmup_steps": int(config.warmup_epochs * steps)
            if config.lr_schedule == "cosine" else 0,
            "decay_steps": steps * config.epochs if config.lr_schedule == "cosine" else 0,
            "label_smoothing": config.label_smoothing, "augment": config.effective_augment}


def _distribute(runtime, train_ds, test_ds):
    from ampflow.components.train.run.strategy import distribute_datasets

    return distribute_datasets(runtime, train_ds, test_ds)


def _publish(model, telemetry, epochs, metadata, output_dir: Path, checkpoint_dir,
             amp_report: dict, tokenizer=None) -> None:
    """Write the model's files; metadata.json last, since its presence publishes the model.

    A text model's tokenizer (vocab.txt, tokenizer.json) is written before it too: a published
    text model always has the vocabulary its ids mean.
    """
    from ampflow.artifacts.model_dir import AMP_REPORT_FILE
    from ampflow.components.train.run.telemetry import write_json_lines

    if checkpoint_dir:  # keep the epoch log with the model it describes
        write_json_lines(output_dir / EPOCH_LOG_FILE, epochs)
    telemetry.save(output_dir / HISTORY_FILE)
    if (output_dir / METADATA_FILE).exists():  # unpublish the old model only now, when the
        log.warning("replacing the model published in %s", output_dir)  # new one is ready
        (output_dir / METADATA_FILE).unlink()
    _save_model(model, output_dir)
    if tokenizer is not None:
        tokenizer.save(output_dir)
    write_json_atomic(output_dir / AMP_REPORT_FILE, amp_report)
    write_json_atomic(output_dir / CONFIG_FILE, metadata["config"])
    write_json_atomic(output_dir / METADATA_FILE, metadata)


def _join(directory: str, name: str) -> str:
    """A path under `directory`, which may be a URI (gs://...) that pathlib would mangle."""
    return directory.rstrip("/") + "/" + name


def _makedirs(path: str) -> None:
    import tensorflow as tf

    try:
        tf.io.gfile.makedirs(path)
    except Exception as e:  # tf.errors.OpError and OSError alike
        raise ConfigError(f"checkpoint_dir must be a writable directory. Received: "
                          f"checkpoint_dir={path!r} ({e})") from e


def _save_model(model, output_dir: Path) -> None:
    """Save through a hidden temp file so a crash never leaves a truncated model.keras."""
    staging = output_dir / ".staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model.save(staging / MODEL_FILE)
    os.replace(staging / MODEL_FILE, output_dir / MODEL_FILE)
    staging.rmdir()


def _dataset_block(info: dict) -> dict:
    """metadata.json's `dataset`: what the model was trained on (a text dataset's skip counts)."""
    block = {k: info[k] for k in ("name", "version", "splits", "image_shape", "num_classes",
                                  "class_names", "modality", "text_key") if k in info}
    if "skipped_files" in info:  # the counts; dataset_info.json lists the files
        block["skipped_files"] = {k: info["skipped_files"].get(k)
                                  for k in ("count", "by_reason")}
    return block


def _text_metadata(config: TrainConfig, tokenizer) -> dict:
    """What a text model's metadata.json adds: its input and its tokenizer (artifacts.py)."""
    from ampflow.artifacts.model_dir import TOKENIZER_FILES
    from ampflow.components.train.run.build import saved_tokenizer_dir, text_padding_of
    from ampflow.data.modality import MODALITY_TEXT
    from ampflow.modeling.text_models import TOKEN_IDS_INPUT

    return {"modality": MODALITY_TEXT, "input_shape": [tokenizer.sequence_length],
            "input_dtype": "int32", "input_name": TOKEN_IDS_INPUT,
            "text_padding": text_padding_of(config, tokenizer),
            "tokenizer": {**dataclasses.asdict(tokenizer.config),
                          "vocabulary_in_use": tokenizer.vocabulary_size,
                          "files": list(TOKENIZER_FILES),
                          "library": "keras.layers.TextVectorization",
                          "source": _tokenizer_source(config, saved_tokenizer_dir(config))}}


def _tokenizer_source(config: TrainConfig, saved) -> str:
    if saved is None:
        return f"fitted on the training split of {config.data_dir}"
    return f"reused: the tokenizer of the fine-tuned model, from {saved}"


def _metadata(config, info, setup, epochs, loss_scale, train_seconds, resumed_at, steps) -> dict:
    import keras
    import tensorflow as tf

    timed = [e["examples_per_sec"] for e in epochs[1:] if e.get("examples_per_sec")]
    if not timed:  # one epoch only: it includes compilation, so say so
        timed = [e["examples_per_sec"] for e in epochs if e.get("examples_per_sec")]
    final = epochs[-1] if epochs else {}
    meta = {
        "architecture": config.model,
        "modality": modality_of(info).name,
        "input_shape": info["image_shape"],
        "num_classes": info["num_classes"],
        "class_names": info["class_names"],
        "image_size": config.image_size,
        "seed": config.seed,
        "epochs": epochs,
        "steps_per_epoch": steps,
        "resumed": resumed_at is not None,
        "resumed_at_epoch": resumed_at,
        "train_seconds": train_seconds,
        "throughput_examples_per_sec": sum(timed) / len(timed) if timed else None,
        "throughput_unit": throughput_unit(info.get("modality")).rate,  # img/s or texts/s
        "throughput_excludes_first_epoch": len(epochs) > 1,
        "final_metrics": {k: v for k, v in final.items()
                          if k not in ("epoch", "seconds", "train_seconds")},
        "loss_scale": loss_scale,
        "devices": [d.name for d in tf.config.list_physical_devices()],
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                     "keras": keras.__version__},
        "dataset": _dataset_block(info),
        "config": {k: os.fspath(v) if isinstance(v, Path) else v
                   for k, v in dataclasses.asdict(config).items()},
    }
    meta.update(setup.as_metadata())
    meta["xla"]["requested"] = config.jit_compile
    return meta
