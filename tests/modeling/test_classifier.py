"""A classifier on a pretrained BERT's pooled [CLS] output: the head in float32, the weights kept.

Under `mixed_float16` and `mixed_bfloat16` every variable, the checkpoint's and the head's,
stays float32 and the head computes in float32; the encoder's tensors are the checkpoint's bit
for bit; the model fine-tunes (a few steps move the loss down) and passes the train step's AMP
pre-flight; a sequence past the position table is one line naming config.json.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from hf_bert_files import VOCABULARY, write_hf_bert

from ampflow.errors import ConfigError, ModelConfigError
from ampflow.modeling.classifier import bert_classifier
from ampflow.modeling.fine_tuning import FineTuneOptimizerConfig, fine_tune_optimizer
from ampflow.modeling.pretrained import read_pretrained_bert

SEQUENCE, CLASSES, POSITIONS = 12, 3, 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    tensors = write_hf_bert(directory, layers=2, hidden=32, heads=2, intermediate=64,
                            positions=POSITIONS, prefix="bert.")
    return read_pretrained_bert(directory), tensors


def _batch(rng, size=8):
    ids = rng.integers(5, len(VOCABULARY), (size, SEQUENCE)).astype(np.int32)
    ids[:, 0], ids[::2, 8:] = 2, 0
    return {"token_ids": ids, "segment_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("policy", ("mixed_float16", "mixed_bfloat16"))
def test_every_variable_stays_float32_and_the_head_computes_in_float32(checkpoint, policy):
    loaded, tensors = checkpoint
    keras.mixed_precision.set_global_policy(policy)
    model = bert_classifier(loaded, CLASSES, SEQUENCE)
    assert {v.dtype for v in model.weights} == {"float32"}
    assert len(model.weights) == len(tensors) + 2  # the encoder's 39 and the logits' kernel, bias
    head = model.get_layer("logits")
    assert (head.compute_dtype, head.kernel.shape) == ("float32", (32, CLASSES))
    assert model.get_layer("probabilities").compute_dtype == "float32"
    assert model.get_layer("encoder").get_layer("layer_0").compute_dtype == policy.split("_")[1]
    output = model(_batch(np.random.default_rng(0)))
    assert output.dtype == "float32" and output.shape == (8, CLASSES)
    np.testing.assert_allclose(np.sum(output, axis=1), 1.0, rtol=1e-5)
    word = model.get_layer("encoder").get_layer("embeddings").word_embeddings.embeddings
    np.testing.assert_array_equal(word.numpy(), tensors["embeddings.word_embeddings.weight"])


@pytest.mark.slow  # 12 eager training steps per policy: 20 s each on a loaded 2-core host
@pytest.mark.parametrize("policy", ("float32", "mixed_float16", "mixed_bfloat16"))
def test_the_classifier_fine_tunes_with_adamw_and_stays_float32(checkpoint, policy):
    """Eager steps on a learnable rule lower the loss; variables stay float32 after training.

    Under mixed_float16 through Keras's LossScaleOptimizer, as `compile` would wrap it.
    """
    import tensorflow as tf

    loaded, _ = checkpoint
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = bert_classifier(loaded, CLASSES, SEQUENCE)
    inputs = _batch(np.random.default_rng(1), 32)
    labels = inputs["token_ids"][:, 1] % CLASSES  # the first word decides the class
    optimizer = fine_tune_optimizer(FineTuneOptimizerConfig(learning_rate=2e-3), 12)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    loss = keras.losses.SparseCategoricalCrossentropy()
    losses = []
    for _ in range(12):
        with tf.GradientTape() as tape:
            value = loss(labels, model(inputs, training=True))
            scaled = optimizer.scale_loss(value) if policy == "mixed_float16" else value
        optimizer.apply(tape.gradient(scaled, model.trainable_variables),
                        model.trainable_variables)
        losses.append(float(value))
    assert float(loss(labels, model(inputs))) < 0.8 * losses[0], losses
    assert {v.dtype for v in model.weights} == {"float32"}


@pytest.mark.parametrize("policy", ("mixed_bfloat16", "mixed_float16"))
def test_the_classifier_passes_the_amp_check_with_no_warning(checkpoint, policy):
    from ampflow.components.train.preflight.rules import check_amp

    loaded, _ = checkpoint
    keras.mixed_precision.set_global_policy(policy)
    model = bert_classifier(loaded, CLASSES, SEQUENCE)
    ids = keras.Input((SEQUENCE,), dtype="int32", name="token_ids")
    types = keras.layers.Lambda(keras.ops.zeros_like, name="segment_ids")(ids)
    single_input = keras.Model(ids, model({"token_ids": ids, "segment_ids": types}))
    report = check_amp(single_input, policy, input_shape=(SEQUENCE,), num_classes=CLASSES)
    assert report.ok and report.warnings == [], report.warnings


def test_a_sequence_past_the_position_table_is_one_line_naming_config_json(checkpoint):
    loaded, _ = checkpoint
    with pytest.raises(ModelConfigError) as caught:
        bert_classifier(loaded, CLASSES, POSITIONS + 1)
    message = str(caught.value)
    assert "\n" not in message and str(loaded.directory / "config.json") in message
    assert f"at most {POSITIONS}" in message and f"max_sequence_length={POSITIONS + 1}" in message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("classes,length,expected", [
    (1, SEQUENCE, "num_classes must be an integer >= 2. Received: num_classes=1"),
    (CLASSES, 1, "max_sequence_length must be an integer >= 2"),
    (True, SEQUENCE, "Received: num_classes=True")])
def test_bad_sizes_are_one_line(checkpoint, classes, length, expected):
    with pytest.raises(ConfigError, match=expected):
        bert_classifier(checkpoint[0], classes, length)
