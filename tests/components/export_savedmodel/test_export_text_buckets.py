"""The exported text signatures pad a request to its longest text's length bucket (issue 50).

Real SavedModels written by `save_text_servable` and loaded back as TF Serving loads them: a
probe model whose answer is the width of the ids it was given shows what a request is padded
to; a seeded bert_tiny at a 128 cap shows the answers are the cap-padded ones (the export's own
parity gate, `check_text_export_parity`, passes on them).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from ampflow.artifacts.signature_names import TEXT_INPUT, TOKEN_IDS_INPUT, TOKEN_IDS_SIGNATURE
from ampflow.components.export_savedmodel.text_parity import check_text_export_parity
from ampflow.components.export_savedmodel.text_signatures import (
    length_buckets_of,
    save_text_servable,
    text_example,
)
from ampflow.modeling.models import make_text_model
from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer
from ampflow.serving.model_format import CLASSIFY_SIGNATURE, DEFAULT_SIGNATURE

CAP = 128
WORDS = [f"w{i}" for i in range(30)]


def _text(words: int, seed: int = 0) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=words))


@pytest.fixture(scope="module")
def tokenizer():
    return fit_tokenizer([_text(100, s) for s in range(5)],
                         TokenizerConfig(max_sequence_length=CAP))


@keras.saving.register_keras_serializable(package="ampflow_tests")
class WidthProbe(keras.layers.Layer):
    """[p, 1 - p] for every row, p = the ids' width / the cap: what the model was given."""

    def call(self, token_ids):
        width = keras.ops.cast(keras.ops.shape(token_ids)[1], "float32") / CAP
        column = keras.ops.ones_like(keras.ops.cast(token_ids[:, :1], "float32")) * width
        return keras.ops.concatenate([column, 1.0 - column], axis=-1)


def _probe(length):
    ids = keras.Input((length,), dtype="int32")
    return keras.Model(ids, WidthProbe()(ids))


def _saved(model, tokenizer, directory):
    save_text_servable(model, tokenizer, ["short", "long"], directory)
    return tf.saved_model.load(str(directory))


def _widths(loaded, texts):
    utf8 = tf.constant([t.encode("utf-8") for t in texts])
    predicted = loaded.signatures[DEFAULT_SIGNATURE](**{TEXT_INPUT: utf8})["probabilities"]
    examples = tf.constant([text_example(t).SerializeToString() for t in texts])
    scores = loaded.signatures[CLASSIFY_SIGNATURE](inputs=examples)["scores"]
    return (np.round(predicted.numpy()[:, 0] * CAP).astype(int).tolist(),
            np.round(scores.numpy()[:, 0] * CAP).astype(int).tolist())


def test_a_request_is_padded_to_its_longest_texts_bucket_not_the_cap(tokenizer, tmp_path):
    loaded = _saved(_probe(None), tokenizer, tmp_path / "1")
    for texts, width in ((["w1 w2"], 16), ([_text(20), "w3"], 32), ([_text(40), _text(3)], 64),
                         ([_text(90)], 128), ([_text(300)], 128), ([""], 16)):
        assert _widths(loaded, texts) == ([width] * len(texts), [width] * len(texts)), texts
    ids = tokenizer.tokenize(["w1 w2"])  # token_ids keeps its fixed shape (TFLite's)
    fixed = loaded.signatures[TOKEN_IDS_SIGNATURE](**{TOKEN_IDS_INPUT: ids})["probabilities"]
    assert fixed.numpy()[0, 0] == 1.0


def test_a_model_of_a_fixed_length_is_served_at_the_cap(tokenizer, tmp_path):
    loaded = _saved(_probe(CAP), tokenizer, tmp_path / "1")
    assert _widths(loaded, ["w1 w2", _text(40)]) == ([128, 128], [128, 128])
    assert length_buckets_of(_probe(CAP), CAP) is None
    assert length_buckets_of(_probe(None), CAP) == [16, 32, 64, 128]


@pytest.mark.slow  # saves and checks a real bert_tiny SavedModel: ~25 s on a shared 2-core host
def test_bert_tiny_answers_a_bucketed_request_as_the_cap_padded_one(tokenizer, tmp_path):
    """32 texts of 1 to 60 words in one request: same classes, probabilities within 1e-6 of
    the token_ids signature at the cap and of the Keras model on cap-padded ids."""
    keras.utils.set_random_seed(3)
    model = make_text_model("bert_tiny", CAP, tokenizer.vocabulary_size, 2,
                            policy="float32").model
    loaded = _saved(model, tokenizer, tmp_path / "1")
    rng = np.random.default_rng(4)
    texts = [_text(int(rng.integers(1, 61)), seed=i) for i in range(32)]
    report = check_text_export_parity(loaded, model, model, tokenizer, texts, ["short", "long"],
                                      atol=1e-6, rtol=0.0)
    assert report.passed and report.text_vs_token_ids_class_ids_equal
    assert report.text_vs_token_ids_max_abs_diff <= 1e-6 and report.max_abs_diff <= 1e-6
