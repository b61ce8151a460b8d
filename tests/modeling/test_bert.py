"""The Keras BERT encoder loaded from a Hugging Face checkpoint: every weight, BERT's outputs.

(a) every variable equals its checkpoint tensor bit for bit (all of them, counted), float32
    variables under the mixed policies too; the variable → tensor table is this file's own,
    from the variables' paths, not the loader's;
(b) the outputs equal a small float64 NumPy BERT written here from the formulas (Hugging Face's
    `BertModel`: post-LN, erf GELU, additive padding mask, tanh pooler over [CLS]) within a
    tolerance derived from the format's unit roundoff;
(c) a bad checkpoint is one line naming the file, through `load_hf_bert` too.
"""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from hf_bert_files import BAD_DIRECTORIES, VOCABULARY, write_hf_bert
from numpy_bert import numpy_bert, tolerance

from ampflow.errors import ModelConfigError
from ampflow.modeling.bert import load_hf_bert

LAYERS, HIDDEN, HEADS, INTERMEDIATE, POSITIONS = 2, 64, 4, 128, 32
PAD, UNK, CLS, SEP = 0, 1, 2, 3
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert_tiny")
    tensors = write_hf_bert(directory, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                            intermediate=INTERMEDIATE, positions=POSITIONS, prefix="bert.")
    return directory, tensors


def _hf_name(path: str) -> tuple[str, bool]:
    """A variable's path → (its Hugging Face tensor name, transposed?): this test's own table."""
    rules = [
        (r"^embeddings/(\w+_embeddings)/embeddings$", r"embeddings.\1.weight"),
        (r"^embeddings/layer_norm/", "embeddings.LayerNorm/"),
        (r"^layer_(\d+)/attention/(query|key|value)/", r"encoder.layer.\1.attention.self.\2/"),
        (r"^layer_(\d+)/attention_output/", r"encoder.layer.\1.attention.output.dense/"),
        (r"^layer_(\d+)/attention_layer_norm/", r"encoder.layer.\1.attention.output.LayerNorm/"),
        (r"^layer_(\d+)/intermediate/", r"encoder.layer.\1.intermediate.dense/"),
        (r"^layer_(\d+)/output/", r"encoder.layer.\1.output.dense/"),
        (r"^layer_(\d+)/output_layer_norm/", r"encoder.layer.\1.output.LayerNorm/"),
        (r"^pooler/", "pooler.dense/"),
    ]
    for pattern, replacement in rules:
        path = re.sub(pattern, replacement, path)
    base, _, leaf = path.rpartition("/")
    if not base:
        return path, False
    return f"{base}.{ {'kernel': 'weight', 'gamma': 'weight', 'beta': 'bias'}.get(leaf, leaf)}", \
        leaf == "kernel"


@pytest.mark.parametrize("policy", POLICIES)
def test_every_variable_is_its_checkpoint_tensor_bit_for_bit(checkpoint_dir, policy):
    directory, written = checkpoint_dir
    keras.mixed_precision.set_global_policy(policy)
    encoder, checkpoint = load_hf_bert(directory)
    assert len(encoder.weights) == len(written) == 5 + 16 * LAYERS + 2 == 39
    seen = set()
    for variable in encoder.weights:
        name, transposed = _hf_name(variable.path)
        assert variable.dtype == "float32", variable.path
        value = variable.numpy()
        want = written[name].T if transposed else written[name]
        assert value.shape == want.shape, variable.path
        np.testing.assert_array_equal(value.view(np.uint32), want.view(np.uint32),
                                      err_msg=variable.path)
        seen.add(name)
    assert seen == set(written)
    assert checkpoint.tensors.keys() == written.keys()


# ---- (b) BERT's outputs: a float64 NumPy BERT from the formulas ----------------------------

