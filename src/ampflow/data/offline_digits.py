"""The offline default dataset: scikit-learn's 8×8 handwritten digits as a TFDS builder.

A default must run with no network (docs/DESIGN.md, "Data"): machines without internet fail
any download at run time. scikit-learn ships the UCI optical digits (1,797 real 8×8
images, 10 classes) inside its wheel, so wrapping them as a versioned TFDS
`GeneratorBasedBuilder` keeps the default on the same tensorflow-datasets code path as any
catalog dataset (`tfds.builder(name, data_dir=...)`, splits, `ClassLabel` names).
"""

from __future__ import annotations

import inspect

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from ampflow.data.catalog import DIGITS_NAME

NAME = DIGITS_NAME
IMAGE_SHAPE = (8, 8, 1)
CLASS_NAMES = tuple(str(d) for d in range(10))
TEST_FRACTION = 0.2
SPLIT_SEED = 20240531  # fixed: the split is part of the dataset's version, not a run setting


class OfflineBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A builder whose data ships in an installed wheel: TFDS's download banners are untrue.

    TFDS prints "Downloading and preparing dataset Unknown size ..." before generating and
    "... downloaded and prepared" after, whatever the builder; here nothing is downloaded, so
    one line that says where the data comes from replaces them (`SOURCE`).
    """

    SOURCE = "an installed package"

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        """The file that defines the builder (a subclass's own, not this one's).

        TFDS derives it from the package layout, which our folder mapping breaks.
        """
        return epath.Path(inspect.getfile(cls))

    def _log_download_bytes(self) -> None:
        print(f"Preparing dataset {self.info.full_name} from {self.SOURCE} (nothing to "
              f"download) into {self.data_dir}")

    def _log_download_done(self) -> None:
        pass


class AmpflowDigits(OfflineBuilder):
    """8×8 grayscale handwritten digits (UCI optical digits, via scikit-learn), 10 classes."""

    SOURCE = "the scikit-learn wheel"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Stratified 80/20 train/test split, pixels rescaled 0..16 → 0..255."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "scikit-learn's copy of the UCI ML hand-written digits (8x8, 1,797 images), "
                "shipped inside the scikit-learn wheel so it prepares with no network."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=IMAGE_SHAPE),
                    "label": tfds.features.ClassLabel(names=list(CLASS_NAMES)),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://archive.ics.uci.edu/dataset/80",
            citation="Alpaydin, E. and Kaynak, C. (1998). Optical Recognition of Handwritten "
            "Digits.",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download: the data ships with scikit-learn
        images, labels = _load_digits_uint8()
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


def _load_digits_uint8() -> tuple[np.ndarray, np.ndarray]:
    """Return the digits as uint8 [N, 8, 8, 1] in 0..255 (scikit-learn stores 0..16)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]
    return images, digits.target.astype(np.int64)


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split indices per class so that both splits keep the class balance."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_test = int(round(len(idx) * test_fraction))
        test.extend(idx[:n_test])
        train.extend(idx[n_test:])
    return np.sort(np.array(train)), np.sort(np.array(test))
