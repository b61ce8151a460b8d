"""A TFDS text classification dataset, prepared from a local data dir built here: real builders.

Three small builders registered by this module stand for the catalog's shapes of text data:
a `train`-only dataset whose text is `sentence` (glue/sst2's name), a news dataset with two
string features and an unlabelled `test` split (ag_news_subset's title/description, GLUE's -1
test labels), and a dataset with text but no class (a regression or generation one).
"""

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
from ampflow.data.text_input import load_text_split, load_texts
from ampflow.errors import ConfigError, DatasetError

PER_CLASS = (12, 6, 18)  # unbalanced on purpose: the held-out split keeps the proportions
WORDS = ("good", "bad", "fine")


class AmpflowTestSentences(tfds.core.GeneratorBasedBuilder):
    """36 sentences in 3 unbalanced classes, an int `idx` beside them, a `train` split only."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "sentence": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=list(WORDS)),
            "idx": np.int32,
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        labels = np.repeat(np.arange(len(WORDS)), PER_CLASS)
        for i, label in enumerate(labels):
            yield i, {"sentence": f"sentence {i} is {WORDS[label]} ✓", "label": int(label),
                      "idx": i}


class AmpflowTestNews(tfds.core.GeneratorBasedBuilder):
    """Title + description, 2 classes; `test` unlabelled (-1) and a labelled `validation`."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "title": tfds.features.Text(),
            "description": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["sports", "world"]),
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(10, labelled=True),
                "validation": self._generate_examples(4, labelled=True),
                "test": self._generate_examples(4, labelled=False)}

    def _generate_examples(self, count, labelled):
        for i in range(count):
            yield i, {"title": f"title {i}", "description": f"the description of story {i}",
                      "label": i % 2 if labelled else -1}


class AmpflowTestScores(tfds.core.GeneratorBasedBuilder):
    """Text with a float score: not a classification dataset."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "score": np.float32,
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(3):
            yield i, {"text": f"text {i}", "score": float(i)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One TFDS data_dir the builders are prepared into once, shared by every test here."""
    return tmp_path_factory.mktemp("tfds-text")


@pytest.fixture(scope="module")
def prepared_sentences(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("sentences")
    run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_test_sentences",
                                       tfds_data_dir=data_dir))
    return out


def _info(prepared) -> dict:
    return json.loads((prepared / "dataset_info.json").read_text())


def test_tfds_text_dataset_detects_its_string_feature_and_class(prepared_sentences):
    info = _info(prepared_sentences)
    assert info["modality"] == "text" and info["image_shape"] is None
    assert info["text_key"] == "sentence" and info["label_key"] == "label"
    assert info["class_names"] == list(WORDS) and info["num_classes"] == 3
    assert info["skipped_files"]["count"] == 0 and info["text_source"] is None
    texts, labels = load_texts(prepared_sentences, "train")
    assert all(t.startswith("sentence ") and t.endswith("✓") for t in texts)  # UTF-8 intact
    assert labels.dtype == np.int64
    assert all(WORDS[y] in t for t, y in zip(texts, labels, strict=True))  # text with its class


def test_tfds_text_dataset_without_test_split_holds_out_each_class(prepared_sentences):
    info = _info(prepared_sentences)
    assert info["splits"] == {"train": 32, "test": 4}
    assert info["holdout"]["from_split"] == "train" and info["holdout"]["fraction"] == 0.1
    train_texts, train_labels = load_texts(prepared_sentences, "train")
    test_texts, test_labels = load_texts(prepared_sentences, "test")
    assert np.bincount(test_labels).tolist() == [1, 1, 2]  # round(10 % of 12, 6, 18)
    assert np.bincount(train_labels).tolist() == [11, 5, 16]
    assert not set(train_texts) & set(test_texts)
    assert len(set(train_texts) | set(test_texts)) == sum(PER_CLASS)


@pytest.mark.slow  # trains bert_tiny for 2 steps
def test_train_takes_a_prepared_tfds_text_dataset(prepared_sentences, tmp_path):
    """A TFDS text dataset prepared from a local data dir trains (issue 39's "Done when")."""
    from ampflow.components.train import TrainConfig, run_train

    result = run_train(TrainConfig(
        data_dir=prepared_sentences, output_dir=tmp_path / "model", model="bert_tiny",
        precision="mixed_float16", jit_compile=False, epochs=1, batch_size=8,
        steps_per_epoch=2, max_sequence_length=8))
    meta = result.metadata
    assert meta["modality"] == "text" and meta["dataset"]["name"] == "ampflow_test_sentences"
    assert meta["input_shape"] == [8] and meta["num_classes"] == 3
    assert meta["loss_scale"]["steps"] == 2 and np.isfinite(meta["final_metrics"]["loss"])
    vocabulary = (tmp_path / "model" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert set(WORDS) <= set(vocabulary)  # the sentences' words, read through TFDS


def test_load_text_split_gives_string_and_int64_scalars(prepared_sentences):
    import tensorflow as tf

    ds = load_text_split(prepared_sentences, "test")
    assert ds.element_spec == (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64))
    assert int(ds.cardinality()) == 4