def _batches():
    rng = np.random.default_rng(3)
    words = lambda n: rng.integers(5, len(VOCABULARY), n).tolist()  # noqa: E731
    pair = [CLS, *words(4), SEP, *words(3), SEP]
    padded = np.array([pair + [PAD] * 3,
                       [CLS, *words(2), SEP] + [PAD] * 9,
                       [CLS, UNK, *words(10), SEP]], np.int32)
    padded_types = np.array([[0] * 6 + [1] * 4 + [0] * 3, [0] * 13, [0] * 13], np.int32)
    full = np.array([[CLS, *words(POSITIONS - 2), SEP]], np.int32)  # the whole position table
    alone = np.array([[CLS, PAD, PAD, PAD], [CLS, SEP, PAD, PAD]], np.int32)
    return [(padded, padded_types), (full, (np.arange(POSITIONS) >= 16)[None].astype(np.int32)),
            (alone, np.zeros_like(alone))]


@pytest.mark.parametrize("policy", POLICIES)
def test_outputs_equal_a_numpy_bert_within_the_formats_tolerance(checkpoint_dir, policy):
    directory, written = checkpoint_dir
    keras.mixed_precision.set_global_policy(policy)
    encoder, _ = load_hf_bert(directory)
    for token_ids, segment_ids in _batches():
        want_sequence, want_pooled = numpy_bert(written, token_ids, segment_ids, heads=HEADS)
        got = encoder({"token_ids": token_ids, "segment_ids": segment_ids})
        for key, want in (("sequence_output", want_sequence), ("pooled_output", want_pooled)):
            value = np.asarray(keras.ops.convert_to_numpy(got[key]), np.float64)
            assert value.shape == want.shape
            allowed = tolerance(policy, want, INTERMEDIATE)
            error = np.abs(value - want).max()
            assert error <= allowed, (key, token_ids.shape, error, allowed)


def test_the_configs_layer_norm_eps_is_the_one_used(tmp_path):
    written = write_hf_bert(tmp_path, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                            intermediate=INTERMEDIATE, positions=POSITIONS, layer_norm_eps=0.05)
    keras.mixed_precision.set_global_policy("float32")
    encoder, _ = load_hf_bert(tmp_path)
    token_ids, segment_ids = _batches()[0]
    got = np.asarray(encoder({"token_ids": token_ids, "segment_ids": segment_ids})
                     ["sequence_output"], np.float64)
    want, _ = numpy_bert(written, token_ids, segment_ids, heads=HEADS, eps=0.05)
    allowed = tolerance("float32", want, INTERMEDIATE)
    assert np.abs(got - want).max() <= allowed
    default_eps, _ = numpy_bert(written, token_ids, segment_ids, heads=HEADS)
    assert np.abs(got - default_eps).max() > 100 * allowed


def test_gelu_new_is_the_tanh_form_and_gelu_the_erf_form(tmp_path):
    """`hidden_act: gelu_new` (keras-hub's and Google's BERT code) is computed, not refused."""
    written = write_hf_bert(tmp_path, layers=LAYERS, hidden=HIDDEN, heads=HEADS,
                            intermediate=INTERMEDIATE, positions=POSITIONS, hidden_act="gelu_new")
    keras.mixed_precision.set_global_policy("float32")
    encoder, _ = load_hf_bert(tmp_path)
    token_ids, segment_ids = _batches()[0]
    got = np.asarray(encoder({"token_ids": token_ids, "segment_ids": segment_ids})
                     ["sequence_output"], np.float64)
    want, _ = numpy_bert(written, token_ids, segment_ids, heads=HEADS, approximate_gelu=True)
    allowed = tolerance("float32", want, INTERMEDIATE)
    assert np.abs(got - want).max() <= allowed
    erf_form, _ = numpy_bert(written, token_ids, segment_ids, heads=HEADS)
    assert np.abs(got - erf_form).max() > 10 * allowed


@pytest.mark.parametrize("policy", ("float32", "mixed_float16"))
def test_a_keras_file_of_the_encoder_loads_with_the_same_weights_and_outputs(
        checkpoint_dir, tmp_path, policy):
    directory, _ = checkpoint_dir
    keras.mixed_precision.set_global_policy(policy)
    encoder, _ = load_hf_bert(directory)
    encoder.save(tmp_path / "encoder.keras")
    loaded = keras.models.load_model(tmp_path / "encoder.keras")
    assert [w.path for w in loaded.weights] == [w.path for w in encoder.weights]
    for mine, theirs in zip(encoder.weights, loaded.weights, strict=True):
        assert theirs.dtype == "float32"
        np.testing.assert_array_equal(theirs.numpy(), mine.numpy())
    token_ids, segment_ids = _batches()[0]
    inputs = {"token_ids": token_ids, "segment_ids": segment_ids}
    for key, value in encoder(inputs).items():
        np.testing.assert_array_equal(np.asarray(loaded(inputs)[key]), np.asarray(value))
    assert loaded.get_layer("layer_1").attention.compute_dtype == encoder.compute_dtype


