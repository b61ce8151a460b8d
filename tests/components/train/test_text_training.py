"""bert_tiny learns under mixed_bfloat16 through ampflow's own train loop.

(Under mixed_float16, with dynamic loss scaling, the suite's shared text model shows it:
test_text_train.py's test_bert_tiny_learns_under_float16_at_the_encoders_default_learning_rate,
on the run tests/tiny_text_model.py makes once for every text test.)

The data is synthetic but learnable: each sentence is filler words around one keyword of its
class (3 classes, chance 1/3). The tokenizer is fitted on the training sentences only; batches
of raw strings are tokenized in the tf.data pipeline, and `TrainLoop` (loop.py: the custom step
with dynamic loss scaling under float16, as `ampflow train` runs it) trains on (token ids,
label) exactly as it trains on (images, label).
"""

import numpy as np
import pytest
import tensorflow as tf

from ampflow.components.train.run.loop import LoopConfig, Runtime, TrainLoop
from ampflow.modeling.models import make_text_model
from ampflow.modeling.text_models import ENCODER_LEARNING_RATE
from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

SEQ, BATCH, CLASSES = 24, 32, 3
KEYWORDS = (("great", "wonderful", "superb", "moving"), ("awful", "boring", "dreadful", "dull"),
            ("strange", "odd", "surreal", "weird"))
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city", "and",
          "its", "cast", "plot", "ending", "really", "quite", "with", "music", "scenes")


def _sentences(count: int, seed: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    texts, labels = [], rng.integers(0, CLASSES, count)
    for label in labels:
        words = list(rng.choice(FILLER, size=int(rng.integers(5, 15))))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(KEYWORDS[label])))
        texts.append(" ".join(words).capitalize() + ".")
    return texts, labels.astype("int64")


def _dataset(tokenizer, texts, labels, training: bool) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices((texts, labels))
    if training:
        ds = ds.shuffle(len(texts), seed=0).repeat()
    ds = ds.batch(BATCH, drop_remainder=training)
    return ds.map(lambda text, label: (tokenizer.tokenize(text), label)).prefetch(2)


@pytest.mark.slow  # trains bert_tiny (about 10-20 s on 2 cores)
def test_bert_tiny_learns_keyword_sentences_under_bfloat16(tmp_path):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    train_texts, train_labels = _sentences(384, seed=1)
    test_texts, test_labels = _sentences(192, seed=2)
    tokenizer = fit_tokenizer(train_texts, TokenizerConfig(max_sequence_length=SEQ,
                                                           vocabulary_size=64))
    model = make_text_model("bert_tiny", SEQ, tokenizer.vocabulary_size, CLASSES).model
    model.compile(optimizer=keras.optimizers.Adam(ENCODER_LEARNING_RATE),
                  loss="sparse_categorical_crossentropy")
    runtime = Runtime(tf.distribute.get_strategy(), "default", "test")
    steps = len(train_texts) // BATCH
    loop = TrainLoop(runtime, model, LoopConfig(
        epochs=4, steps_per_epoch=steps, global_batch_size=BATCH, jit_compile=False,
        loss_scaling=False, state_dir=str(tmp_path), progress=False))
    test = _dataset(tokenizer, test_texts, test_labels, training=False)
    before = loop.evaluate(test)["accuracy"]

    loop.fit(_dataset(tokenizer, train_texts, train_labels, training=True), None, [])

    after = loop.evaluate(test)
    assert after["accuracy"] > 0.8 > before + 0.2, (before, after)
    assert np.isfinite(after["loss"])
