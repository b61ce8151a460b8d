"""`ampflow train` on a prepared text dataset (issue 39 point 5, training).

The suite's one tiny text model (tests/tiny_text_model.py, trained once per run and shared with
the evaluate, export, convert, release and deploy tests): a folder of short texts in 3 classes
(one file not UTF-8) prepared by `prepare-data --text-folder` and trained by `ampflow train
--model bert_tiny --precision mixed_float16`. The train step reads the modality from
dataset_info.json, fits the tokenizer on the training split only, tokenizes in tf.data, trains
through the same loop (loss scaling, telemetry, metadata.json) and publishes the tokenizer
beside model.keras, which `load_trained` gives back with the model. Each text is filler words
around one keyword of its class, so a model that learns reaches far above chance (1/3) in two
epochs; every test text holds a word no training text has, which must not be in the vocabulary.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tiny_text_model as shared

from ampflow.errors import ConfigError, ModelLoadError

SEQ, CLASSES = shared.SEQ, shared.CLASSES
TEST_ONLY_WORD = shared.TEST_ONLY_WORD
TRAIN_PER_CLASS, TEST_PER_CLASS = shared.TRAIN_PER_CLASS, shared.TEST_PER_CLASS


@pytest.fixture(scope="module")
def prepared_texts(tmp_path_factory) -> Path:
    return shared.prepared_texts(tmp_path_factory)


@pytest.fixture(scope="module")
def trained_text_model(tmp_path_factory) -> tuple[Path, str]:
    """The shared bert_tiny (mixed_float16, 2 epochs): (model dir, `ampflow train`'s stdout)."""
    trained = shared.trained_text_model(tmp_path_factory)
    return trained.model_dir, trained.train_stdout


def _metadata(model_dir: Path) -> dict:
    return json.loads((model_dir / "metadata.json").read_text())


@pytest.mark.slow  # trains the shared bert_tiny unless another test did (about 15 CPU-s)
def test_train_takes_a_text_folder_and_publishes_model_and_tokenizer(trained_text_model):
    model_dir, stdout = trained_text_model
    meta = _metadata(model_dir)
    assert meta["modality"] == "text" and meta["architecture"] == "bert_tiny"
    assert meta["throughput_unit"] == "texts/s"  # examples of text, not images (throughput.py)
    assert meta["input_shape"] == [SEQ] and meta["input_dtype"] == "int32"
    assert meta["class_names"] == list(CLASSES) and meta["num_classes"] == 3
    assert meta["precision"]["policy"] == "mixed_float16"
    assert meta["loss_scale"]["enabled"] and meta["loss_scale"]["steps"] > 0
    assert meta["dataset"]["splits"] == {"train": 3 * TRAIN_PER_CLASS, "test": 3 * TEST_PER_CLASS}
    # the non-UTF-8 file is counted, from prepare-data through the model's metadata
    assert meta["dataset"]["skipped_files"] == {"count": 1, "by_reason": {"not UTF-8": 1}}
    assert meta["final_metrics"]["val_accuracy"] > 0.6  # chance is 1/3 (60 test texts)
    for name in ("model.keras", "vocab.txt", "tokenizer.json", "amp_report.json",
                 "loss_scale_history.json", "config.json"):
        assert (model_dir / name).is_file(), name
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    assert tokenizer["max_sequence_length"] == SEQ == meta["tokenizer"]["max_sequence_length"]
    assert meta["tokenizer"]["vocabulary_in_use"] == tokenizer["vocabulary_in_use"]
    assert meta["tokenizer"]["source"].startswith("fitted on the training split")
    assert meta["config"]["max_sequence_length"] == SEQ
    assert "tokenizer" in stdout and "throughput_text_s" in stdout


@pytest.mark.slow  # reads the shared model; scores one untrained bert_tiny (no training)
def test_bert_tiny_learns_under_float16_at_the_encoders_default_learning_rate(
        trained_text_model, prepared_texts):
    """The shared model ran at the default learning rate: the encoders' own, recorded in
    metadata.json and the one its optimizer got; and at it bert_tiny learns under float16
    through ampflow's own loop with dynamic loss scaling, from chance to far above it (the
    float16 case of test_text_training.py, merged here onto the run every text test shares)."""
    import keras

    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_texts
    from ampflow.modeling.models import make_text_model
    from ampflow.modeling.text_models import ENCODER_LEARNING_RATE

    model_dir = trained_text_model[0]
    meta = _metadata(model_dir)
    assert meta["config"]["learning_rate"] == ENCODER_LEARNING_RATE
    assert meta["recipe"]["learning_rate"] == ENCODER_LEARNING_RATE
    with zipfile.ZipFile(model_dir / "model.keras") as archive:
        optimizer = json.loads(archive.read("config.json"))["compile_config"]["optimizer"]
    assert optimizer["class_name"] == "LossScaleOptimizer"
    assert optimizer["config"]["inner_optimizer"]["config"]["learning_rate"] == pytest.approx(
        ENCODER_LEARNING_RATE)
    # before training: the same architecture with fresh weights, on the same test ids
    trained = load_trained(model_dir)
    texts, labels = load_texts(prepared_texts, "test")
    ids = trained.inputs(np.array(texts, dtype=object))
    keras.utils.set_random_seed(1)
    fresh = make_text_model("bert_tiny", SEQ, trained.tokenizer.vocabulary_size,
                            len(CLASSES)).model
    before = float(np.mean(np.argmax(fresh.predict(ids, verbose=0), axis=1) == labels))
    after = meta["final_metrics"]["val_accuracy"]
    assert after > 0.8 > before + 0.2, (before, after)
    assert np.isfinite(meta["final_metrics"]["val_loss"])
    scale = meta["loss_scale"]  # the dynamic scale held and the steps were applied, not skipped
    assert scale["enabled"] and scale["final"] >= 1.0
    applied = scale["steps"] - scale["skipped_steps"]
    assert applied > 0.9 * shared.EPOCHS * meta["final_metrics"]["steps"], scale


@pytest.mark.slow
def test_the_vocabulary_is_the_training_splits_only(trained_text_model):
    vocabulary = (trained_text_model[0] / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocabulary[:2] == ["", "[UNK]"]
    assert {"great", "awful", "odd", "film"} <= set(vocabulary)
    assert TEST_ONLY_WORD not in vocabulary  # every test text holds it: fitted on train only


@pytest.mark.slow
def test_load_trained_gives_the_model_with_the_tokenizer_it_trained_with(trained_text_model,
                                                                        prepared_texts):
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_texts

    model_dir = trained_text_model[0]
    trained = load_trained(model_dir)
    assert trained.modality == "text" and trained.tokenizer.sequence_length == SEQ
    texts, labels = load_texts(prepared_texts, "test")
    ids = trained.inputs(np.array(texts, dtype=object))
    assert ids.shape == (len(texts), SEQ) and ids.dtype == "int32"
    predicted = np.argmax(trained.model.predict(ids, verbose=0), axis=1)
    accuracy = float(np.mean(predicted == labels))
    # the training run's own test accuracy, from raw text through the published tokenizer
    expected = _metadata(model_dir)["final_metrics"]["val_accuracy"]
    assert abs(accuracy - expected) <= 1 / len(texts) + 1e-9, (accuracy, expected)


@pytest.mark.slow
def test_a_text_model_without_its_tokenizer_is_refused(trained_text_model, tmp_path,
                                                       prepared_texts):
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.components.train import TrainConfig, run_train

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.keras", "metadata.json"):
        shutil.copy(trained_text_model[0] / name, bare / name)
    with pytest.raises(ModelLoadError, match="text model without its tokenizer.*vocab.txt"):
        load_trained(bare)
    with pytest.raises(ConfigError, match=r"fine-tuned on text with the tokenizer it was "
                                          r"trained with, vocab.txt and tokenizer.json"):
        run_train(TrainConfig(data_dir=prepared_texts, output_dir=tmp_path / "out",
                              model=str(bare / "model.keras"), precision="float32"))
    assert not (tmp_path / "out" / "metadata.json").exists()


@pytest.mark.slow  # fine-tunes the module's model for a few steps
def test_a_keras_text_model_is_fine_tuned_with_its_own_tokenizer(trained_text_model, tmp_path,
                                                                 prepared_texts):
    from ampflow.components.train import TrainConfig, run_train

    source = trained_text_model[0]
    result = run_train(TrainConfig(  # the default sequence length: the model's own wins
        data_dir=prepared_texts, output_dir=tmp_path / "tuned",
        model=str(source / "model.keras"), precision="float32", epochs=1, steps_per_epoch=3,
        learning_rate=1e-4))
    meta = result.metadata
    assert meta["input_shape"] == [SEQ] and meta["model"]["kind"] == "file"
    assert meta["precision"]["policy"] == "float32"  # rebuilt under another policy
    assert meta["tokenizer"]["source"].startswith("reused")
    assert (tmp_path / "tuned" / "vocab.txt").read_bytes() == (source / "vocab.txt").read_bytes()
    assert meta["final_metrics"]["val_accuracy"] > 0.6


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-sequence-length", "0", "--max-sequence-length must be an integer between 1 and "
                                   "4096. Received: --max-sequence-length=0"),
    ("--vocabulary-size", "2", "--vocabulary-size must be an integer >= 3. Received: "
                               "--vocabulary-size=2"),
])
def test_a_bad_text_setting_is_one_line_exit_2(flag, value, message, tmp_path, capsys):
    from ampflow.cli import main

    code = main(["train", "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "out"),
                 "--model", "bert_tiny", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"ampflow train: error: {message}"], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    ({"image_size": 32}, r"image_size is for image data, and .* holds text"),
    ({"augment": True}, r"augment is for image data"),
    ({"batch_size": "auto"}, r"batch_size is for image data.*pass a number"),
])
def test_image_options_on_text_are_one_line(prepared_texts, tmp_path, overrides, message):
    from ampflow.components.train import TrainConfig, run_train

    with pytest.raises(ConfigError, match=message):
        run_train(TrainConfig(data_dir=prepared_texts, output_dir=tmp_path / "out",
                              model="bert_tiny", **overrides))
    assert not (tmp_path / "out").exists()


