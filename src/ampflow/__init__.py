"""ampflow: mixed-precision TensorFlow/Keras training to a served endpoint, on Kubeflow."""

from ampflow import fast_start as _fast_start
from ampflow import task_exit as _task_exit

__version__ = "0.1.0"

_fast_start.install()  # before anything imports TensorFlow (ampflow/fast_start.py says why)
# absl's per-checkpoint timing line, in every ampflow process (a KFP task calls its step
# without the CLI); `--log-level DEBUG` shows it again
_fast_start.quiet_python_noise()
# a KFP task's process ends once its output is written, without TensorFlow's teardown
_task_exit.install()
