import json
import socket

import numpy as np
import pytest

from ampflow.components.prepare_data import (
    OFFLINE_DEFAULT,
    PrepareDataConfig,
    load_arrays,
    load_dataset_info,
    load_split,
    make_input_pipeline,
    run_prepare_data,
)
from ampflow.errors import ConfigError, DatasetError


def test_offline_default_prepares_documented_shapes_splits_and_classes(prepared_digits):
    info = json.loads((prepared_digits / "dataset_info.json").read_text())
    assert info["name"] == OFFLINE_DEFAULT
    assert info["version"] == "1.0.0"
    assert info["splits"] == {"train": 1438, "test": 359}
    assert info["image_shape"] == [8, 8, 1]
    assert info["class_names"] == [str(d) for d in range(10)]
    images, labels = load_arrays(prepared_digits, "test")
    assert images.shape == (359, 8, 8, 1) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and set(np.unique(labels)) == set(range(10))
    assert images.max() == 255 and images.min() == 0  # rescaled from sklearn's 0..16


def test_offline_dataset_says_nothing_is_downloaded_and_writes_its_config(tmp_path, capsys):
    # TFDS prints "Downloading and preparing dataset Unknown size" for any builder; for the
    # offline ones nothing is downloaded, so our one line replaces that banner.
    result = run_prepare_data(PrepareDataConfig(output_dir=tmp_path))
    out = capsys.readouterr().out
    assert "Downloading" not in out and "downloaded" not in out
    assert "Preparing dataset ampflow_digits/1.0.0 from the scikit-learn wheel (nothing to " \
           "download)" in out
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == result.info["config"] and config["dataset"] == OFFLINE_DEFAULT


def test_offline_default_splits_are_disjoint_and_stratified(prepared_digits):
    train_x, train_y = load_arrays(prepared_digits, "train")
    test_x, test_y = load_arrays(prepared_digits, "test")
    train_rows = {x.tobytes() + bytes([y]) for x, y in zip(train_x, train_y, strict=True)}
    test_rows = [x.tobytes() + bytes([y]) for x, y in zip(test_x, test_y, strict=True)]
    overlap = sum(row in train_rows for row in test_rows)
    assert overlap <= 2  # the UCI set has a couple of duplicate images, not a shared split
    np.testing.assert_allclose(np.bincount(test_y) / len(test_y), 0.1, atol=0.02)


def test_prepare_data_second_run_reuses_prepared_data(prepared_digits, tmp_path):
    info = load_dataset_info(prepared_digits)
    result = run_prepare_data(
        PrepareDataConfig(output_dir=tmp_path, tfds_data_dir=info["tfds_data_dir"])
    )
    assert result.info["splits"] == info["splits"]
    assert not (tmp_path / "tfds").exists()  # read from the given data_dir, nothing copied


def test_input_pipeline_training_batches_are_seeded_and_full(prepared_digits):
    def first_labels(seed):
        ds = make_input_pipeline(load_split(prepared_digits, "train"), batch_size=32,
                                 training=True, seed=seed)
        return [labels.numpy() for _, labels in ds.take(3)]

    batches = first_labels(7)
    for a, b in zip(batches, first_labels(7), strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(batches, first_labels(8), strict=True))
    images, _ = next(iter(make_input_pipeline(load_split(prepared_digits, "train"),
                                              batch_size=32, training=True)))
    assert images.shape == (32, 8, 8, 1) and images.dtype.name == "float32"
    assert float(images.numpy().max()) > 1.0  # raw pixels: the model rescales, not the pipeline


def test_input_pipeline_evaluation_keeps_every_example(prepared_digits):
    ds = make_input_pipeline(load_split(prepared_digits, "test"), batch_size=100, training=False)
    assert sum(int(labels.shape[0]) for _, labels in ds) == 359


def test_prepare_data_unknown_dataset_suggests_close_names(tmp_path):
    with pytest.raises(ConfigError, match=r"Received: dataset='mnistt'.*Did you mean: mnist"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path, dataset="mnistt"))
    assert list(tmp_path.glob("*.json")) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prepare_data_catalog_dataset_offline_says_how_to_pre_prepare(tmp_path, monkeypatch):
    from ampflow.components.prepare_data import step

    # Point the download probe at a closed loopback port: "no network", on any machine.
    monkeypatch.setattr(step, "_DOWNLOAD_PROBE", ("127.0.0.1", _free_port()))
    with pytest.raises(DatasetError, match=r"needs a download.*--tfds-data-dir"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path, dataset="mnist"))
    assert not (tmp_path / "dataset_info.json").exists()


def test_prepare_data_unwritable_output_dir_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(ConfigError, match="output_dir must be a writable directory"):
        run_prepare_data(PrepareDataConfig(output_dir=blocker / "sub"))


def test_load_dataset_info_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="is not a prepared dataset"):
        load_dataset_info(tmp_path)


def test_prepare_data_config_rejects_empty_split():
    with pytest.raises(ConfigError, match="train_split must be non-empty"):
        PrepareDataConfig(output_dir="x", train_split="")