def test_padding_changes_no_tokens_output(checkpoint_dir):
    directory, _ = checkpoint_dir
    keras.mixed_precision.set_global_policy("float32")
    encoder, _ = load_hf_bert(directory)
    ids = np.array([[CLS, 20, 30, 40, SEP]], np.int32)
    padded = np.pad(ids, ((0, 0), (0, 6)))
    short = encoder({"token_ids": ids, "segment_ids": np.zeros_like(ids)})
    long = encoder({"token_ids": padded, "segment_ids": np.zeros_like(padded)})
    np.testing.assert_allclose(long["sequence_output"][:, :5], short["sequence_output"],
                               atol=1e-5)
    np.testing.assert_allclose(long["pooled_output"], short["pooled_output"], atol=1e-5)


@pytest.mark.parametrize("policy", ("mixed_bfloat16", "mixed_float16"))
def test_softmax_and_layer_norm_run_in_float32_the_products_in_half(checkpoint_dir, policy):
    """Read from the traced graph: the AMP rules of the text models, kept by BERT's layers."""
    directory, _ = checkpoint_dir
    keras.mixed_precision.set_global_policy(policy)
    encoder, _ = load_hf_bert(directory)
    spec = tf.TensorSpec([2, 8], tf.int32)
    graph = tf.function(lambda ids, types: encoder(
        {"token_ids": ids, "segment_ids": types}, training=True)).get_concrete_function(
        spec, spec).graph
    dtypes = {}
    for op in graph.get_operations():
        dtypes.setdefault(op.type, []).append(op.outputs[0].dtype.name if op.outputs else None)
    half = "float16" if policy == "mixed_float16" else "bfloat16"
    assert dtypes["Softmax"] == ["float32"] * LAYERS
    assert set(dtypes["Rsqrt"]) == {"float32"} and len(dtypes["Rsqrt"]) == 1 + 2 * LAYERS
    assert set(dtypes["BatchMatMulV2"]) == {half}  # scores and context
    assert set(dtypes["MatMul"]) == {half}  # every projection, the pooler


@pytest.mark.parametrize("policy", ("mixed_bfloat16", "mixed_float16"))
def test_a_classifier_on_the_encoder_passes_the_amp_check_with_no_warning(checkpoint_dir,
                                                                           policy):
    """The train step's AMP pre-flight (train/preflight/rules.py) on [CLS] → 3 classes."""
    from ampflow.components.train.preflight.rules import check_amp

    directory, _ = checkpoint_dir
    keras.mixed_precision.set_global_policy(policy)
    encoder, _ = load_hf_bert(directory)
    ids = keras.Input((16,), dtype="int32", name="token_ids")
    types = keras.layers.Lambda(keras.ops.zeros_like, name="segment_ids")(ids)
    pooled = encoder({"token_ids": ids, "segment_ids": types})["pooled_output"]
    logits = keras.layers.Dense(3, dtype="float32", name="logits")(pooled)
    report = check_amp(keras.Model(ids, logits), policy, input_shape=(16,), num_classes=3)
    assert report.ok and report.warnings == [], report.warnings
    assert {f.kind for f in report.findings} <= {"float32_by_design"}


# ---- (c) a bad checkpoint -------------------------------------------------------------------

@pytest.mark.parametrize("case", ["no config.json", "no vocab.txt", "no weights",
                                  "another model_type", "vocabulary one short",
                                  "truncated weights", "a missing tensor", "a misshapen tensor"])
def test_a_bad_checkpoint_is_one_line_naming_the_file(tmp_path, case):
    file, spoil, expected = BAD_DIRECTORIES[case]
    write_hf_bert(tmp_path)
    spoil(tmp_path)
    with pytest.raises(ModelConfigError) as caught:
        load_hf_bert(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and expected in message
    assert message.startswith(str(tmp_path / file))
