"""The offline datasets this package ships (their data installs with a package: no network).

Their builders are `offline_digits.py`, `offline_mnist.py` and `offline_rotten_tomatoes.py`;
prepare-data's config names the default.
"""

DIGITS_NAME = "ampflow_digits"
MNIST_NAME = "ampflow_mnist"
ROTTEN_TOMATOES_NAME = "ampflow_rotten_tomatoes"
OFFLINE_DEFAULT = DIGITS_NAME
# Datasets whose data ships inside an installed package: prepared with no network.
OFFLINE_DATASETS = (DIGITS_NAME, MNIST_NAME, ROTTEN_TOMATOES_NAME)
