"""Text batches that follow their texts' length (issue 50): the models, the input, the choice.

The built-in encoders give the same outputs on a batch cut to its length bucket as on the same
texts padded to the cap (the mask makes padding irrelevant); the training and evaluation input
groups texts by bucket after a seeded shuffle, never cutting a token; and `text_padding_of`
picks buckets only for a model whose input takes any length.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
import text_builders

from ampflow.components.train.config import TrainConfig
from ampflow.components.train.run.build import text_padding_of
from ampflow.data.text_input import make_bucketed_text_pipeline
from ampflow.errors import ConfigError
from ampflow.modeling.length_buckets import bucket_lengths, token_counts, trim_to_bucket
from ampflow.modeling.models import make_text_model
from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

CAP, VOCAB, CLASSES = 128, 60, 3
BUCKETS = bucket_lengths(CAP)
WORDS = [f"w{i}" for i in range(40)]
HALF_ATOL = 1e-2  # probabilities: a few bfloat16 roundings (8-bit significand) apart at most


def _ids(lengths, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), CAP), np.int32)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(2, VOCAB, size=length)
    return ids


@pytest.mark.parametrize("name", [
    "bert_tiny", "bert_mini",
    pytest.param("bert_small", marks=pytest.mark.slow)])  # 4 × 512 wide: ~10 s on a CPU
def test_an_encoder_answers_a_bucketed_batch_as_the_cap_padded_one(name):
    keras.utils.set_random_seed(0)
    model = make_text_model(name, CAP, VOCAB, CLASSES, policy="float32").model
    for lengths in ([3, 9, 14], [20, 31, 2], [40, 1, 64], [0, 5, 7]):
        ids = _ids(lengths, seed=len(lengths) + sum(lengths))
        short = trim_to_bucket(ids, BUCKETS)
        assert short.shape[1] < CAP
        np.testing.assert_allclose(model(short, training=False).numpy(),
                                   model(ids, training=False).numpy(), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_under_a_mixed_policy_a_bucketed_batch_gives_the_same_classes(policy):
    """Half-precision sums over fewer padded keys may round differently: same classes, and
    probabilities within the half format's rounding."""
    keras.utils.set_random_seed(1)
    model = make_text_model("bert_tiny", CAP, VOCAB, CLASSES, policy=policy).model
    ids = _ids([3, 9, 14, 20, 31, 2, 40, 1])
    short, full = (model(x, training=False).numpy() for x in (trim_to_bucket(ids, BUCKETS), ids))
    np.testing.assert_allclose(short, full, atol=HALF_ATOL)
    top2 = np.sort(full, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * HALF_ATOL  # an untrained model's near ties may flip
    np.testing.assert_array_equal(short.argmax(-1)[clear], full.argmax(-1)[clear])


def _texts(count, seed):
    """Texts of 1 to 90 words: every bucket of a 128 cap gets some."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 91)))) for _ in range(count)]


@pytest.fixture(scope="module")
def tokenizer():
    return fit_tokenizer(_texts(50, 0), TokenizerConfig(max_sequence_length=CAP))


def _pipeline(tokenizer, texts, *, training, seed=0, batch_size=8):
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.constant(texts), tf.range(len(texts), dtype=tf.int64)))  # label = the text's number
    return make_bucketed_text_pipeline(ds, tokenize=tokenizer.tokenize, batch_size=batch_size,
                                       buckets=BUCKETS, training=training, seed=seed)


def test_evaluation_batches_are_buckets_holding_each_text_whole(tokenizer):
    texts = _texts(150, 1)
    full = tokenizer.tokenize(texts).numpy()
    batches = list(_pipeline(tokenizer, texts, training=False).as_numpy_iterator())
    numbers = np.concatenate([labels for _, labels in batches])
    assert sorted(numbers.tolist()) == list(range(len(texts)))  # every text, once
    for ids, labels in batches:
        assert ids.shape[1] in BUCKETS
        assert (token_counts(full[labels]).numpy() <= ids.shape[1]).all()
        np.testing.assert_array_equal(ids, full[labels][:, :ids.shape[1]])
    assert {ids.shape[1] for ids, _ in batches} == set(BUCKETS)


def test_training_batches_are_full_shuffled_by_the_seed_and_repeat(tokenizer):
    texts = _texts(60, 2)
    def first(seed, count=20):
        return [labels.tolist() for _, labels in
                _pipeline(tokenizer, texts, training=True, seed=seed).take(count)
                .as_numpy_iterator()]
    once = first(0)
    assert len(once) == 20  # more than 60 texts' worth: the input repeats
    assert all(len(labels) == 8 for labels in once)
    assert once == first(0) and once != first(1)
    assert sorted(once[0]) != once[0] or sorted(once[1]) != once[1]  # not in read order


def _config(tmp_path, **overrides):
    return TrainConfig(data_dir=tmp_path, output_dir=tmp_path / "out", **overrides)


def test_the_built_in_encoders_get_buckets_and_max_length_keeps_the_cap(tmp_path, tokenizer):
    padding = text_padding_of(_config(tmp_path, model="bert_tiny"), tokenizer)
    assert padding["mode"] == "buckets" and padding["lengths"] == [16, 32, 64, 128]
    padding = text_padding_of(_config(tmp_path, model="bert_tiny", text_padding="max_length"),
                              tokenizer)
    assert padding["mode"] == "max_length" and padding["lengths"] == [128]


def test_a_builder_gets_max_length_and_a_keras_file_what_its_input_takes(tmp_path, tokenizer):
    user_dir = text_builders.write_module(tmp_path)
    builder = _config(tmp_path, model=f"{text_builders.MODULE}:sequential",
                      model_path=str(user_dir))
    padding = text_padding_of(builder, tokenizer)
    assert padding["mode"] == "max_length" and "length buckets need an input of any length" \
        in padding["reason"]
    ours = make_text_model("bert_tiny", CAP, VOCAB, CLASSES, policy="float32").model
    ours.save(tmp_path / "ours.keras")
    fixed = keras.Sequential([keras.Input((CAP,), dtype="int32"),
                              keras.layers.Embedding(VOCAB, 4), keras.layers.Flatten(),
                              keras.layers.Dense(CLASSES)])
    fixed.save(tmp_path / "fixed.keras")
    (tmp_path / "broken.keras").write_bytes(b"not a zip")
    modes = {name: text_padding_of(_config(tmp_path, model=str(tmp_path / f"{name}.keras")),
                                   tokenizer)["mode"] for name in ("ours", "fixed", "broken")}
    assert modes == {"ours": "buckets", "fixed": "max_length", "broken": "max_length"}


def test_a_bad_text_padding_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"text_padding must be one of .*buckets.*max_length"
                                          r".*Received: text_padding='longest'"):
        _config(tmp_path, model="bert_tiny", text_padding="longest")
