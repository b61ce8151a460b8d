"""What `prepare-data` is asked to do: its config and the offline dataset names.

Kept free of TensorFlow/TFDS imports so that building the CLI parser (`ampflow --help`) stays
fast; the builders themselves live in `offline_digits.py` and `offline_mnist.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ampflow.errors import ConfigError

DIGITS_NAME = "ampflow_digits"
MNIST_NAME = "ampflow_mnist"
OFFLINE_DEFAULT = DIGITS_NAME
# Datasets whose data ships inside an installed package: prepared with no network.
OFFLINE_DATASETS = (DIGITS_NAME, MNIST_NAME)


@dataclass(frozen=True)
class PrepareDataConfig:
    """What to prepare and where; written to `<output_dir>/config.json`."""

    output_dir: Path = field(metadata={"help": "Directory that receives dataset_info.json "
                                               "(and the TFDS data_dir unless --tfds-data-dir)."})
    dataset: str = field(default=OFFLINE_DEFAULT, metadata={
        "help": "TFDS catalog name (mnist, cifar10, fashion_mnist, ...), optionally name:version; "
                f"{' and '.join(OFFLINE_DATASETS)} (28x28 MNIST, 5,000 images) ship with "
                "installed packages and need no network."})
    tfds_data_dir: Path | None = field(default=None, metadata={
        "help": "An existing TFDS data_dir to read/prepare into (default: <output-dir>/tfds). "
                "Point it at a pre-prepared dir to run offline."})
    train_split: str = field(default="train", metadata={"help": "TFDS split spec for training."})
    test_split: str = field(default="test", metadata={"help": "TFDS split spec for evaluation."})
    image_key: str = field(default="image", metadata={"help": "Feature holding the image."})
    label_key: str = field(default="label", metadata={"help": "Feature holding the class id."})

    def __post_init__(self) -> None:
        if not self.dataset or not self.dataset.strip():
            raise ConfigError(f"dataset must be a TFDS name. Received: dataset={self.dataset!r}")
        for name in ("train_split", "test_split", "image_key", "label_key"):
            if not getattr(self, name):
                raise ConfigError(f"{name} must be non-empty. Received: {name}=''")

    @property
    def resolved_tfds_data_dir(self) -> Path:
        """The TFDS data_dir actually used."""
        return Path(self.tfds_data_dir) if self.tfds_data_dir else Path(self.output_dir) / "tfds"
