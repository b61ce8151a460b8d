import json
import socket

import numpy as np
import pytest

from ampflow.components.prepare_data import OFFLINE_DEFAULT, PrepareDataConfig, run_prepare_data
from ampflow.data import load_arrays, load_dataset_info, load_split, make_input_pipeline
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


# ---- --image-size ----------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), (64, (64, 64)), ("64", (64, 64)), ((32,), (32, 32)),
    ("64x48", (64, 48)), ("64 48", (64, 48)), ((64, 48), (64, 48)), ([7, 5], (7, 5)),
])
def test_prepare_data_config_image_size_forms_parse_to_h_w(value, expected):
    assert PrepareDataConfig(output_dir="x", image_size=value).image_size == expected


@pytest.mark.parametrize("value", [0, -3, "abc", "64x", "1.5", (1, 2, 3), (), True, 5000,
                                   (64, 0), 64.0])
def test_prepare_data_config_bad_image_size_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"image_size must be one or two integers.*"
                                          r"Received: image_size="):
        PrepareDataConfig(output_dir="x", image_size=value)


@pytest.mark.parametrize(("flags", "expected"), [(["64"], (64, 64)), (["64", "48"], (64, 48))])
def test_prepare_data_cli_image_size_takes_one_or_two_numbers(flags, expected):
    import argparse

    from ampflow.cliutil import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PrepareDataConfig)
    args = parser.parse_args(["--output-dir", "x", "--image-size", *flags])
    assert config_from_args(PrepareDataConfig, args).image_size == expected


def test_prepare_data_cli_three_image_sizes_is_a_config_error():
    import argparse

    from ampflow.cliutil import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PrepareDataConfig)
    args = parser.parse_args(["--output-dir", "x", "--image-size", "1", "2", "3"])
    with pytest.raises(ConfigError, match=r"Received: --image-size=\(1, 2, 3\)"):
        config_from_args(PrepareDataConfig, args)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_prepare_data_config_bad_test_fraction_is_a_config_error(fraction):
    with pytest.raises(ConfigError, match=rf"test_fraction must be in \(0, 1\). Received: "
                                          rf"test_fraction={fraction}"):
        PrepareDataConfig(output_dir="x", test_fraction=fraction)


def test_fixed_size_dataset_with_image_size_is_resized_and_recorded(prepared_digits, tmp_path):
    info = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path, image_size=(16, 12),
        tfds_data_dir=load_dataset_info(prepared_digits)["tfds_data_dir"])).info
    assert info["image_shape"] == [16, 12, 1] and info["source_image_shape"] == [8, 8, 1]
    assert info["resize"]["method"] == "bilinear" and info["resize"]["antialias"] is True
    images, _ = load_arrays(tmp_path, "test")
    assert images.shape == (359, 16, 12, 1) and images.dtype == np.float32
    original, _ = load_arrays(prepared_digits, "test")
    np.testing.assert_allclose(images.mean(), original.mean(), rtol=0.05)  # same pictures


def test_fixed_size_dataset_with_its_own_image_size_keeps_pixels(prepared_digits, tmp_path):
    run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path, image_size=8,
        tfds_data_dir=load_dataset_info(prepared_digits)["tfds_data_dir"]))
    same, _ = load_arrays(tmp_path, "test")
    original, _ = load_arrays(prepared_digits, "test")
    np.testing.assert_array_equal(same, original)


# ---- the input pipeline against the pre-resize reader -----------------------------------------

