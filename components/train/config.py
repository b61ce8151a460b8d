"""train's configuration: TrainConfig, its checks, and the option rules the pipeline shares.

The CLI's flags and the KFP component's parameters are generated from TrainConfig's fields
(one declaration per fact); the loss-scale guard's defaults are GuardLimits's (guard.py) and the
text settings TokenizerConfig's (tokenizer.py). `--model` is parsed here, once: `model_spec`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.cliutil import invalid_choice
from ampflow.components.train.clusters.tf_config import STRATEGIES
from ampflow.components.train.precision.policy import POLICIES
from ampflow.components.train.run.allreduce import ALLREDUCE_DTYPES
from ampflow.components.train.run.guard import GuardLimits
from ampflow.errors import ConfigError
from ampflow.modeling.imagenet_weights import WEIGHTS_MODELS
from ampflow.modeling.text_models import (
    BERT_SHAPES,
    CHECKPOINT_LEARNING_RATE,
    ENCODER_LEARNING_RATE,
)
from ampflow.modeling.tokenizer import TokenizerConfig
from ampflow.modeling.transfer import TransferRecipe
from ampflow.modeling.user_model import ModelSpec, parse_model_spec

OPTIMIZERS = ("adam", "adamw", "sgd")
AUTO_BATCH = "auto"
LR_SCHEDULES = ("constant", "cosine")
# How text batches are padded: to their length bucket (ampflow.modeling.length_buckets), or
# every text to --max-sequence-length (the old way, kept for comparison)
TEXT_PADDINGS = ("buckets", "max_length")
# The learning rate of the built-in CNNs and of a user's model when --learning-rate is not given;
# the BERT-style encoders declare theirs beside them (text_models.ENCODER_LEARNING_RATE).
DEFAULT_LEARNING_RATE = 3e-3
_GUARD = GuardLimits()  # the loss-scale guard's defaults, declared once (guard.py)
_TOKENIZER = TokenizerConfig.__dataclass_fields__  # the text settings, declared once there
_RECIPE = TransferRecipe()  # the transfer recipe's defaults, declared once (transfer.py)
# Architectures made for natural photos, where random crops and flips are the usual training.
AUGMENTED_BY_DEFAULT = ("resnet50", "mobilenet_v2")


def _text_field(name: str):
    """TokenizerConfig's field `name` as a TrainConfig field: its default and help, said once."""
    source = _TOKENIZER[name]
    return field(default=source.default, metadata={
        **source.metadata, "help": source.metadata["help"] + " Text data only."})


@functools.cache
def parsed_model_spec(text: str) -> ModelSpec:
    """`--model` parsed against the built-ins, once per text (TrainConfig, CheckModelConfig)."""
    return parse_model_spec(text, _model_choices())


def _model_choices() -> tuple[str, ...]:
    from ampflow.modeling.models import model_names

    return model_names()


def default_learning_rate(spec: ModelSpec, weights: str | None = None) -> float:
    """The learning rate a run of `spec` gets without --learning-rate: the model kind's own.

    With pretrained `weights` it is the transfer recipe's low fine-tuning rate (phase 2).
    """
    if weights:
        return _RECIPE.fine_tune_learning_rate
    if spec.kind == "builtin" and spec.text in BERT_SHAPES:
        return ENCODER_LEARNING_RATE
    if spec.kind == "checkpoint":  # fine-tuning a pretrained encoder: BERT's own range
        return CHECKPOINT_LEARNING_RATE
    return DEFAULT_LEARNING_RATE


