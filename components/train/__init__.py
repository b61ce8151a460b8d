"""Step 2: mixed-precision training with XLA, loss-scale telemetry and resumable checkpoints."""

import ampflow.components.train.layers  # noqa: F401  (registers FusedBatchNormalization for loading)
from ampflow.components.train.step import (
    TrainConfig,
    TrainResult,
    load_trained_model,
    run_train,
)

__all__ = ["TrainConfig", "TrainResult", "load_trained_model", "run_train"]
