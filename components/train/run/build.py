"""What one training run is made of: its input pipeline, its optimizer, its compiled model.

run_train (step.py), --autotune (autotune.py) and the scaling benchmark build them the same
way from a TrainConfig; keeping them here keeps step.py and autotune.py free of each other.
"""

from __future__ import annotations

import logging

from ampflow.components.train.precision.policy import PrecisionSetup
from ampflow.data.modalities import modality_of
from ampflow.data.modality import MODALITY_IMAGE, MODALITY_TEXT

log = logging.getLogger(__name__)

# `config` below is a step.TrainConfig (not imported: step.py imports this module).


def training_data(config, info: dict, global_batch: int, tokenizer=None):
    """(train, test, steps per epoch): the seeded input pipeline at the global batch size.

    Text data is tokenized here, in tf.data, by `tokenizer` (a `text_tokenizer(config, info)`
    when not given): batches of raw strings become int32 token ids `[batch, L]`. Which
    pipeline is the data's modality's (INPUTS below).
    """
    tokenizer = tokenizer or preprocessor_of(config, info)
    train_ds, test_ds = INPUTS[modality_of(info).name](config, global_batch, tokenizer)
    return train_ds.repeat(), test_ds, _steps_per_epoch(config, info, global_batch)


def _image_data(config, global_batch: int, _preprocessor=None):
    """The image splits as (pixels, label) batches, augmented as configured."""
    from ampflow.data import load_split, make_input_pipeline

    train_ds = make_input_pipeline(load_split(config.data_dir, "train"),
                                   batch_size=global_batch, training=True, seed=config.seed,
                                   augment=config.effective_augment)
    test_ds = make_input_pipeline(load_split(config.data_dir, "test"),
                                  batch_size=global_batch, training=False)
    return train_ds, test_ds


def preprocessor_of(config, info: dict, checkpoint=None):
    """What turns the data into the model's input, fitted once per run (PREPROCESSORS).

    A text run's tokenizer (`text_tokenizer`; of `checkpoint`, a pretrained checkpoint the
    run has read already); None for images.
    """
    return PREPROCESSORS[modality_of(info).name](config, info, checkpoint)


def _steps_per_epoch(config, info: dict, global_batch: int) -> int:
    steps = info["splits"]["train"] // global_batch
    if config.steps_per_epoch:
        steps = min(steps, config.steps_per_epoch)
    return steps


def _text_data(config, global_batch: int, tokenizer):
    """The text splits as (token ids, label) batches, tokenized in tf.data.

    Grouped by length bucket (`text_padding_of`): each batch cut to its texts' bucket; or,
    padded to the cap, tokenized after batching.
    """
    import tensorflow as tf

    from ampflow.data import load_text_split, make_text_pipeline

    padding = text_padding_of(config, tokenizer)
    log.info("text batches padded to %s tokens: %s", "/".join(map(str, padding["lengths"])),
             padding["reason"])
    if padding["mode"] == "buckets":
        from ampflow.data.text_input import make_bucketed_text_pipeline

        def bucketed(split: str, training: bool):
            return make_bucketed_text_pipeline(
                load_text_split(config.data_dir, split), tokenize=tokenizer.tokenize,
                batch_size=global_batch, buckets=tuple(padding["lengths"]),
                training=training, seed=config.seed)

        return bucketed("train", True), bucketed("test", False)

    def tokenized(ds):
        return ds.map(lambda text, label: (tokenizer.tokenize(text), label),
                      num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    train_ds = make_text_pipeline(load_text_split(config.data_dir, "train"),
                                  batch_size=global_batch, training=True, seed=config.seed)
    test_ds = make_text_pipeline(load_text_split(config.data_dir, "test"),
                                 batch_size=global_batch, training=False)
    return tokenized(train_ds), tokenized(test_ds)


def text_padding_of(config, tokenizer) -> dict:
    """How text batches are padded (metadata.json's `text_padding`): mode, lengths, why.

    `buckets` needs a model that takes any length: the bert_* encoders, or a `.keras` file
    whose input says so (`(None, None)`: one of them trained here). A user's builder may fix
    its length (a Flatten, a position table read whole), so it gets `max_length`.
    """
    from ampflow.modeling.length_buckets import bucket_lengths
    from ampflow.modeling.text_models import BERT_SHAPES

    cap = tokenizer.sequence_length
    spec = config.model_spec
    if config.text_padding == "max_length":
        return {"mode": "max_length", "lengths": [cap], "reason": "text_padding max_length"}
    if spec.kind == "builtin" and spec.text in BERT_SHAPES or (
            spec.kind == "file" and _keras_file_takes_any_length(config.model)):
        return {"mode": "buckets", "lengths": list(bucket_lengths(cap)),
                "reason": "texts of one length bucket batched together, padded to it"}
    return {"mode": "max_length", "lengths": [cap],
            "reason": f"model {config.model} may take only {cap} tokens (a fixed input, or "
                      "layers that fix it): length buckets need an input of any length"}


def _keras_file_takes_any_length(path) -> bool:
    """Whether a `.keras` text model's one input is `[batch, None]` (read from its config)."""
    import json
    import zipfile
    from pathlib import Path

    try:
        with zipfile.ZipFile(Path(path).expanduser()) as archive:
            config = json.loads(archive.read("config.json"))
        shapes = [layer["config"].get("batch_shape") for layer in config["config"]["layers"]
                  if layer.get("class_name") == "InputLayer"]
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile):
        return False  # the model's own loading says what is wrong with it
    return len(shapes) == 1 and list(shapes[0] or []) == [None, None]


