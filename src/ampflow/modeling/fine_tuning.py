"""BERT's fine-tuning optimizer: AdamW, the learning rate warmed up linearly then decayed to 0.

The recipe of the BERT paper and of Google's and Hugging Face's fine-tuning code: a peak
learning rate of 2e-5…5e-5, reached linearly over the first 10 % of the steps (from 0 at step 0,
as `get_linear_schedule_with_warmup` and BERT's optimization.py compute it), then linear decay
to 0 at the last step; Adam with ε = 1e-6 and decoupled weight decay 0.01, which LayerNorm's
scale and offset and every bias are excluded from. Keras's `AdamW` is the optimizer; under
`mixed_float16` Keras's `compile` wraps it in its `LossScaleOptimizer`, as for any model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras

from ampflow.errors import ConfigError
from ampflow.modeling.text_models import CHECKPOINT_LEARNING_RATE

NO_DECAY = ("gamma", "beta", "bias")  # LayerNorm's scale and offset, biases: variable names


@keras.saving.register_keras_serializable(package="ampflow")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """BERT's learning rate at optimizer step `step` (0-based, Keras's `iterations`).

    `peak · step / warmup_steps` while warming up, then `peak · (total - step) / (total -
    warmup)`, never below 0.
    """

    def __init__(self, peak_learning_rate: float, warmup_steps: int, total_steps: int):
        if not peak_learning_rate > 0:
            raise ConfigError(f"peak_learning_rate must be > 0. Received: "
                              f"peak_learning_rate={peak_learning_rate!r}")
        if not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"total_steps must be an integer >= 1. Received: "
                              f"total_steps={total_steps!r}")
        if not isinstance(warmup_steps, int) or not 0 <= warmup_steps <= total_steps:
            raise ConfigError(f"warmup_steps must be an integer in [0, total_steps="
                              f"{total_steps}]. Received: warmup_steps={warmup_steps!r}")
        self.peak_learning_rate = float(peak_learning_rate)
        self.warmup_steps, self.total_steps = warmup_steps, total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = keras.ops.cast(max(self.warmup_steps, 1), "float32")
        decay = keras.ops.cast(max(self.total_steps - self.warmup_steps, 1), "float32")
        rising = step / warmup
        falling = keras.ops.maximum(0.0, (self.total_steps - step) / decay)
        fraction = keras.ops.where(step < self.warmup_steps, rising, falling)
        return self.peak_learning_rate * fraction

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


@dataclass(frozen=True)
class FineTuneOptimizerConfig:
    """BERT's fine-tuning optimizer settings; the defaults are the paper's and Hugging Face's."""

    learning_rate: float = CHECKPOINT_LEARNING_RATE  # the peak; the paper searched 2e-5..5e-5
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    epsilon: float = 1e-6
    global_clipnorm: float | None = 1.0  # Hugging Face's Trainer clips the global norm to 1

    def __post_init__(self):
        if not isinstance(self.learning_rate, int | float) or not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0. Received: "
                              f"learning_rate={self.learning_rate!r}")
        if not isinstance(self.warmup_fraction, int | float) or not (
                0 <= self.warmup_fraction <= 1):
            raise ConfigError(f"warmup_fraction must be in [0, 1]. Received: "
                              f"warmup_fraction={self.warmup_fraction!r}")
        if not isinstance(self.weight_decay, int | float) or self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0. Received: "
                              f"weight_decay={self.weight_decay!r}")
        if not isinstance(self.epsilon, int | float) or not self.epsilon > 0:
            raise ConfigError(f"epsilon must be > 0. Received: epsilon={self.epsilon!r}")
        clip = self.global_clipnorm
        if clip is not None and not (isinstance(clip, int | float) and clip > 0):
            raise ConfigError(f"global_clipnorm must be > 0 or None. Received: "
                              f"global_clipnorm={self.global_clipnorm!r}")

    def schedule(self, total_steps: int) -> WarmupLinearDecay:
        """The learning rate over `total_steps` optimizer steps (epochs × steps per epoch)."""
        warmup = math.ceil(self.warmup_fraction * total_steps) if isinstance(
            total_steps, int) else total_steps
        return WarmupLinearDecay(self.learning_rate, warmup, total_steps)


def fine_tune_optimizer(config: FineTuneOptimizerConfig, total_steps: int):
    """Keras `AdamW` on the warm-up/decay schedule, no weight decay on LayerNorm or biases."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=config.schedule(total_steps), weight_decay=config.weight_decay,
        beta_1=0.9, beta_2=0.999, epsilon=config.epsilon,
        global_clipnorm=config.global_clipnorm)
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer
