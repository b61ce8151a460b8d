"""What `prepare-data` is asked to do: its config and the offline dataset names.

Kept free of TensorFlow/TFDS imports so that building the CLI parser (`ampflow --help`) stays
fast; the builders themselves live in `offline_digits.py`, `offline_mnist.py` and
`image_folder.py`.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.errors import ConfigError

DIGITS_NAME = "ampflow_digits"
MNIST_NAME = "ampflow_mnist"
OFFLINE_DEFAULT = DIGITS_NAME
# Datasets whose data ships inside an installed package: prepared with no network.
OFFLINE_DATASETS = (DIGITS_NAME, MNIST_NAME)
# The split name that, when a dataset lacks it, gets a seeded stratified held-out split.
DEFAULT_TEST_SPLIT = "test"
# "64", "64x48", "64 48", "64,48" (the KFP component's string form of --image-size)
_SIZE_TEXT = re.compile(r"(\d+)(?:(?:\s*[x×,]\s*|\s+)(\d+))?")
MAX_IMAGE_SIDE = 4096  # the serving signature refuses larger images (MAX_IMAGE_PIXELS 4096²)


@dataclass(frozen=True)
class PrepareDataConfig:
    """What to prepare and where; written to `<output_dir>/config.json`."""

    output_dir: Path = field(metadata={"help": "Directory that receives dataset_info.json "
                                               "(and the TFDS data_dir unless --tfds-data-dir)."})
    dataset: str = field(default=OFFLINE_DEFAULT, metadata={
        "help": "TFDS catalog name (mnist, cifar10, fashion_mnist, ...), optionally name:version; "
                f"{' and '.join(OFFLINE_DATASETS)} (28x28 MNIST, 5,000 images) ship with "
                "installed packages and need no network."})
    image_folder: Path | None = field(default=None, metadata={
        "help": "A folder of images instead of --dataset: one sub-folder per class (the class "
                "names), optionally under train/ and test/; JPEG/PNG/BMP/GIF of any size. "
                "Unreadable files are skipped and listed in dataset_info.json."})
    image_size: tuple[int, int] | None = field(default=None, metadata={
        "metavar": ("H", "W"),
        "help": "H W (or one number for a square): the size the pipeline trains and serves "
                "at. Images are resized in the input pipeline (bilinear, antialiased; the "
                "aspect ratio is not kept). Required for datasets of varying image size "
                "(default: the dataset's own fixed size)."})
    tfds_data_dir: Path | None = field(default=None, metadata={
        "help": "An existing TFDS data_dir to read/prepare into (default: <output-dir>/tfds). "
                "Point it at a pre-prepared dir to run offline."})
    train_split: str = field(default="train", metadata={"help": "TFDS split spec for training."})
    test_split: str = field(default=DEFAULT_TEST_SPLIT, metadata={
        "help": "TFDS split spec for evaluation (any TFDS split syntax, e.g. 'train[90%%:]'). "
                f"A dataset without a '{DEFAULT_TEST_SPLIT}' split gets a seeded, stratified "
                "held-out split of --train-split (--test-fraction of each class)."})
    test_fraction: float = field(default=0.1, metadata={
        "help": "Fraction of each class held out for testing when the dataset has no test "
                "split."})
    split_seed: int = field(default=0, metadata={
        "help": "Seed of the held-out split (which examples of each class are held out)."})
    image_key: str = field(default="image", metadata={"help": "Feature holding the image."})
    label_key: str = field(default="label", metadata={"help": "Feature holding the class id."})

    def __post_init__(self) -> None:
        if not self.dataset or not self.dataset.strip():
            raise ConfigError(f"dataset must be a TFDS name. Received: dataset={self.dataset!r}")
        for name in ("train_split", "test_split", "image_key", "label_key"):
            if not getattr(self, name):
                raise ConfigError(f"{name} must be non-empty. Received: {name}=''")
        if self.image_folder is not None and self.dataset != OFFLINE_DEFAULT:
            raise ConfigError(
                "image_folder and dataset are alternatives: pass one of them. Received: "
                f"image_folder={str(self.image_folder)!r}, dataset={self.dataset!r}")
        if not 0.0 < float(self.test_fraction) < 1.0:
            raise ConfigError(
                f"test_fraction must be in (0, 1). Received: test_fraction={self.test_fraction}")
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))

    @property
    def resolved_tfds_data_dir(self) -> Path:
        """The TFDS data_dir actually used."""
        return Path(self.tfds_data_dir) if self.tfds_data_dir else Path(self.output_dir) / "tfds"


def parse_image_size(value) -> tuple[int, int] | None:
    """`None`/"" → None; 64, "64", (64,) → (64, 64); "64x48", "64 48", (64, 48) → (64, 48).

    One parser for the CLI (`--image-size 64 48`, a list), the KFP component (a string) and
    library callers (a tuple), so every entry point accepts and refuses the same values.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    received = value
    if isinstance(value, str):
        match = _SIZE_TEXT.fullmatch(value.strip().lower())
        parts = [p for p in match.groups() if p] if match else []
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    try:
        sides = [_side(p) for p in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2) or not all(1 <= s <= MAX_IMAGE_SIDE for s in sides):
        raise ConfigError(
            f"image_size must be one or two integers in 1..{MAX_IMAGE_SIDE} (H W, or one "
            f"number for a square; '64x48' as a string). Received: image_size={received!r}")
    return (sides[0], sides[-1])


def _side(part) -> int:
    """One side of an image size: a positive integer or its decimal string, never a bool."""
    if isinstance(part, str) and part.strip().isdigit():
        return int(part)
    if isinstance(part, numbers.Integral) and not isinstance(part, bool):
        return int(part)
    raise ValueError(part)