def text_tokenizer(config, info: dict, checkpoint=None):
    """The tokenizer a text run trains with (image data has none: `PREPROCESSORS`).

    Fitted on the TRAINING split only (nothing of the test split in the vocabulary), with the
    config's sequence length and vocabulary size. Fine-tuning a `.keras` text model reuses the
    tokenizer saved beside it instead: its embedding rows are that vocabulary's ids, and a
    freshly fitted one would number the words differently.
    """
    saved = saved_tokenizer_dir(config)
    if saved is not None:
        return _reused_tokenizer(config, saved)
    if config.model_spec.kind == "checkpoint":
        return _checkpoint_tokenizer(config, checkpoint)
    import time

    from ampflow.data import load_text_split
    from ampflow.modeling.tokenizer import fit_tokenizer

    start = time.perf_counter()
    texts = load_text_split(config.data_dir, "train").map(lambda text, _label: text)
    tokenizer = fit_tokenizer(texts, config.tokenizer_config())
    log.info("tokenizer fitted on the training split (%d texts) in %.1f s: %d words kept of "
             "at most %d, sequence length %d", info["splits"]["train"],
             time.perf_counter() - start, tokenizer.vocabulary_size,
             config.vocabulary_size, tokenizer.sequence_length)
    return tokenizer


def _checkpoint_tokenizer(config, checkpoint=None):
    """A pretrained checkpoint's own WordPiece: its ids are the embedding table's rows.

    `checkpoint`: the one the run read already (read here otherwise); the tokenizer keeps it
    for the model's encoder (`_text_model`).
    """
    from ampflow.modeling.pretrained_text import read_checkpoint_for
    from ampflow.modeling.tokenizer import checkpoint_text_tokenizer

    if checkpoint is None:
        checkpoint = read_checkpoint_for(config.model_spec.text, config.max_sequence_length)
    tokenizer = checkpoint_text_tokenizer(checkpoint, config.max_sequence_length)
    ignored = "vocabulary_size" in config.tokenizer_settings_given()
    log.log(logging.WARNING if ignored else logging.INFO,
            "fine-tuning %s with its own WordPiece tokenizer (%d tokens, %s, sequence length "
            "%d)%s", checkpoint.directory, tokenizer.vocabulary_size,
            "lower-cased" if checkpoint.do_lower_case else "cased", tokenizer.sequence_length,
            f", not --vocabulary-size {config.vocabulary_size}" if ignored else "")
    return tokenizer


def saved_tokenizer_dir(config):
    """The folder of the `.keras` text model to fine-tune, which must hold its tokenizer."""
    from pathlib import Path

    if config.model_spec.kind != "file":
        return None
    return Path(config.model).expanduser().parent


def _reused_tokenizer(config, directory):
    from ampflow.errors import ConfigError
    from ampflow.modeling.tokenizer import TOKENIZER_FILE, VOCAB_FILE, load_tokenizer

    try:
        tokenizer = load_tokenizer(directory)
    except ConfigError as e:
        raise ConfigError(
            f"model {config.model!r} is fine-tuned on text with the tokenizer it was trained "
            f"with, {VOCAB_FILE} and {TOKENIZER_FILE} beside it (train writes both beside "
            f"model.keras): {e}") from e
    settings = tokenizer.config
    overridden = [f"--{name.replace('_', '-')} {value}"  # only flags the user passed
                  for name, value in config.tokenizer_settings_given().items()
                  if value != getattr(settings, name)]
    log.log(logging.WARNING if overridden else logging.INFO,
            "fine-tuning %s with its own tokenizer from %s (sequence length %d, vocabulary %d "
            "words)%s", config.model, directory, settings.max_sequence_length,
            tokenizer.vocabulary_size, f", not {' / '.join(overridden)}" if overridden else "")
    return tokenizer


def build_uncompiled_model(config, info: dict, runtime, tokenizer=None):
    """The model under the global policy, in the strategy's scope, not compiled yet.

    A text model is sized by the tokenizer (`text_tokenizer(config, info)` when not given):
    its input is `[batch, sequence length]` token ids, its embedding table the ids in use.
    """
    tokenizer = tokenizer or preprocessor_of(config, info)
    with runtime.strategy.scope():
        return MODELS[modality_of(info).name](config, info, tokenizer)