def check_allreduce_options(packed_allreduce: bool, allreduce_bytes_per_pack: int,
                            allreduce_dtype: str) -> None:
    """How the replicas all-reduce: TrainConfig's rules, also the pipeline's (train_workers)."""
    if allreduce_dtype not in ALLREDUCE_DTYPES:
        raise ConfigError(invalid_choice("allreduce_dtype", allreduce_dtype, ALLREDUCE_DTYPES))
    if allreduce_bytes_per_pack < 0:
        raise ConfigError("allreduce_bytes_per_pack must be >= 0 (0 = one pack). Received: "
                          f"allreduce_bytes_per_pack={allreduce_bytes_per_pack}")
    if not packed_allreduce and (allreduce_bytes_per_pack or allreduce_dtype != "float32"):
        raise ConfigError(
            "allreduce_bytes_per_pack and allreduce_dtype set how the packed all-reduce "
            "works: they need packed_allreduce. Received: packed_allreduce=False, "
            f"allreduce_bytes_per_pack={allreduce_bytes_per_pack}, "
            f"allreduce_dtype={allreduce_dtype!r}")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; written next to the model it produced."""

    data_dir: Path = field(metadata={"help": "A prepared dataset dir (from prepare-data)."})
    output_dir: Path = field(metadata={"help": "Directory that receives the model artifact."})
    model: str = field(default="small_cnn", metadata={
        "help": "A built-in (small_cnn: fast on a CPU; resnet50, mobilenet_v2: keras.applications, "
                "random weights unless --weights), your builder 'package.module:function' "
                "called as function(input_shape, num_classes), or a .keras file to fine-tune "
                "(docs/how-to/own-model.md)."})
    model_path: str | None = field(default=None, metadata={
        "help": "Directory put first on sys.path to import the --model builder (and the custom "
                "layers of a model) from, here and in every later step that loads the model."})
    weights: str | None = field(default=None, metadata={
        "help": "A Keras applications ImageNet weights file (the ..._notop.h5 that "
                "keras.applications' weights='imagenet' downloads) loaded tensor for tensor into "
                f"the backbone of --model {' or '.join(WEIGHTS_MODELS)} before training, which "
                "then follows the transfer recipe: --head-epochs of --epochs train the new head "
                "on the frozen backbone at --head-learning-rate, the rest fine-tune every layer "
                "at --learning-rate (docs/how-to/fine-tune-pretrained.md)."})
    head_epochs: int = field(default=_RECIPE.head_epochs, metadata={
        "help": "With --weights: the first epochs of --epochs, in which only the new head "
                "trains and the backbone is frozen (its BatchNormalization in inference mode); "
                "0 = fine-tune every layer from the start."})
    head_learning_rate: float = field(default=_RECIPE.head_learning_rate, metadata={
        "help": "With --weights: the learning rate of the --head-epochs (the other epochs "
                "fine-tune at --learning-rate)."})
    image_size: int | None = field(default=None, metadata={
        "help": "Resize inside the model to this square size (default: the model's own; "
                "32 for resnet50/mobilenet_v2)."})
    max_sequence_length: int = _text_field("max_sequence_length")
    vocabulary_size: int = _text_field("vocabulary_size")
    text_padding: str = field(default="buckets", metadata={
        "choices": TEXT_PADDINGS,
        "help": "How text batches are padded. buckets: texts of one length bucket (16, 32, "
                "64, ... up to --max-sequence-length) are batched together and padded to it, "
                "so a batch costs its texts' length; max_length: every text padded to "
                "--max-sequence-length. "
                "buckets needs a model that takes any length (the bert_* encoders); another "
                "model gets max_length, and the log says so. Text data only."})
    precision: str = field(default="auto", metadata={
        "choices": POLICIES,
        "help": "Dtype policy; auto picks mixed_float16 on NVIDIA GPUs with compute capability "
                ">= 7.0, mixed_bfloat16 on TPUs and CPUs with AVX512_BF16/AMX, else float32."})
    jit_compile: bool | None = field(default=None, metadata={
        "flag": "--xla", "tristate": True,
        "deprecated": (("--jit-compile", None, "on"), ("--no-jit-compile", None, "off")),
        "help": "XLA-compile the train step; auto = on with a GPU/TPU; on a CPU on for "
                "mixed_float16 (float16 kernels without XLA are far slower there) and off for "
                "float32/mixed_bfloat16 (measured slower)."})
    epochs: int = field(default=8, metadata={"help": "Epochs to train (a resumed run finishes "
                                                     "the same total)."})
    batch_size: int | str = field(default=32, metadata={
        "help": "Examples per step per replica; the global batch is this × the replicas. 'auto': "
                "on a GPU, the largest batch whose train step fits its memory (found by trial "
                "steps); on a CPU it stays 32, and the log says why."})
    accumulation_steps: int = field(default=1, metadata={
        "help": "Gradient accumulation: each applied step sums the gradients of this many "
                "micro-batches of --batch-size (in float32; one all-reduce, one loss-scale "
                "check and one optimizer update per applied step), so the effective batch is "
                "batch size x steps x replicas; 1 = off (docs/how-to/gradient-accumulation.md)."})
    effective_batch_size: int | None = field(default=None, metadata={
        "help": "With --batch-size auto: the examples per replica per applied step you want; "
                "when that batch does not fit, auto answers with the largest micro-batch that "
                "does and the accumulation steps that make it up."})
    auto_batch_memory_limit_mb: int | None = field(default=None, metadata={
        "help": "With --batch-size auto: search against this memory limit (MiB of measured "
                "train-step peak) instead of the GPU's own, e.g. to leave headroom; also lets "
                "the search run without a GPU."})
    learning_rate: float | None = field(default=None, metadata={
        "help": "Optimizer learning rate (default: the model's own, recorded in metadata.json: "
                f"{ENCODER_LEARNING_RATE:g} for the bert_* encoders, "
                f"{CHECKPOINT_LEARNING_RATE:g} for a pretrained checkpoint, "
                f"{_RECIPE.fine_tune_learning_rate:g} with --weights (the fine-tuning epochs), "
                f"{DEFAULT_LEARNING_RATE:g} for the CNNs and your own builder or .keras file)."})
    optimizer: str = field(default="adam", metadata={
        "choices": OPTIMIZERS, "help": "Optimizer: adam, adamw (decoupled weight decay) or sgd "
                                       "(momentum 0.9)."})
    weight_decay: float = field(default=0.0, metadata={
        "help": "Decoupled weight decay of the optimizer (adamw, sgd, adam); 0 = none."})
    lr_schedule: str = field(default="constant", metadata={
        "choices": LR_SCHEDULES,
        "help": "constant, or cosine: linear warm-up over --warmup-epochs, then cosine decay "
                "to 0 over the rest of the run."})
    warmup_epochs: float = field(default=0.0, metadata={
        "help": "With --lr-schedule cosine: epochs of linear learning-rate warm-up from 0."})
    label_smoothing: float = field(default=0.0, metadata={
        "help": "Label smoothing of the cross-entropy loss (0 = none; 0.1 is usual for "
                "ImageNet)."})
    augment: bool | None = field(default=None, metadata={
        "help": "Random crop and horizontal flip of training images in the input pipeline; auto "
                "= on for the ImageNet architectures (resnet50, mobilenet_v2), off otherwise."})
    seed: int = field(default=42, metadata={"help": "Seed for weights, shuffling and dropout."})
    steps_per_epoch: int | None = field(default=None, metadata={
        "help": "Cap the steps of each epoch (default: the whole training split)."})
    # The loss-scale guard (components/train/run/guard.py has the rule and why; docs/explanation/
    # amp-checks.md): the defaults are GuardLimits's.
    loss_scale_floor: float = field(default=_GUARD.floor, metadata={
        "help": "Stop the run if the dynamic loss scale falls below this (from 32768 that takes "
                "16 more halvings than doublings: gradients that overflow at every scale)."})
    max_consecutive_skipped_steps: int = field(default=_GUARD.max_consecutive_skipped, metadata={
        "help": "Stop the run if more than this many steps in a row are skipped for non-finite "
                "gradients (15: the halvings from 32768 to 1)."})
    max_skipped_fraction: float = field(default=_GUARD.max_skipped_fraction, metadata={
        "help": "Stop the run if more than this fraction of the last --guard-window-steps steps "
                "after warm-up is skipped, and at least --guard-min-skipped-steps of them (a "
                "few skips on a short run are loss scaling at work, never a rate); 1 = off."})
    guard_window_steps: int = field(default=_GUARD.window_steps, metadata={
        "help": "Steps the skipped-step rate is taken over (a sliding window, judged only "
                "once full)."})
    guard_min_skipped_steps: int = field(default=_GUARD.min_skipped_steps, metadata={
        "help": "Skipped steps in the window below which the rate never stops a run."})
    guard_warmup_steps: int = field(default=_GUARD.warmup_steps, metadata={
        "help": "Steps before the skipped-step rate is counted (the scale settles first)."})
    telemetry_every_n_steps: int = field(default=1, metadata={
        "help": "Record the loss scale every N steps."})
    checkpoint_dir: str | None = field(default=None, metadata={
        "help": "Durable dir for the run's resumable state (checkpoint and epoch log): a PVC "
                "path or gs://... that outlives the pod, so a restarted or retried run with "
                "the same dir resumes (default: the output dir). With several workers it must "
                "be storage that every worker reads (ReadWriteMany PVC, gs://)."})
    checkpoint_every_n_steps: int | None = field(default=None, metadata={
        "help": "Also checkpoint every N steps within an epoch (default: at each epoch's end)."})
    strategy: str = field(default="auto", metadata={
        "choices": STRATEGIES,
        "help": "tf.distribute strategy; auto = multi_worker when TF_CONFIG names several tasks, "
                "mirrored with several local GPUs, else default (one device)."})
    workers: int = field(default=1, metadata={
        "help": "Start this many local worker processes on loopback with TF_CONFIG (the "
                "contract a TFJob uses); 1 = this process only."})
    launcher_port: int | None = field(default=None, metadata={
        "help": "With --workers: first loopback port of the local cluster (default: free ports "
                "chosen by the OS)."})
    cpus_per_worker: int | None = field(default=None, metadata={
        "help": "With --workers: pin each worker to this many CPU cores and TF threads "
                "(default: no pinning)."})
    packed_allreduce: bool = field(default=True, metadata={
        "help": "With several replicas: all-reduce the gradients and the step's statistics in "
                "one packed collective per step and take the loss-scale verdict on the reduced "
                "gradients (no extra collective); --no-packed-allreduce: Keras's own gradient "
                "all-reduce plus separate ones (the former path, up to 3 collectives a step). "
                "Same numbers either way (docs/how-to/multi-worker.md)."})
    allreduce_bytes_per_pack: int = field(default=0, metadata={
        "help": "With --packed-allreduce: split the gradients into packs of about this many "
                "bytes (tf.distribute CommunicationOptions.bytes_per_pack), each its own "
                "collective; 0 = one pack (measured fastest on CPU workers)."})
    allreduce_dtype: str = field(default="float32", metadata={
        "choices": ALLREDUCE_DTYPES,
        "help": "With --packed-allreduce: the dtype gradients are summed in across replicas; "
                "compute = the policy's compute dtype (float16/bfloat16: half the bytes, "
                "rounded sums; loss-scaled, checked and unscaled after the sum)."})
    scale_learning_rate: bool = field(default=False, metadata={
        "help": "Multiply the learning rate by the number of replicas (linear scaling rule for "
                "the larger global batch)."})
    autotune: bool = field(default=False, metadata={
        "help": "Before training, time each (policy, XLA) candidate the hardware supports on the "
                "real model, batch and input pipeline, and train with the fastest; overrides "
                "--precision/--xla (the rule-based auto stays the default)."})
    autotune_budget_s: float = field(default=600.0, metadata={
        "help": "Time budget of the whole --autotune search: a candidate still running when it "
                "is spent is stopped (its process killed), the ones not started are skipped."})
    autotune_policies: str | None = field(default=None, metadata={
        "help": "Comma-separated policies --autotune measures (default: float32 and those the "
                "hardware computes natively, the rule of precision.native_formats)."})
    autotune_xla: str = field(default="auto", metadata={
        "choices": ("auto", "both", "off", "on"),
        "help": "XLA settings --autotune measures: auto = both, less those known pathological "
                "on a CPU (XLA for a model of 16+ convolutions, float16 without XLA); both; "
                "off; on."})
    autotune_steps: int = field(default=10, metadata={
        "help": "Timed steps per --autotune candidate (after 3 warm-up steps, compile excluded); "
                "one clearly slower than the best is dropped after 3."})

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", _parse_batch_size(self.batch_size))
        if self.model_path:  # later steps import from it, from any working dir
            object.__setattr__(self, "model_path", str(Path(self.model_path).expanduser()
                                                       .resolve()))
        positive = {"epochs": self.epochs,
                    "batch_size": 1 if self.batch_size == AUTO_BATCH else self.batch_size,
                    "telemetry_every_n_steps": self.telemetry_every_n_steps,
                    "workers": self.workers, "autotune_steps": self.autotune_steps,
                    "accumulation_steps": self.accumulation_steps,
                    "autotune_budget_s": self.autotune_budget_s}
        for name, value in positive.items():
            if value is None or value <= 0:
                raise ConfigError(f"{name} must be > 0. Received: {name}={value}")
        if self.steps_per_epoch is not None and self.steps_per_epoch <= 0:
            raise ConfigError(
                f"steps_per_epoch must be > 0. Received: steps_per_epoch={self.steps_per_epoch}"
            )
        if self.learning_rate is None:  # the model's own, resolved once: what runs is recorded
            object.__setattr__(self, "learning_rate",
                               default_learning_rate(self.model_spec, self.weights))
        if not self.learning_rate > 0:
            raise ConfigError(
                f"learning_rate must be > 0. Received: learning_rate={self.learning_rate}"
            )
        if self.precision not in POLICIES:
            raise ConfigError(invalid_choice("precision", self.precision, POLICIES))
        self.model_spec  # noqa: B018  (a bad --model is one line now; every reader takes this)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(invalid_choice("optimizer", self.optimizer, OPTIMIZERS))
        if self.text_padding not in TEXT_PADDINGS:
            raise ConfigError(invalid_choice("text_padding", self.text_padding, TEXT_PADDINGS))
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(invalid_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES))
        for name in ("weight_decay", "warmup_epochs"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0. Received: {name}={getattr(self, name)}")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError("label_smoothing must be in [0, 1). Received: "
                              f"label_smoothing={self.label_smoothing}")
        if self.batch_size == AUTO_BATCH and (self.workers > 1 or self.autotune):
            raise ConfigError("batch_size auto searches one process's memory before training: "
                              "pass a number with --workers > 1 or --autotune. Received: "
                              f"batch_size='auto', workers={self.workers}, "
                              f"autotune={self.autotune}")
        self._check_effective_batch()
        if self.auto_batch_memory_limit_mb is not None and self.auto_batch_memory_limit_mb <= 0:
            raise ConfigError("auto_batch_memory_limit_mb must be > 0. Received: "
                              f"auto_batch_memory_limit_mb={self.auto_batch_memory_limit_mb}")
        if self.warmup_epochs and self.warmup_epochs >= self.epochs:
            raise ConfigError(f"warmup_epochs must be < epochs ({self.epochs}). Received: "
                              f"warmup_epochs={self.warmup_epochs}")
        if not 0 <= self.max_skipped_fraction <= 1:
            raise ConfigError("max_skipped_fraction must be in [0, 1]. Received: "
                              f"max_skipped_fraction={self.max_skipped_fraction}")
        for name in ("guard_window_steps", "guard_min_skipped_steps"):
            if not getattr(self, name) >= 1:
                raise ConfigError(f"{name} must be >= 1. Received: {name}={getattr(self, name)}")
        for name in ("guard_warmup_steps", "max_consecutive_skipped_steps", "loss_scale_floor"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0. Received: {name}={getattr(self, name)}")
        for name in ("checkpoint_every_n_steps", "cpus_per_worker"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be > 0. Received: {name}={value}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(invalid_choice("strategy", self.strategy, STRATEGIES))
        if self.launcher_port is not None and not 0 < self.launcher_port < 65536:
            raise ConfigError("launcher_port must be in [1, 65535]. "
                              f"Received: launcher_port={self.launcher_port}")
        check_allreduce_options(self.packed_allreduce, self.allreduce_bytes_per_pack,
                                self.allreduce_dtype)
        if self.image_size is not None and self.image_size < 8:
            raise ConfigError(f"image_size must be >= 8. Received: image_size={self.image_size}")
        self.tokenizer_config()  # a sequence length of 0, a vocabulary of 2: one line now
        self._check_weights()

    def _check_weights(self) -> None:
        """--weights fits a built-in ImageNet backbone only; the head settings need it."""
        if not self.weights:
            changed = {name: getattr(self, name) for name in ("head_epochs", "head_learning_rate")
                       if getattr(self, name) != getattr(_RECIPE, name)}
            if changed:
                name, value = next(iter(changed.items()))
                raise ConfigError(f"{name} sets the transfer recipe of a --weights run: pass "
                                  f"--weights or leave it out. Received: {name}={value}")
            return
        spec = self.model_spec
        if spec.kind != "builtin" or spec.text not in WEIGHTS_MODELS:
            raise ConfigError(
                f"weights loads Keras applications' ImageNet weights into a built-in backbone: "
                f"model must be {' or '.join(WEIGHTS_MODELS)}. Received: model={self.model!r} "
                f"with weights={self.weights!r}")
        if self.head_epochs > self.epochs:
            raise ConfigError(f"head_epochs must be <= epochs ({self.epochs}): the head epochs "
                              f"are the first of --epochs. Received: head_epochs="
                              f"{self.head_epochs}")
        self.transfer_recipe()  # the recipe's own checks: one line each

    def transfer_recipe(self) -> TransferRecipe:
        """The two phases of a --weights run: --head-epochs, then the rest of --epochs."""
        return TransferRecipe(head_epochs=self.head_epochs,
                              head_learning_rate=self.head_learning_rate,
                              fine_tune_epochs=self.epochs - self.head_epochs,
                              fine_tune_learning_rate=self.learning_rate)

    def _check_effective_batch(self) -> None:
        """--effective-batch-size is what --batch-size auto aims at; it then picks K itself."""
        wanted = self.effective_batch_size
        if wanted is None:
            return
        if wanted <= 0:
            raise ConfigError(f"effective_batch_size must be > 0. Received: "
                              f"effective_batch_size={wanted}")
        if self.batch_size != AUTO_BATCH or self.accumulation_steps != 1:
            raise ConfigError(
                "effective_batch_size is what --batch-size auto aims at (it chooses the "
                "micro-batch and the accumulation steps): pass --batch-size auto and leave "
                "--accumulation-steps out. Received: effective_batch_size="
                f"{wanted}, batch_size={self.batch_size!r}, "
                f"accumulation_steps={self.accumulation_steps}")

    def tokenizer_config(self) -> TokenizerConfig:
        """The text settings (checked by TokenizerConfig: one rule, the tokenizer's)."""
        return TokenizerConfig(max_sequence_length=self.max_sequence_length,
                               vocabulary_size=self.vocabulary_size)

    def tokenizer_settings_given(self) -> dict[str, int]:
        """The text settings set away from their defaults: what the user passed.

        The CLI, the KFP component and the pipeline pass every field, so a value equal to its
        default reads as not given: a fine-tune's reused tokenizer is told apart from flags
        the user never typed, and image data refuses only the ones set.
        """
        return {name: getattr(self, name) for name in _TOKENIZER
                if getattr(self, name) != _TOKENIZER[name].default}

    def text_settings_given(self) -> dict[str, int | str]:
        """Every text-only setting the user passed: the tokenizer's, and --text-padding."""
        given = self.tokenizer_settings_given()
        if self.text_padding != TrainConfig.__dataclass_fields__["text_padding"].default:
            given["text_padding"] = self.text_padding
        return given

    def guard_limits(self) -> GuardLimits:
        """The loss-scale guard's thresholds from this config."""
        return GuardLimits(
            floor=self.loss_scale_floor, max_skipped_fraction=self.max_skipped_fraction,
            warmup_steps=self.guard_warmup_steps, window_steps=self.guard_window_steps,
            min_skipped_steps=self.guard_min_skipped_steps,
            max_consecutive_skipped=self.max_consecutive_skipped_steps)

    @property
    def model_spec(self) -> ModelSpec:
        """`model` parsed: a built-in, a builder or a .keras file (issue 41: parsed once).

        Cached by the text rather than kept on the instance, so that `config.__dict__`,
        `dataclasses.asdict` and the generated flags hold the declared fields only.
        """
        return parsed_model_spec(self.model)

    @property
    def effective_augment(self) -> bool:
        """`augment`, with auto resolved: on for the ImageNet architectures only."""
        return self.augment if self.augment is not None else self.model in AUGMENTED_BY_DEFAULT


def _parse_batch_size(value) -> int | str:
    """An int, or 'auto'; the CLI passes text ("64", "auto")."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO_BATCH:
            return AUTO_BATCH
        if not text.lstrip("-").isdecimal():
            raise ConfigError(f"batch_size must be a positive integer or 'auto'. Received: "
                              f"batch_size={value!r}")
        return int(text)
    return value