def _reference_batches(prepared_dir, seed: int, count: int) -> list[np.ndarray]:
    """The pipeline as it was before images.to_model_input: TFDS uint8 → float32 cast."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    info = load_dataset_info(prepared_dir)
    builder = tfds.builder(f"{info['name']}:{info['version']}", data_dir=info["tfds_data_dir"])
    ds = builder.as_dataset(split="train", shuffle_files=False).map(
        lambda ex: (tf.cast(ex["image"], tf.float32), tf.cast(ex["label"], tf.int64)))
    ds = ds.cache().shuffle(10_000, seed=seed, reshuffle_each_iteration=True).batch(
        32, drop_remainder=True)
    return [(x.numpy(), y.numpy()) for x, y in ds.take(count)]


def _batches(prepared_dir, seed: int, count: int, **kwargs) -> list[tuple]:
    ds = make_input_pipeline(load_split(prepared_dir, "train"), batch_size=32, training=True,
                             seed=seed, **kwargs)
    return [(x.numpy(), y.numpy()) for x, y in ds.repeat().take(count)]


def test_input_pipeline_without_augment_is_bit_identical_to_the_plain_cast(prepared_digits):
    for (x, y), (ref_x, ref_y) in zip(_batches(prepared_digits, 5, 3),
                                      _reference_batches(prepared_digits, 5, 3), strict=True):
        np.testing.assert_array_equal(x, ref_x)
        np.testing.assert_array_equal(y, ref_y)


def test_input_pipeline_augment_changes_images_keeps_shape_range_and_labels(prepared_digits):
    plain = _batches(prepared_digits, 5, 3)
    augmented = _batches(prepared_digits, 5, 3, augment=True)
    for (x, y), (ax, ay) in zip(plain, augmented, strict=True):
        np.testing.assert_array_equal(y, ay)  # the same examples, in the same order
        assert ax.shape == x.shape and ax.dtype == np.float32
        assert 0.0 <= ax.min() and ax.max() <= 255.0
        assert not np.array_equal(ax, x)


def test_input_pipeline_augment_is_seeded(prepared_digits):
    first = _batches(prepared_digits, 5, 2, augment=True)
    again = _batches(prepared_digits, 5, 2, augment=True)
    other = _batches(prepared_digits, 6, 2, augment=True)
    for (a, _), (b, _) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0][0], other[0][0])


def test_input_pipeline_augment_draws_new_crops_every_epoch():
    # The crops depend on TensorFlow's global seed too (Dataset.random pairs its seed with it),
    # which whatever ran before in the process may have set: the claim must hold for any. An
    # 8x8 image had ~50 possible crop+flip outcomes, so 6 epochs repeated one often enough that
    # "at least 5 distinct" failed under some global seeds; a 64x64 one has ~20,000.
    import tensorflow as tf

    image = tf.reshape(tf.range(64 * 64, dtype=tf.float32), (64, 64, 1))
    ds = tf.data.Dataset.from_tensors((image, tf.constant(0, tf.int64)))
    try:
        for global_seed in range(20):
            tf.random.set_seed(global_seed)
            epochs = make_input_pipeline(ds, batch_size=1, training=True, augment=True,
                                         seed=1).repeat()
            crops = [x.numpy() for x, _ in epochs.take(6)]
            # one image, a new crop each epoch
            assert len({c.tobytes() for c in crops}) >= 5, global_seed
    finally:
        tf.random.set_seed(None)


def test_input_pipeline_augment_for_evaluation_is_a_config_error(prepared_digits):
    with pytest.raises(ConfigError, match="augment must be False for evaluation"):
        make_input_pipeline(load_split(prepared_digits, "test"), batch_size=8, training=False,
                            augment=True)


def test_input_pipeline_augment_of_images_without_a_fixed_shape_is_a_config_error():
    import tensorflow as tf

    ds = tf.data.Dataset.from_generator(
        lambda: iter([(np.zeros((4, 5, 1), np.float32), 0)]),
        output_signature=(tf.TensorSpec((None, None, 1), tf.float32),
                          tf.TensorSpec((), tf.int32)))
    with pytest.raises(ConfigError, match=r"augment needs images of one known shape.*"
                                          r"Received: images of shape \(None, None, 1\)"):
        make_input_pipeline(ds, batch_size=1, training=True, augment=True)
