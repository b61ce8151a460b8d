"""The built-in BERT-style text models and a user's text model (builder or .keras file).

Shapes are checked against Google's BERT miniatures and BERT-base (L/H/A, feed-forward 4H);
models take int32 token ids [batch, seq] with 0 = padding and end in ampflow's float32 head.
The user's builder is a module written into a scratch dir (text_builders.py), imported through
--model-path as train does.
"""

import numpy as np
import pytest
import text_builders

from ampflow.errors import ConfigError
from ampflow.modeling.models import (
    image_model_names,
    make_model,
    make_text_model,
    model_names,
    text_model_names,
)
from ampflow.modeling.text_models import BERT_SHAPES
from ampflow.modeling.user_model import HEAD_LAYERS

SEQ, VOCAB, CLASSES = 12, 40, 3


def _ids(rng, batch=4, length=SEQ):
    ids = rng.integers(2, VOCAB, size=(batch, length)).astype("int32")
    ids[:, length // 2:] = 0  # padded halves
    return ids


@pytest.fixture
def user_dir(tmp_path):
    return text_builders.write_module(tmp_path)


def test_the_text_models_are_registered_beside_the_image_models():
    assert text_model_names() == ("bert_base", "bert_mini", "bert_small", "bert_tiny")
    assert set(model_names()) == set(image_model_names()) | set(text_model_names())
    assert "small_cnn" in image_model_names()
    assert not set(image_model_names()) & set(text_model_names())


@pytest.mark.parametrize(("name", "layers", "hidden", "heads"), [
    ("bert_tiny", 2, 128, 2), ("bert_mini", 4, 256, 4), ("bert_small", 4, 512, 8),
    ("bert_base", 12, 768, 12)])
def test_the_shapes_are_bert_miniatures_and_bert_base(name, layers, hidden, heads):
    shape = BERT_SHAPES[name]
    assert (shape.layers, shape.hidden, shape.heads, shape.intermediate) == (
        layers, hidden, heads, 4 * hidden)


def test_bert_tiny_is_built_in_its_shape_and_ends_in_the_float32_head():
    model = make_text_model("bert_tiny", SEQ, VOCAB, CLASSES, policy="mixed_float16").model
    attention = [layer for layer in model.layers if type(layer).__name__.endswith("Attention")]
    intermediate = [layer for layer in model.layers if layer.name.endswith("_intermediate")]
    assert len(attention) == 2 and all(a.num_heads == 2 and a.key_dim == 64 for a in attention)
    assert [d.units for d in intermediate] == [512, 512]
    # any length up to the position table's: a batch cut to its length bucket runs as it is
    assert model.inputs[0].dtype == "int32" and tuple(model.inputs[0].shape) == (None, None)
    assert model.get_layer("embeddings").position_embedding.input_dim == SEQ
    assert [layer.name for layer in model.layers[-2:]] == list(HEAD_LAYERS)
    assert model.output.dtype == "float32" and tuple(model.output.shape) == (None, CLASSES)
    # BERT-Tiny: 4.4M parameters with its 30,522-word vocabulary and 512 positions; here a
    # 40-word vocabulary and 12 positions leave the encoder's own weights
    encoder = sum(int(np.prod(w.shape)) for w in model.trainable_weights
                  if "embedding" not in w.path)
    assert 390_000 < encoder < 430_000


def test_padding_changes_nothing_and_an_all_padding_text_is_finite():
    """The mask comes from the ids: what follows a text's last token does not count."""
    rng = np.random.default_rng(0)
    model = make_text_model("bert_tiny", SEQ, VOCAB, CLASSES, policy="float32").model
    ids = _ids(rng)
    longer = np.concatenate([ids, np.zeros((4, 4), "int32")], axis=1)
    wider = make_text_model("bert_tiny", SEQ + 4, VOCAB, CLASSES, policy="float32").model
    wider.get_layer("embeddings").token_embedding.set_weights(
        model.get_layer("embeddings").token_embedding.get_weights())
    position = model.get_layer("embeddings").position_embedding.get_weights()[0]
    wider.get_layer("embeddings").position_embedding.set_weights(
        [np.concatenate([position, np.zeros((4, position.shape[1]), "float32")])])
    for layer in model.layers:
        if layer.name != "embeddings" and layer.weights:
            wider.get_layer(layer.name).set_weights(layer.get_weights())
    np.testing.assert_allclose(wider(longer).numpy(), model(ids).numpy(), atol=1e-5)
    empty = model(np.zeros((2, SEQ), "int32")).numpy()
    assert np.isfinite(empty).all()


def test_an_image_model_on_text_and_a_text_model_on_images_are_one_line():
    with pytest.raises(ConfigError, match="'small_cnn' is an image model .* holds text: choose "
                                          "one of bert_base, bert_mini"):
        make_text_model("small_cnn", SEQ, VOCAB, CLASSES)
    with pytest.raises(ConfigError, match="'bert_tiny' is a text model .* holds images"):
        make_model("bert_tiny", (8, 8, 1), CLASSES)
    with pytest.raises(ConfigError, match="sequence_length must be between 1 and 4096"):
        make_text_model("bert_tiny", 0, VOCAB, CLASSES)


def test_a_user_text_builder_is_called_with_the_text_contract(user_dir):
    built = make_text_model(f"{text_builders.MODULE}:keras_attention_with_dropout", SEQ, VOCAB,
                            CLASSES, policy="mixed_float16", model_path=user_dir)
    assert built.model.output.dtype == "float32"
    assert any("recomputed in float32" in fix for fix in built.fixes)
    assert built.model(_ids(np.random.default_rng(1))).shape == (4, CLASSES)
    sequential = make_text_model(f"{text_builders.MODULE}:sequential", SEQ, VOCAB, CLASSES,
                                 model_path=user_dir).model
    assert sequential.inputs[0].dtype == "int32"


@pytest.mark.parametrize(("builder", "message"), [
    ("image_signature", r"must accept \(sequence_length, vocabulary_size, num_classes\)\. "
                        r"Received: a function with signature \(input_shape, num_classes\)"),
    ("float_input", r"must take int32 token ids \[None, 12\] .*Received: a model whose input "
                    r"is \[None, 12\] float32"),
    ("wrong_length", r"must take int32 token ids \[None, 12\].*Received: a model whose input "
                     r"is \[None, 13\] int32"),
])
def test_a_text_builder_breaking_the_contract_is_one_line(user_dir, builder, message):
    with pytest.raises(ConfigError, match=message) as e:
        make_text_model(f"{text_builders.MODULE}:{builder}", SEQ, VOCAB, CLASSES,
                        model_path=user_dir)
    assert "\n" not in str(e.value)


@pytest.mark.slow  # trains (2 epochs of bert_tiny on 16 texts) and rebuilds twice: ~25 s
def test_a_trained_text_model_is_fine_tuned_from_its_keras_file(tmp_path):
    """A bert_tiny trained a few steps here, saved, then given as --model: rebuilt under the
    policy with its weights, so the float32 rebuild predicts exactly what was saved."""
    import keras

    rng = np.random.default_rng(2)
    model = make_text_model("bert_tiny", SEQ, VOCAB, CLASSES, policy="float32").model
    ids, labels = _ids(rng, batch=16), rng.integers(0, CLASSES, 16)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    model.fit(ids, labels, epochs=2, batch_size=8, verbose=0)
    path = tmp_path / "bert_tiny_trained.keras"
    model.save(path)

    again = make_text_model(str(path), SEQ, VOCAB, CLASSES, policy="float32")
    assert again.spec.kind == "file" and any("rebuilt every layer" in f for f in again.fixes)
    np.testing.assert_allclose(again.model(ids).numpy(), model(ids).numpy(), atol=1e-6)
    half = make_text_model(str(path), SEQ, VOCAB, CLASSES, policy="mixed_bfloat16").model
    attention = half.get_layer("encoder_0_attention")
    assert attention.compute_dtype == "bfloat16" and half.output.dtype == "float32"
    np.testing.assert_allclose(half(ids).numpy(), model(ids).numpy(), atol=0.05)


def _padded_ids(rng, batch=8, length=SEQ):
    """Token ids of every length from 1 to `length`, and one all-padding row."""
    ids = rng.integers(2, VOCAB, size=(batch, length)).astype("int32")
    lengths = np.r_[0, np.linspace(1, length, batch - 1).astype(int)]
    ids[np.arange(length)[None, :] >= lengths[:, None]] = 0
    return ids


def test_the_int8_friendly_masks_compute_what_keras_masking_computes():
    """The penalty added before the softmax (not -1e9 selected) and the pooling's softmax
    weights (not a division) change nothing a float32 model computes: Keras's own layer with
    the same weights, and the mean over the tokens, to float32 rounding."""
    import keras

    from ampflow.modeling.text_layers import (
        AttentionMaskFromIds,
        Float32SoftmaxAttention,
        MaskedMeanPooling,
    )

    rng = np.random.default_rng(3)
    ids = _padded_ids(rng)
    x = keras.ops.convert_to_tensor(rng.normal(size=(*ids.shape, 16)).astype("float32") * 4)
    mask = AttentionMaskFromIds()(ids)
    ours, stock = Float32SoftmaxAttention(2, 8), keras.layers.MultiHeadAttention(2, 8)
    ours(x, x, attention_mask=mask)
    stock(x, x, attention_mask=mask)
    stock.set_weights(ours.get_weights())
    for layer in (ours, stock):  # the scores and probabilities themselves, not only the output
        layer.output_and_scores = layer(x, x, attention_mask=mask, return_attention_scores=True)
    for got, want in zip(ours.output_and_scores, stock.output_and_scores, strict=True):
        np.testing.assert_allclose(got.numpy()[1:], want.numpy()[1:], atol=1e-6)
    pooled = MaskedMeanPooling()([x, ids]).numpy()
    tokens = (ids != 0)[..., None]
    mean = (x.numpy() * tokens).sum(1) / np.maximum(tokens.sum(1), 1)
    np.testing.assert_allclose(pooled, mean, atol=1e-6)
    assert not pooled[0].any()  # an all-padding text pools to zeros


@pytest.mark.slow  # converts bert_tiny to full_int8 with TensorFlow's calibrator: ~15 s
def test_bert_tiny_in_full_int8_keeps_its_attention_scores_and_divides_nothing():
    """Issue 46: measured on bert_tiny, full_int8 gave every attention score the -1e9 mask's
    int8 scale (3.9e6: every score quantized to 0, attention uniform over all positions) and
    its mean pooling an int8 DIV (which refuses a divisor whose int8 value is 0). Each softmax
    input must now span the scores and the penalty, not the mask's 1e9."""
    import tensorflow as tf

    from ampflow.modeling.text_layers import MASK_PENALTY

    model = make_text_model("bert_tiny", SEQ, VOCAB, CLASSES, policy="float32").model
    ids = _padded_ids(np.random.default_rng(4), batch=32)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.representative_dataset = lambda: ([ids[i:i + 1]] for i in range(len(ids)))
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    ops = interpreter._get_ops_details()
    tensors = {t["index"]: t for t in interpreter.get_tensor_details()}
    assert "DIV" not in {op["op_name"] for op in ops}
    softmax_inputs = [tensors[op["inputs"][0]] for op in ops if op["op_name"] == "SOFTMAX"]
    assert len(softmax_inputs) == 4  # 2 attentions, the pooling, the head
    for tensor in softmax_inputs:
        scale, _ = tensor["quantization"]
        assert 0 < scale * 255 < 2 * MASK_PENALTY, tensor["name"]  # the range it spans
