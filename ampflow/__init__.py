"""ampflow: mixed-precision TensorFlow/Keras training to a served endpoint, as a Kubeflow pipeline."""

__version__ = "0.1.0"
