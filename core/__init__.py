"""ampflow: mixed-precision TensorFlow/Keras training to a served endpoint, on Kubeflow."""

__version__ = "0.1.0"
