"""ampflow: mixed-precision TensorFlow/Keras training to a served endpoint, on Kubeflow."""

from ampflow import fast_start as _fast_start

__version__ = "0.1.0"

_fast_start.install()  # before anything imports TensorFlow (ampflow/fast_start.py says why)
