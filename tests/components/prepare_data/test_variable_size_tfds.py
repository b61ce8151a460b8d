"""A TFDS dataset of varying image size with only a `train` split: a real builder, offline."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data import load_arrays, load_split
from ampflow.errors import ConfigError, DatasetError

NUM_CLASSES = 3
PER_CLASS = (20, 10, 30)  # unbalanced on purpose: the held-out split keeps the proportions


class AmpflowTestVarsize(tfds.core.GeneratorBasedBuilder):
    """60 RGB images of 5..23 px per side, 3 unbalanced classes, a `train` split only."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3)),
            "label": tfds.features.ClassLabel(names=["a", "b", "c"]),
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        rng = np.random.default_rng(0)
        labels = np.repeat(np.arange(NUM_CLASSES), PER_CLASS)
        for i, label in enumerate(labels):
            size = (int(rng.integers(5, 24)), int(rng.integers(5, 24)))
            yield i, {"image": rng.integers(0, 256, (*size, 3), dtype=np.uint8),
                      "label": int(label)}


class AmpflowTestRgba(tfds.core.GeneratorBasedBuilder):
    """RGBA images of one size, with train and test splits: trains as RGB."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(6, 10, 4)),
            "label": tfds.features.ClassLabel(num_classes=2),
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0), "test": self._generate_examples(1)}

    def _generate_examples(self, seed):
        rng = np.random.default_rng(seed)
        for i in range(8):
            yield i, {"image": rng.integers(0, 256, (6, 10, 4), dtype=np.uint8),
                      "label": i % 2}


@pytest.fixture(scope="module")
def prepared_varsize(tmp_path_factory):
    out = tmp_path_factory.mktemp("varsize")
    run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_test_varsize",
                                       image_size=(12, 10)))
    return out


def _info(prepared) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def test_variable_size_dataset_splits_load_at_the_fixed_shape(prepared_varsize):
    info = _info(prepared_varsize)
    assert info["image_shape"] == [12, 10, 3]
    assert info["source_image_shape"] == [None, None, 3]
    assert info["splits"] == {"train": 54, "test": 6}
    for split, count in info["splits"].items():
        ds = load_split(prepared_varsize, split)
        assert ds.element_spec[0] == tf.TensorSpec((12, 10, 3), tf.float32)
        images, labels = load_arrays(prepared_varsize, split)
        assert images.shape == (count, 12, 10, 3) and images.dtype == np.float32
        assert 0.0 <= images.min() and images.max() <= 255.0


def test_variable_size_dataset_images_follow_the_images_py_rule(prepared_varsize):
    info = _info(prepared_varsize)
    raw = tfds.builder_from_directory(f"{info['tfds_data_dir']}/{info['full_name']}")
    first_kept = min(set(range(sum(PER_CLASS))) - set(info["holdout"]["test_indices"]))
    ds = raw.as_dataset(split="train", shuffle_files=False).skip(first_kept)
    source = next(iter(ds))["image"]
    expected = tf.image.resize(tf.cast(source, tf.float32), (12, 10), method="bilinear",
                               antialias=True).numpy()
    images, _ = load_arrays(prepared_varsize, "train", limit=1)
    np.testing.assert_allclose(images[0], expected, atol=1e-4)


def test_train_only_dataset_holds_out_each_class_in_proportion(prepared_varsize):
    info = _info(prepared_varsize)
    assert info["holdout"]["from_split"] == "train" and info["holdout"]["seed"] == 0
    _, test_labels = load_arrays(prepared_varsize, "test")
    _, train_labels = load_arrays(prepared_varsize, "train")
    assert np.bincount(test_labels).tolist() == [2, 1, 3]  # 10 % of 20, 10, 30
    assert np.bincount(train_labels).tolist() == [18, 9, 27]


def test_train_only_dataset_holdout_is_disjoint_and_covers_the_split(prepared_varsize):
    train = {x.tobytes() for x in load_arrays(prepared_varsize, "train")[0]}
    test = {x.tobytes() for x in load_arrays(prepared_varsize, "test")[0]}
    assert not train & test  # the random images are all distinct
    assert len(train) + len(test) == sum(PER_CLASS)


def test_train_only_dataset_holdout_is_seeded(tmp_path, prepared_varsize):
    def test_indices(seed, out):
        return run_prepare_data(PrepareDataConfig(
            output_dir=out, dataset="ampflow_test_varsize", image_size=8, split_seed=seed,
            tfds_data_dir=_info(prepared_varsize)["tfds_data_dir"])).info["holdout"][
                "test_indices"]

    same = test_indices(0, tmp_path / "a")
    assert same == test_indices(0, tmp_path / "b") == _info(prepared_varsize)["holdout"][
        "test_indices"]
    assert test_indices(1, tmp_path / "c") != same


def test_test_split_in_tfds_syntax_is_used_as_given(tmp_path, prepared_varsize):
    info = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path, dataset="ampflow_test_varsize", image_size=8,
        train_split="train[:90%]", test_split="train[90%:]",
        tfds_data_dir=_info(prepared_varsize)["tfds_data_dir"])).info
    assert info["holdout"] is None
    assert info["split_specs"] == {"train": "train[:90%]", "test": "train[90%:]"}
    assert info["splits"] == {"train": 54, "test": 6}
    assert load_arrays(tmp_path, "test")[0].shape == (6, 8, 8, 3)


def test_variable_size_dataset_without_image_size_names_the_flag(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=r"varying size \[None, None, 3\]: pass --image-size"):
        run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_test_varsize"))
    assert not out.exists()  # refused before preparing: no dataset_info.json, no empty tfds/


def test_unknown_test_split_is_a_config_error(tmp_path, prepared_varsize):
    with pytest.raises(ConfigError, match=r"test_split must be a split of ampflow_test_varsize"):
        run_prepare_data(PrepareDataConfig(
            output_dir=tmp_path, dataset="ampflow_test_varsize", image_size=8,
            test_split="validation", tfds_data_dir=_info(prepared_varsize)["tfds_data_dir"]))
    assert not (tmp_path / "dataset_info.json").exists()


def test_rgba_dataset_trains_as_rgb_resized_from_its_fixed_size(tmp_path):
    info = run_prepare_data(PrepareDataConfig(output_dir=tmp_path, dataset="ampflow_test_rgba",
                                              image_size=(3, 5))).info
    assert info["image_shape"] == [3, 5, 3] and info["source_image_shape"] == [6, 10, 4]
    assert info["holdout"] is None and info["splits"] == {"train": 8, "test": 8}
    images, _ = load_arrays(tmp_path, "test")
    raw = tfds.builder_from_directory(f"{info['tfds_data_dir']}/{info['full_name']}")
    rgba = np.stack([ex["image"] for ex in tfds.as_numpy(
        raw.as_dataset(split="test", shuffle_files=False))])
    expected = tf.image.resize(rgba[..., :3].astype(np.float32), (3, 5), antialias=True)
    np.testing.assert_allclose(images, expected.numpy(), atol=1e-4)


@pytest.mark.parametrize(("test_split", "train_spec", "counts"), [
    ("train[90%:]", "train[0:54]", {"train": 54, "test": 6}),
    ("train[10:20]", "train[0:10]+train[20:]", {"train": 50, "test": 10}),
])
def test_test_split_inside_the_whole_train_split_trains_on_the_rest(
        tmp_path, prepared_varsize, test_split, train_spec, counts):
    info = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path, dataset="ampflow_test_varsize", image_size=8,
        test_split=test_split, tfds_data_dir=_info(prepared_varsize)["tfds_data_dir"])).info
    assert info["split_specs"] == {"train": train_spec, "test": test_split}
    assert info["splits"] == counts
    train = {x.tobytes() for x in load_arrays(tmp_path, "train")[0]}
    test = {x.tobytes() for x in load_arrays(tmp_path, "test")[0]}
    assert len(train) == counts["train"] and not train & test


def test_overlapping_train_and_test_slices_are_a_config_error(tmp_path, prepared_varsize):
    with pytest.raises(ConfigError, match=r"must not overlap.*share examples 50..53"):
        run_prepare_data(PrepareDataConfig(
            output_dir=tmp_path, dataset="ampflow_test_varsize", image_size=8,
            train_split="train[:54]", test_split="train[50:]",
            tfds_data_dir=_info(prepared_varsize)["tfds_data_dir"]))
    assert not (tmp_path / "dataset_info.json").exists()


def test_variable_size_dataset_trains_at_the_fixed_shape_with_augmentation(
        tmp_path, prepared_varsize):
    from ampflow.artifacts.model_dir import load_trained_model
    from ampflow.components.train import TrainConfig, run_train

    result = run_train(TrainConfig(
        data_dir=prepared_varsize, output_dir=tmp_path / "model", precision="mixed_bfloat16",
        batch_size=8, epochs=2, augment=True))
    meta = result.metadata
    assert meta["input_shape"] == [12, 10, 3] and meta["recipe"]["augment"] is True
    assert len(meta["epochs"]) == 2 and all(np.isfinite(e["loss"]) for e in meta["epochs"])
    model, _ = load_trained_model(result.output_dir)
    assert tuple(model.input_shape) == (None, 12, 10, 3)
