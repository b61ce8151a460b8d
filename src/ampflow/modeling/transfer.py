"""Keras's transfer-learning recipe: the new head trains on a frozen backbone, then everything.

Phase 1 freezes the pretrained backbone (`trainable = False`: its weights get no gradient, and
a frozen BatchNormalization runs in inference mode, normalizing with its ImageNet statistics
and not updating them) while the new head learns at an ordinary rate; phase 2 unfreezes every
layer and fine-tunes at a low rate, so the large early gradients of a random head never reach
the pretrained weights. Keras fixes `trainable` when a model is compiled, so each phase
compiles anew (the Keras guide "Transfer learning & fine-tuning" does the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampflow.errors import ConfigError


@dataclass(frozen=True)
class TransferRecipe:
    """The two phases' lengths and learning rates (Adam); the defaults are the Keras guide's."""

    head_epochs: int = 5
    head_learning_rate: float = 1e-3
    fine_tune_epochs: int = 5
    fine_tune_learning_rate: float = 1e-5

    def __post_init__(self):
        for name in ("head_epochs", "fine_tune_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0. Received: {name}={value!r}")
        for name in ("head_learning_rate", "fine_tune_learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be > 0. Received: {name}={value!r}")


def set_frozen(backbone, frozen: bool) -> None:
    """Freeze (or unfreeze) every layer of `backbone`, BatchNormalization in inference mode."""
    backbone.trainable = not frozen


def run_transfer_recipe(model, backbone, data, recipe: TransferRecipe, *, loss,
                        metrics=(), **fit_kwargs) -> list:
    """Train `model` (whose part `backbone` is pretrained) in the two phases; their Histories.

    `data` and `fit_kwargs` go to `model.fit` (validation data, steps, callbacks); epochs run
    on from phase 1's, so callbacks see one count.
    """
    import keras

    histories = []
    phases = ((True, recipe.head_epochs, recipe.head_learning_rate),
              (False, recipe.fine_tune_epochs, recipe.fine_tune_learning_rate))
    done = 0
    for frozen, epochs, learning_rate in phases:
        if not epochs:
            continue
        set_frozen(backbone, frozen)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss,
                      metrics=list(metrics))
        histories.append(model.fit(data, initial_epoch=done, epochs=done + epochs,
                                   **fit_kwargs))
        done += epochs
    set_frozen(backbone, False)
    return histories