def _image_model(config, info: dict, _preprocessor=None):
    """The image model; with --weights, its backbone holds the ImageNet file's tensors."""
    from ampflow.components.train.modalities import load_weights
    from ampflow.modeling.models import build_model

    model = build_model(config.model_spec, tuple(info["image_shape"]), info["num_classes"],
                        image_size=config.image_size, model_path=config.model_path)
    if config.weights:
        load_weights(model, config.weights)
    return model


def _text_model(config, info: dict, tokenizer):
    from ampflow.modeling.models import make_text_model

    return make_text_model(config.model_spec, tokenizer.sequence_length,
                           tokenizer.vocabulary_size, info["num_classes"],
                           model_path=config.model_path,
                           checkpoint=getattr(tokenizer, "checkpoint", None)).model


def build_compiled_model(config, info: dict, setup: PrecisionSetup, runtime,
                         learning_rate: float, total_steps: int | None = None, model=None,
                         tokenizer=None):
    """The model and its optimizer, created in the strategy's scope (one copy per replica).

    `total_steps` (epochs × steps per epoch) sizes a cosine schedule; without it the learning
    rate is constant (autotune and benchmarks time steps, not whole runs). `model`: one
    already built by `build_uncompiled_model` under the setup's policy (autotune counts the
    convolutions of its first candidate's model, then trains that one instead of a second).
    """
    if model is None:
        model = build_uncompiled_model(config, info, runtime, tokenizer)
    with runtime.strategy.scope():
        model.compile(optimizer=make_optimizer(config, setup, learning_rate, total_steps),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      jit_compile=setup.jit_compile)
    return model


def compile_phase(model, config, setup: PrecisionSetup, runtime, phase,
                  steps_per_epoch: int) -> None:
    """Compile `model` for a transfer phase (phases.py): a new optimizer at the phase's rate.

    The head phase keeps its rate constant; the fine-tuning phase follows --lr-schedule over
    its own epochs. Trainable variables are fixed at compile time, so each phase compiles.
    """
    epochs = phase.last_epoch - phase.first_epoch
    total = None if phase.frozen else steps_per_epoch * epochs
    with runtime.strategy.scope():
        model.compile(optimizer=make_optimizer(config, setup, phase.learning_rate, total, epochs),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      jit_compile=setup.jit_compile)


def make_optimizer(config, setup: PrecisionSetup, learning_rate: float,
                   total_steps: int | None = None, epochs: int | None = None):
    """Adam, AdamW or SGD (momentum 0.9) with the config's weight decay and schedule.

    Wrapped in a dynamic LossScaleOptimizer when the policy needs loss scaling. `epochs`: those
    `total_steps` span (default: the run's; a transfer phase's own).
    """
    import keras

    rate = learning_schedule(config, learning_rate, total_steps, epochs)
    decay = config.weight_decay or None
    if config.optimizer == "adam":
        inner = keras.optimizers.Adam(rate, weight_decay=decay)
    elif config.optimizer == "adamw":
        inner = keras.optimizers.AdamW(rate, weight_decay=config.weight_decay)
    else:
        inner = keras.optimizers.SGD(rate, momentum=0.9, weight_decay=decay)
    if setup.loss_scaling:
        return keras.optimizers.LossScaleOptimizer(inner)  # dynamic: starts at 2**15
    return inner


def learning_schedule(config, learning_rate: float, total_steps: int | None,
                      epochs: int | None = None):
    """A constant rate, or linear warm-up from 0 then cosine decay to 0 (Keras CosineDecay).

    The schedule reads the optimizer's step counter, which the checkpoint keeps, so a resumed
    run continues the same curve.
    """
    import keras

    if config.lr_schedule != "cosine" or not total_steps:
        return learning_rate
    steps_per_epoch = total_steps / (epochs or config.epochs)
    warmup = int(config.warmup_epochs * steps_per_epoch)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else learning_rate,
        decay_steps=max(total_steps - warmup, 1), alpha=0.0,
        warmup_target=learning_rate if warmup else None, warmup_steps=warmup)


def _no_preprocessor(config, info: dict, _checkpoint=None):
    return None  # images are the model's input


# What differs by modality in a run, keyed by dataset_info.json's `modality` (the seam's names,
# ampflow.data.modalities): the preprocessor fitted before the run (text: its tokenizer), the
# input pipelines `(config, global batch, preprocessor) -> (train, test)`, and the uncompiled
# model `(config, info, preprocessor)`. components/train/modalities.py holds the rest.
PREPROCESSORS = {MODALITY_IMAGE: _no_preprocessor, MODALITY_TEXT: text_tokenizer}
INPUTS = {MODALITY_IMAGE: _image_data, MODALITY_TEXT: _text_data}
MODELS = {MODALITY_IMAGE: _image_model, MODALITY_TEXT: _text_model}
