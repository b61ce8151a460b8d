"""The text tokenizer (src/ampflow/modeling/tokenizer.py): Keras TextVectorization, fitted on the
training split only, giving int32 ids [batch, L] with 0 = padding, the same ids eagerly, in
tf.data.map and in a traced signature, and the same ids again from its saved vocab.txt."""

import json

import numpy as np
import pytest
import tensorflow as tf

from ampflow.errors import ConfigError
from ampflow.modeling.tokenizer import (
    OOV_ID,
    TOKENIZER_FILE,
    VOCAB_FILE,
    TokenizerConfig,
    fit_tokenizer,
    load_tokenizer,
    padding_mask,
)

TRAIN = ["the film is great, great fun!", "A dull film.", "great acting; dull plot",
         "Café crème: the best film", "the the the"]
TEST = ["a great unseenword film", ""]


@pytest.fixture(scope="module")
def tokenizer():
    return fit_tokenizer(TRAIN, TokenizerConfig(max_sequence_length=6, vocabulary_size=50))


def test_ids_are_int32_padded_with_zero_and_cut_to_the_sequence_length(tokenizer):
    ids = tokenizer(tf.constant(["the film " * 10, "great"])).numpy()
    assert ids.dtype == np.int32 and ids.shape == (2, 6)
    assert (ids[0] > 1).all()  # cut at 6 tokens, every one a known word
    assert ids[1, 0] > 1 and (ids[1, 1:] == 0).all()
    assert padding_mask(ids).numpy().tolist()[1] == [1, 0, 0, 0, 0, 0]


def test_the_vocabulary_comes_from_the_training_texts_only(tokenizer):
    vocabulary = tokenizer.vocabulary
    assert vocabulary[:2] == ["", "[UNK]"]
    assert vocabulary[2] == "the"  # most frequent first (6 times)
    assert "unseenword" not in vocabulary  # a test-split word is [UNK]
    ids = tokenizer(tf.constant(TEST)).numpy()
    assert ids[0, 2] == OOV_ID and ids[0, 1] == vocabulary.index("great")
    assert (ids[1] == 0).all()  # an empty text is all padding
    assert "café" in vocabulary and "crème" in vocabulary  # UTF-8 words are words


def test_the_vocabulary_size_caps_the_words_kept():
    small = fit_tokenizer(TRAIN, TokenizerConfig(max_sequence_length=4, vocabulary_size=4))
    assert small.vocabulary == ["", "[UNK]", "the", "great"]
    assert small.vocabulary_size == 4
    assert small(tf.constant(["dull"])).numpy()[0, 0] == OOV_ID


def test_the_same_ids_eagerly_in_tf_data_and_in_a_traced_signature(tokenizer):
    texts = TRAIN + TEST
    eager = tokenizer(tf.constant(texts)).numpy()
    per_example = np.stack(list(tf.data.Dataset.from_tensor_slices(texts)
                                .map(tokenizer.tokenize).as_numpy_iterator()))
    batched = np.concatenate(list(tf.data.Dataset.from_tensor_slices(texts).batch(3)
                                  .map(tokenizer.tokenize).as_numpy_iterator()))
    signature = tf.function(tokenizer.tokenize,
                            input_signature=[tf.TensorSpec([None], tf.string)])
    graph = signature.get_concrete_function()
    assert graph.structured_outputs.dtype == tf.int32
    assert graph.structured_outputs.shape.as_list() == [None, 6]
    assert (per_example == eager).all() and (batched == eager).all()
    assert (graph(tf.constant(texts)).numpy() == eager).all()


def test_saved_vocabulary_gives_the_same_ids(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    lines = (tmp_path / VOCAB_FILE).read_text(encoding="utf-8").split("\n")
    assert lines[:-1] == tokenizer.vocabulary and lines[-1] == ""  # line i = id i
    settings = json.loads((tmp_path / TOKENIZER_FILE).read_text())
    assert settings["max_sequence_length"] == 6 and settings["padding_id"] == 0
    again = load_tokenizer(tmp_path)
    texts = tf.constant(TRAIN + TEST)
    assert (again(texts).numpy() == tokenizer(texts).numpy()).all()
    assert again.vocabulary == tokenizer.vocabulary


def test_fits_from_a_tf_data_dataset_of_strings():
    fitted = fit_tokenizer(tf.data.Dataset.from_tensor_slices(TRAIN),
                           TokenizerConfig(max_sequence_length=3, vocabulary_size=50))
    assert fitted.vocabulary[2] == "the"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_sequence_length": 0}, "max_sequence_length must be an integer between 1 and 4096. "
                                 "Received: max_sequence_length=0"),
    ({"max_sequence_length": 5000}, "between 1 and 4096"),
    ({"max_sequence_length": 12.5}, "max_sequence_length=12.5"),
    ({"vocabulary_size": 2}, "vocabulary_size must be an integer >= 3. Received: "
                             "vocabulary_size=2"),
])
def test_bad_settings_are_one_clear_line(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as e:
        TokenizerConfig(**kwargs)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("texts", [[], ["", "  ", "?!,."]])
def test_training_texts_without_a_word_are_refused(texts):
    with pytest.raises(ConfigError, match="hold no word to build a vocabulary from"):
        fit_tokenizer(texts)


def test_one_string_is_not_a_corpus():
    with pytest.raises(ConfigError, match="not one string"):
        fit_tokenizer("the film")


def test_a_missing_or_mismatched_vocabulary_is_refused(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="holds no saved tokenizer: tokenizer.json, vocab.txt"):
        load_tokenizer(tmp_path)
    tokenizer.save(tmp_path)
    (tmp_path / VOCAB_FILE).write_text("[UNK]\nthe\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="does not match tokenizer.json"):
        load_tokenizer(tmp_path)