def test_tfds_text_dataset_prefers_description_and_text_feature_overrides(tmp_path, data_dir):
    info = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path / "a", dataset="ampflow_test_news", test_split="validation",
        tfds_data_dir=data_dir)).info
    assert info["text_key"] == "description" and info["splits"] == {"train": 10, "test": 4}
    assert info["split_specs"] == {"train": "train", "test": "validation"}
    info = run_prepare_data(PrepareDataConfig(
        output_dir=tmp_path / "b", dataset="ampflow_test_news", test_split="validation",
        text_feature="title", tfds_data_dir=data_dir)).info
    assert info["text_key"] == "title"
    texts, _ = load_texts(tmp_path / "b", "test")
    assert sorted(texts) == [f"title {i}" for i in range(4)]


def test_tfds_text_dataset_unlabelled_test_split_names_the_labelled_ones(tmp_path, data_dir):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"test_split must be labelled.*4 of 4 examples "
                                           r"unlabelled.*--test-split.*train, validation"):
        run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_test_news",
                                           tfds_data_dir=data_dir))
    assert not (out / "dataset_info.json").exists()


def test_tfds_text_dataset_with_an_image_size_is_a_config_error(tmp_path, data_dir):
    with pytest.raises(ConfigError, match=r"image_size applies to images; ampflow_test_news is "
                                          r"a text dataset.*Received: image_size=\[8, 8\]"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out", image_size=8,
                                           dataset="ampflow_test_news", tfds_data_dir=data_dir))
    assert not (tmp_path / "out").exists()


def test_tfds_text_feature_that_is_no_string_feature_is_a_config_error(tmp_path, data_dir):
    with pytest.raises(ConfigError, match=r"text_feature must name a string feature.*"
                                          r"Received: text_feature='body'.*title, description"):
        run_prepare_data(PrepareDataConfig(output_dir=tmp_path / "out",
                                           dataset="ampflow_test_news", text_feature="body",
                                           tfds_data_dir=data_dir))


def test_non_classification_dataset_is_refused_in_one_line(tmp_path, data_dir, capsys):
    from ampflow.cli import main

    out = tmp_path / "out"
    code = main(["prepare-data", "--dataset", "ampflow_test_scores", "--output-dir", str(out),
                 "--tfds-data-dir", str(data_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--dataset must be an image or text classification dataset" in err[0]
    assert "text (Text), score (Tensor float32)" in err[0]
    assert not out.exists()


def test_prepare_data_cli_prints_the_text_feature(prepared_sentences, data_dir, tmp_path,
                                                  capsys):
    from ampflow.cli import main

    code = main(["prepare-data", "--dataset", "ampflow_test_sentences", "--output-dir",
                 str(tmp_path), "--tfds-data-dir", str(data_dir)])
    assert code == 0
    out = capsys.readouterr().out
    assert "text_feature   sentence" in out and "image_shape" not in out


def test_image_readers_refuse_a_text_dataset_and_text_readers_an_image_one(prepared_sentences,
                                                                           prepared_digits):
    from ampflow.data import load_split

    with pytest.raises(DatasetError, match="holds text data, not images"):
        load_split(prepared_sentences, "train")
    with pytest.raises(DatasetError, match="holds image data, not text"):
        load_text_split(prepared_digits, "train")


def test_make_text_pipeline_is_seeded_full_for_training_and_complete_for_evaluation(
        prepared_sentences):
    from ampflow.data import make_text_pipeline

    def first_texts(seed):
        ds = make_text_pipeline(load_text_split(prepared_sentences, "train"), batch_size=5,
                                training=True, seed=seed)
        return [texts.numpy().tolist() for texts, _ in ds]

    batches = first_texts(3)
    assert batches == first_texts(3) and batches != first_texts(4)
    assert [len(b) for b in batches] == [5] * 6  # 32 examples: the remainder of 2 dropped
    ds = make_text_pipeline(load_text_split(prepared_sentences, "test"), batch_size=3,
                            training=False)
    assert sum(int(labels.shape[0]) for _, labels in ds) == 4
    with pytest.raises(ConfigError, match="batch_size must be > 0. Received: batch_size=0"):
        make_text_pipeline(load_text_split(prepared_sentences, "test"), batch_size=0,
                           training=False)