def test_an_image_model_on_text_is_one_line(prepared_texts, tmp_path):
    from ampflow.components.train import TrainConfig, run_train

    with pytest.raises(ConfigError, match=r"model 'small_cnn' is an image model \(it takes "
                                          r"pixels\), and this dataset holds text.*bert_tiny"):
        run_train(TrainConfig(data_dir=prepared_texts, output_dir=tmp_path / "out",
                              model="small_cnn", precision="float32"))
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_text_options_on_images_and_a_text_model_on_images_are_one_line(prepared_digits,
                                                                        tmp_path, capsys):
    from ampflow.cli import main
    from ampflow.components.train import TrainConfig, run_train

    with pytest.raises(ConfigError, match=r"max_sequence_length is for text data, and .* "
                                          r"holds image data"):
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "out",
                              max_sequence_length=64))
    with pytest.raises(ConfigError, match=r"text_padding is for text data, and .* holds image "
                                          r"data: leave it out\. Received: "
                                          r"text_padding=max_length"):
        run_train(TrainConfig(data_dir=prepared_digits, output_dir=tmp_path / "out",
                              text_padding="max_length"))
    code = main(["train", "--data-dir", str(prepared_digits), "--output-dir",
                 str(tmp_path / "out"), "--model", "bert_tiny", "--precision", "float32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "model 'bert_tiny' is a text model" in err[0] and "small_cnn" in err[0]
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_the_kfp_component_takes_the_text_settings_with_train_defaults():
    import inspect

    from ampflow.components.train.component import train
    from ampflow.components.train.config import TrainConfig

    parameters = inspect.signature(train).parameters
    for name in ("max_sequence_length", "vocabulary_size"):
        assert parameters[name].default == TrainConfig.__dataclass_fields__[name].default, name


@pytest.mark.slow  # scores the module's model and its float32 twin
def test_evaluate_scores_a_text_model_on_its_own_tokenizers_ids(trained_text_model,
                                                               prepared_texts, prepared_digits,
                                                               tmp_path):
    from ampflow.components.evaluate_parity import EvaluateConfig, run_evaluate

    model_dir = trained_text_model[0]
    result = run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=prepared_texts,
                                         output_dir=tmp_path / "eval"))
    metrics = result.metrics
    assert metrics["num_examples"] == 3 * TEST_PER_CLASS
    # the test split through the published tokenizer: the training run's own test accuracy
    expected = _metadata(model_dir)["final_metrics"]["val_accuracy"]
    assert abs(metrics["amp_accuracy"] - expected) <= 1 / metrics["num_examples"] + 1e-9
    assert metrics["argmax_agreement"] >= 0.95 and metrics["amp_nonfinite_logits"] == 0
    assert result.passed and (tmp_path / "eval" / "verdict.json").is_file()
    with pytest.raises(ConfigError, match=r"model_dir must hold a model for the dataset in "
                                          r"data_dir, which holds image data.*trained on text"):
        run_evaluate(EvaluateConfig(model_dir=model_dir, data_dir=prepared_digits,
                                    output_dir=tmp_path / "eval2"))
    assert not (tmp_path / "eval2").exists()


def test_the_default_learning_rate_is_the_model_kinds_own(tmp_path):
    """bert_tiny at the CNNs' 3e-3 stays at the majority class on real text: the encoders' own
    default (text_models.py) is what an unset --learning-rate gives them; the CNNs and a user's
    builder or .keras file keep 3e-3; a rate given is kept; 0 is still refused."""
    from ampflow.components.train.config import DEFAULT_LEARNING_RATE, TrainConfig
    from ampflow.modeling.text_models import BERT_SHAPES, ENCODER_LEARNING_RATE

    def rate(model: str, **given) -> float:
        return TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "o", model=model,
                           **given).learning_rate

    assert ENCODER_LEARNING_RATE < DEFAULT_LEARNING_RATE
    for name in BERT_SHAPES:
        assert rate(name) == ENCODER_LEARNING_RATE, name
    for model in ("small_cnn", "my_models.text:build", str(tmp_path / "m.keras")):
        assert rate(model) == DEFAULT_LEARNING_RATE, model
    assert rate("bert_tiny", learning_rate=2e-5) == 2e-5
    with pytest.raises(ConfigError, match="learning_rate must be > 0"):
        rate("bert_tiny", learning_rate=0.0)
