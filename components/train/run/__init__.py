"""The run itself, from a prepared split to trained weights.

The tf.distribute strategy and sharded input (`strategy.py`), data, optimizer and compiled
model (`build.py`), the one training loop (`loop.py`) with gradient accumulation, the packed
all-reduce and the input-bound share, the loss-scale guard (`guard.py`), telemetry,
checkpoints, and the batch-size search (`memory.py`).
"""
