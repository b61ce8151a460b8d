"""What one training run is made of: its input pipeline, its optimizer, its compiled model.

run_train (step.py), --autotune (autotune.py) and the scaling benchmark build them the same
way from a TrainConfig; keeping them here keeps step.py and autotune.py free of each other.
"""

from __future__ import annotations

from ampflow.components.train.precision import PrecisionSetup

# `config` below is a step.TrainConfig (not imported: step.py imports this module).


def training_data(config, info: dict, global_batch: int):
    """(train, test, steps per epoch): the seeded input pipeline at the global batch size."""
    from ampflow.components.prepare_data import load_split, make_input_pipeline

    train_ds = make_input_pipeline(load_split(config.data_dir, "train"),
                                   batch_size=global_batch, training=True, seed=config.seed,
                                   augment=config.effective_augment)
    test_ds = make_input_pipeline(load_split(config.data_dir, "test"),
                                  batch_size=global_batch, training=False)
    steps = info["splits"]["train"] // global_batch
    if config.steps_per_epoch:
        steps = min(steps, config.steps_per_epoch)
    return train_ds.repeat(), test_ds, steps


def build_uncompiled_model(config, info: dict, runtime):
    """The model under the global policy, in the strategy's scope, not compiled yet."""
    from ampflow.components.train.models import build_model

    with runtime.strategy.scope():
        return build_model(config.model, tuple(info["image_shape"]), info["num_classes"],
                           image_size=config.image_size, model_path=config.model_path)


def build_compiled_model(config, info: dict, setup: PrecisionSetup, runtime,
                         learning_rate: float, total_steps: int | None = None, model=None):
    """The model and its optimizer, created in the strategy's scope (one copy per replica).

    `total_steps` (epochs × steps per epoch) sizes a cosine schedule; without it the learning
    rate is constant (autotune and benchmarks time steps, not whole runs). `model`: one
    already built by `build_uncompiled_model` under the setup's policy (autotune counts the
    convolutions of its first candidate's model, then trains that one instead of a second).
    """
    if model is None:
        model = build_uncompiled_model(config, info, runtime)
    with runtime.strategy.scope():
        model.compile(optimizer=make_optimizer(config, setup, learning_rate, total_steps),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      jit_compile=setup.jit_compile)
    return model


def make_optimizer(config, setup: PrecisionSetup, learning_rate: float,
                   total_steps: int | None = None):
    """Adam, AdamW or SGD (momentum 0.9) with the config's weight decay and schedule.

    Wrapped in a dynamic LossScaleOptimizer when the policy needs loss scaling.
    """
    import keras

    rate = learning_schedule(config, learning_rate, total_steps)
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


def learning_schedule(config, learning_rate: float, total_steps: int | None):
    """A constant rate, or linear warm-up from 0 then cosine decay to 0 (Keras CosineDecay).

    The schedule reads the optimizer's step counter, which the checkpoint keeps, so a resumed
    run continues the same curve.
    """
    import keras

    if config.lr_schedule != "cosine" or not total_steps:
        return learning_rate
    steps_per_epoch = total_steps / config.epochs
    warmup = int(config.warmup_epochs * steps_per_epoch)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else learning_rate,
        decay_steps=max(total_steps - warmup, 1), alpha=0.0,
        warmup_target=learning_rate if warmup else None, warmup_steps=warmup)
