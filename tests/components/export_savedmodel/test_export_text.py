"""Export of a text model (issue 39 point 5): raw text in, the tokenizer in the graph.

The model is real: bert_tiny trained by `ampflow train` under mixed_float16 on a prepared text
folder and exported behind a passed verdict, once per test run (tests/tiny_text_model.py: the
train, convert, release and deploy tests reuse both). The SavedModel
is then called as TF Serving calls it: `serving_default` on raw strings, `classify` on
tf.Examples with a `text` feature, `token_ids` on ids, and the warm-up file replayed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tiny_text_model import export_text_model, prepare_and_train

from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.artifacts.versions import list_versions
from ampflow.components.export_savedmodel import ExportConfig, run_export
from ampflow.components.export_savedmodel.text_signatures import (
    expected_text_signatures,
    graph_op_types,
    non_core_ops,
    text_example,
)
from ampflow.errors import ConfigError, ExportError, GateFailedError


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """(prepared text dir, trained bert_tiny model dir)."""
    return prepare_and_train(tmp_path_factory)


@dataclass(frozen=True)
class _Exported:
    version_dir: Path
    metadata: dict


@pytest.fixture(scope="module")
def text_export(tmp_path_factory):
    """The version run_export published behind a passed verdict (shared with convert's tests)."""
    *_, version_dir = export_text_model(tmp_path_factory)
    return _Exported(version_dir, json.loads((version_dir / "ampflow_export.json").read_text()))


@pytest.fixture(scope="module")
def in_process(text_run):
    """The trained model and tokenizer as a later step loads them, and the test sentences."""
    from ampflow.artifacts.model_dir import load_trained
    from ampflow.data import load_texts

    data_dir, model_dir = text_run
    texts, labels = load_texts(data_dir, "test")
    return load_trained(model_dir), texts, labels


def _utf8(texts):
    return tf.constant([t.encode("utf-8") for t in texts], tf.string)


def test_non_core_ops_names_an_op_tensorflow_does_not_link():
    # tensorflow-text's case folding and WordPiece ops are loaded from its own library: a stock
    # TF Serving refuses a graph holding them ("Op type not registered")
    assert non_core_ops({"StringLower", "LookupTableFindV2", "CaseFoldUTF8",
                         "WordpieceTokenizeWithOffsets"}) == ["CaseFoldUTF8",
                                                              "WordpieceTokenizeWithOffsets"]


@pytest.mark.slow  # trains bert_tiny and exports it (the module's one run)
def test_text_export_follows_the_contract_and_ships_the_vocabulary(text_export, text_run):
    from ampflow.modeling.tokenizer import load_tokenizer

    _, model_dir = text_run
    version_dir, meta = text_export.version_dir, text_export.metadata
    assert meta["modality"] == "text" and meta["input"]["name"] == TEXT_INPUT
    assert meta["signatures"] == expected_text_signatures(16, 3)  # exactly the three
    assert (version_dir / "assets" / "labels.txt").read_text().split() == meta["labels"]
    assert meta["labels"] == ["gloomy", "happy", "weird"]
    for name in ("vocab.txt", "tokenizer.json"):  # the model dir's files, byte for byte
        assert (version_dir / "assets" / name).read_bytes() == (model_dir / name).read_bytes()
    assert load_tokenizer(version_dir / "assets").vocabulary == load_tokenizer(
        model_dir).vocabulary
    parity = meta["parity"]
    assert parity["passed"] and parity["num_texts"] == 90
    assert parity["text_vs_token_ids_max_abs_diff"] <= 1e-6
    assert meta["half_precision_nodes"] == 0 and meta["source"]["trained_policy"] == (
        "mixed_float16")
    assert meta["tokenizer"]["max_sequence_length"] == 16
    # what `ampflow serve` bounds a request's tokens with: the buckets, the tokenizer's words
    from ampflow.serving.models.token_cost import TokenCost, read_token_cost

    assert meta["input"]["length_buckets"] == [16]
    assert read_token_cost(version_dir) == TokenCost(16, (16,), bytes_per_token=2)
    assert meta["gate"]["forced"] is False  # exported behind the passed verdict


@pytest.mark.slow
def test_the_export_commands_summary_counts_a_text_models_parity_in_texts(text_export):
    """`ampflow export` of a text model published its version, then ended in a KeyError
    traceback: its summary read the image parity's `num_images`."""
    from ampflow.components.export_savedmodel.cli import _summary
    from ampflow.components.export_savedmodel.step import ExportResult

    result = ExportResult(text_export.version_dir, 1, "reviews", text_export.metadata)
    assert _summary(result)["export_parity"].endswith(" on 90 texts")


@pytest.mark.slow
def test_the_graph_runs_core_tensorflow_ops_only(text_export):
    ops = graph_op_types(text_export.version_dir)
    # the tokenizer is in the graph: lower-casing, punctuation regex, split, vocabulary lookup
    assert {"StringLower", "StaticRegexReplace", "StringSplitV2", "LookupTableFindV2"} <= ops
    assert non_core_ops(ops) == []
    assert text_export.metadata["graph_ops"]["types"] == sorted(ops)


@pytest.mark.slow
def test_serving_default_serves_raw_text_as_the_model_answers_in_process(text_export,
                                                                         in_process):
    from ampflow.modeling.twin import build_float32_twin

    trained, texts, labels = in_process
    loaded = tf.saved_model.load(str(text_export.version_dir))
    sentences = texts + ["", "Quite SUPERB!!", "a word never seen: zebra", "x" * 5000]
    out = loaded.signatures["serving_default"](**{TEXT_INPUT: _utf8(sentences)})
    # in process: the tokenizer beside model.keras, then the float32 twin that was exported
    twin = build_float32_twin(trained.model, trained.metadata)
    keras_probs = np.asarray(twin(trained.inputs(tf.constant(sentences)), training=False))
    np.testing.assert_allclose(out["probabilities"].numpy(), keras_probs, atol=1e-5)
    assert out["class_ids"].numpy().tolist() == keras_probs.argmax(-1).tolist()
    # the model learnt: far above chance (1/3) on the real test split
    assert np.mean(out["class_ids"].numpy()[:len(texts)] == labels) > 0.7


@pytest.mark.slow
def test_classify_takes_tf_examples_with_a_text_feature(text_export, in_process):
    _, texts, _ = in_process
    loaded = tf.saved_model.load(str(text_export.version_dir))
    serialized = tf.constant([text_example(t).SerializeToString() for t in texts[:8]])
    result = loaded.signatures["classify"](inputs=serialized)
    served = loaded.signatures["serving_default"](**{TEXT_INPUT: _utf8(texts[:8])})
    np.testing.assert_allclose(result["scores"].numpy(), served["probabilities"].numpy(),
                               atol=1e-6)
    assert result["classes"].numpy()[0].tolist() == [b"gloomy", b"happy", b"weird"]


@pytest.mark.slow
def test_token_ids_answer_as_text_and_warmup_is_real_test_text(text_export, in_process):
    from ampflow.components.export_savedmodel.warmup import replay_warmup_records
    from ampflow.serving.model_format import read_warmup_records

    trained, texts, _ = in_process
    loaded = tf.saved_model.load(str(text_export.version_dir))
    ids = trained.tokenizer.tokenize(tf.constant(texts[:8]))
    by_ids = loaded.signatures[TOKEN_IDS_SIGNATURE](**{TOKEN_IDS_INPUT: ids})
    by_text = loaded.signatures["serving_default"](**{TEXT_INPUT: _utf8(texts[:8])})
    np.testing.assert_allclose(by_ids["probabilities"].numpy(),
                               by_text["probabilities"].numpy(), atol=1e-6)
    logs = read_warmup_records(text_export.version_dir)
    kinds = [(e.WhichOneof("log_type"), e.predict_log.request.model_spec.signature_name)
             for e in logs]
    assert kinds == [("predict_log", "serving_default")] * 4 + [
        ("predict_log", TOKEN_IDS_SIGNATURE), ("classify_log", "")]
    sent = [tf.make_ndarray(e.predict_log.request.inputs[TEXT_INPUT])[0].decode("utf-8")
            for e in logs[:4]]
    assert sent == texts[:4]  # real sentences of the test split, not made-up ones
    assert replay_warmup_records(text_export.version_dir, loaded) == 6


@pytest.mark.slow
def test_a_graph_tokenizer_other_than_the_models_is_not_published(text_run, tmp_path,
                                                                  monkeypatch):
    """The graph tokenizes with a vocabulary in another order: the same words, other ids."""
    from ampflow.components.export_savedmodel import text_export as module
    from ampflow.modeling.tokenizer import TextTokenizer, _vectorizer

    def reordered(tokenizer):
        words = tokenizer.vocabulary[2:]
        vocabulary = ["", "[UNK]"] + words[1:] + words[:1]  # the top word moved to the end
        return TextTokenizer(_vectorizer(tokenizer.config, vocabulary), tokenizer.config)

    monkeypatch.setattr(module, "graph_tokenizer", reordered)
    data_dir, model_dir = text_run
    with pytest.raises((GateFailedError, ExportError)) as caught:
        run_export(ExportConfig(model_dir=model_dir, data_dir=data_dir, export_base=tmp_path,
                                force=True, num_warmup_records=1))
    assert "vocabulary" in str(caught.value) or "tokenizer" in str(caught.value)
    assert list_versions(tmp_path / "ampflow") == []  # nothing published


@pytest.mark.slow
def test_parity_fails_when_the_served_graph_tokenizes_differently(text_run, in_process,
                                                                  tmp_path):
    """check_text_export_parity alone: a SavedModel whose graph keeps 8 tokens, not 16."""
    from ampflow.components.export_savedmodel.text_parity import check_text_export_parity
    from ampflow.components.export_savedmodel.text_signatures import save_text_servable
    from ampflow.modeling.tokenizer import TextTokenizer, TokenizerConfig, _vectorizer
    from ampflow.modeling.twin import build_float32_twin

    trained, texts, _ = in_process
    right = trained.tokenizer
    short = TokenizerConfig(max_sequence_length=8, vocabulary_size=right.config.vocabulary_size)
    cut = TextTokenizer(_vectorizer(short, right.vocabulary), short)

    class Padded:  # the short ids padded back to 16: the signature's shape, other content
        sequence_length, config, layer = right.sequence_length, right.config, cut.layer

        def tokenize(self, batch):
            return tf.pad(cut.tokenize(batch), [[0, 0], [0, 8]])

        def save(self, directory):
            right.save(directory)

    twin = build_float32_twin(trained.model, trained.metadata)
    save_text_servable(twin, Padded(), ["gloomy", "happy", "weird"], tmp_path / "sm")
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    long_texts = [t for t in texts if len(t.split()) > 8][:20] or texts[:20]
    with pytest.raises(GateFailedError, match="serving_default − token_ids"):
        check_text_export_parity(loaded, twin, trained.model, right, long_texts,
                                 ["gloomy", "happy", "weird"], atol=1e-4, rtol=1e-5)


@pytest.mark.slow
def test_a_text_model_with_image_data_is_one_line(text_run, prepared_digits, tmp_path):
    _, model_dir = text_run
    with pytest.raises(ConfigError, match="data_dir must hold the data the model was trained "
                                          "on \\(text\\). Received: image data"):
        run_export(ExportConfig(model_dir=model_dir, data_dir=prepared_digits,
                                export_base=tmp_path, force=True))
