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
                                   batch_size=global_batch, training=True, seed=config.seed)
    test_ds = make_input_pipeline(load_split(config.data_dir, "test"),
                                  batch_size=global_batch, training=False)
    steps = info["splits"]["train"] // global_batch
    if config.steps_per_epoch:
        steps = min(steps, config.steps_per_epoch)
    return train_ds.repeat(), test_ds, steps


def build_compiled_model(config, info: dict, setup: PrecisionSetup, runtime,
                         learning_rate: float):
    """The model and its optimizer, created in the strategy's scope (one copy per replica)."""
    from ampflow.components.train.models import build_model

    with runtime.strategy.scope():
        model = build_model(config.model, tuple(info["image_shape"]), info["num_classes"],
                            image_size=config.image_size)
        model.compile(optimizer=make_optimizer(config, setup, learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      jit_compile=setup.jit_compile)
    return model


def make_optimizer(config, setup: PrecisionSetup, learning_rate: float):
    """Adam or SGD; wrapped in a dynamic LossScaleOptimizer when the policy needs scaling."""
    import keras

    if config.optimizer == "adam":
        inner = keras.optimizers.Adam(learning_rate)
    else:
        inner = keras.optimizers.SGD(learning_rate, momentum=0.9)
    if setup.loss_scaling:
        return keras.optimizers.LossScaleOptimizer(inner)  # dynamic: starts at 2**15
    return inner
