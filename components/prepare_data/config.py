"""What `prepare-data` is asked to do: its config and the offline dataset names.

Kept free of TensorFlow/TFDS imports so that building the CLI parser (`ampflow --help`) stays
fast; the offline builders live in the data library (`ampflow.data`), the image folder's in
`image_folder.py`.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path

from ampflow.data.catalog import (  # noqa: F401  (the step's own names for them)
    DIGITS_NAME,
    MNIST_NAME,
    OFFLINE_DATASETS,
    OFFLINE_DEFAULT,
    ROTTEN_TOMATOES_NAME,
)
from ampflow.data.modality import (
    DEFAULT_MAX_TEXT_BYTES,
    LABEL_FEATURE,
    TEXT_FEATURE,
    TEXT_FEATURE_NAMES,
)
from ampflow.errors import ConfigError

# The text sources: each an alternative to --dataset (and to one another).
_SOURCES = ("image_folder", "text_folder", "text_file")
# The split name that, when a dataset lacks it, gets a seeded stratified held-out split.
DEFAULT_TEST_SPLIT = "test"
# "64", "64x48", "64 48", "64,48" (the KFP component's string form of --image-size)
_SIZE_TEXT = re.compile(r"(\d+)(?:(?:\s*[x×,]\s*|\s+)(\d+))?")
MAX_IMAGE_SIDE = 4096  # the serving signature refuses larger images (MAX_IMAGE_PIXELS 4096²)
# gs://, s3://, hdfs://... (a Path has already folded "//" into "/"): the folders and tables are
# read with local file calls, so a URI would only fail in the step, after a cluster run started.
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")


@dataclass(frozen=True)
class PrepareDataConfig:
    """What to prepare and where; written to `<output_dir>/config.json`."""

    output_dir: Path = field(metadata={"help": "Directory that receives dataset_info.json "
                                               "(and the TFDS data_dir unless --tfds-data-dir)."})
    dataset: str = field(default=OFFLINE_DEFAULT, metadata={
        "help": "TFDS catalog name, optionally name:version: an image dataset (mnist, cifar10, "
                "...) or a text classification one (imdb_reviews, ag_news_subset, glue/sst2, "
                f"...). {', '.join(OFFLINE_DATASETS[:-1])} (28x28 MNIST, 5,000 images) and "
                f"{ROTTEN_TOMATOES_NAME} (12,752 movie-review snippets, fresh/rotten; its file "
                "is fetched at install time) need no network."})
    image_folder: Path | None = field(default=None, metadata={
        "help": "A folder of images instead of --dataset: one sub-folder per class (the class "
                "names), optionally under train/ and test/; JPEG/PNG/BMP/GIF of any size. "
                "Unreadable files are skipped and listed in dataset_info.json."})
    text_folder: Path | None = field(default=None, metadata={
        "help": "A folder of texts instead of --dataset (keras text_dataset_from_directory's "
                "layout): one sub-folder per class (the class names), one .txt file per "
                "example, optionally under train/ and test/. Files that are not UTF-8, empty "
                "or larger than --max-text-bytes are skipped and listed in dataset_info.json."})
    text_file: Path | None = field(default=None, metadata={
        "help": "A table of texts instead of --dataset: .csv, .tsv (no quoting) or .jsonl, "
                "with --text-column and --label-column. Rows that are not UTF-8, empty, "
                "unlabelled or larger than --max-text-bytes are skipped and counted in "
                "dataset_info.json."})
    text_column: str = field(default=TEXT_FEATURE, metadata={
        "help": "The column of --text-file holding the text."})
    label_column: str = field(default=LABEL_FEATURE, metadata={
        "help": "The column of --text-file holding the class (names or integers)."})
    text_feature: str | None = field(default=None, metadata={
        "help": "The feature of a TFDS text dataset holding the text (default: detected: its "
                f"one string feature, else the first of {', '.join(TEXT_FEATURE_NAMES)} it "
                "has)."})
    max_text_bytes: int = field(default=DEFAULT_MAX_TEXT_BYTES, metadata={
        "help": "The largest text of --text-folder or --text-file, in UTF-8 bytes: a larger "
                "file or row is skipped and counted."})
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
        self._check_one_source()
        self._check_text_options()
        if not 0.0 < float(self.test_fraction) < 1.0:
            raise ConfigError(
                f"test_fraction must be in (0, 1). Received: test_fraction={self.test_fraction}")
        object.__setattr__(self, "image_size", parse_image_size(self.image_size))

    def _check_one_source(self) -> None:
        given = [name for name in _SOURCES if getattr(self, name) is not None]
        for name in given:
            _check_local(name, getattr(self, name))
        if given and self.dataset != OFFLINE_DEFAULT:
            raise ConfigError(
                f"{given[0]} and dataset are alternatives: pass one of them. Received: "
                f"{given[0]}={str(getattr(self, given[0]))!r}, dataset={self.dataset!r}")
        if len(given) > 1:
            raise ConfigError(
                f"{' and '.join(given)} are alternatives: pass one of them. Received: "
                + ", ".join(f"{name}={str(getattr(self, name))!r}" for name in given))

    def _check_text_options(self) -> None:
        for name in ("text_column", "label_column"):
            if not getattr(self, name) or not getattr(self, name).strip():
                raise ConfigError(f"{name} must be non-empty. Received: {name}=''")
        if self.text_column == self.label_column:
            raise ConfigError(
                "text_column and label_column must be two columns. Received: both "
                f"{self.text_column!r}")
        if self.text_feature is not None and not self.text_feature.strip():
            object.__setattr__(self, "text_feature", None)
        if self.text_feature is not None and (self.text_folder or self.text_file
                                              or self.image_folder):
            raise ConfigError(
                "text_feature names a feature of a TFDS --dataset; a folder or table has "
                f"its own. Received: text_feature={self.text_feature!r}")
        if isinstance(self.max_text_bytes, bool) or not isinstance(self.max_text_bytes, int) \
                or self.max_text_bytes < 1:
            raise ConfigError(f"max_text_bytes must be a positive integer. Received: "
                              f"max_text_bytes={self.max_text_bytes!r}")
        if self.image_size is not None and (self.text_folder or self.text_file):
            raise ConfigError(
                "image_size applies to images; a text source has none. Received: "
                f"image_size={self.image_size!r}")

    @property
    def is_text_source(self) -> bool:
        """Whether a text folder or table is the source (a TFDS dataset says itself)."""
        return self.text_folder is not None or self.text_file is not None

    @property
    def resolved_tfds_data_dir(self) -> Path:
        """The TFDS data_dir actually used."""
        return Path(self.tfds_data_dir) if self.tfds_data_dir else Path(self.output_dir) / "tfds"


def _check_local(name: str, value) -> None:
    """A folder or table is read from the step's own file system: refuse an object-store URI."""
    if _URI.match(str(value)):
        raise ConfigError(
            f"{name} must be a path on the file system of the machine or pod that runs "
            "prepare-data (it reads local files, not URIs): copy the data there first; on a "
            "cluster, build it into the image (docs/how-to/kubeflow.md#your-own-data-on-a-"
            f"cluster). Received: {name}={str(value)!r}")


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
