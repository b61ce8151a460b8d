"""AMP done right for attention: dtypes read from the traced graph, and the AMP check's rules.

- Keras 3.15's MultiHeadAttention runs its softmax in float16 under mixed_float16 on its
  explicit path (attention dropout): a fact of Keras that the first test pins, so that a Keras
  that changes it is noticed. ampflow's Float32SoftmaxAttention computes it in float32 there.
- The built-in text models keep every rule (softmax of the scores, LayerNorm, head in float32)
  and pass the check with no warning under both mixed policies.
- A user's hand-written attention masking with -1e9 under mixed_float16 is named, with why; the
  same model under mixed_bfloat16 (which holds -1e9) is not.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
import text_builders

from ampflow.components.train.preflight.rules import text_amp_check_of
from ampflow.modeling.models import make_text_model

SEQ, VOCAB, CLASSES = 16, 50, 3
MIXED = ("mixed_float16", "mixed_bfloat16")


def _graph_ops(model, op_type: str) -> list[tuple[str, str]]:
    """(name, output dtype) of every `op_type` op in the traced training forward pass."""
    graph = tf.function(lambda ids: model(ids, training=True)).get_concrete_function(
        tf.TensorSpec([2, model.inputs[0].shape[1]], tf.int32)).graph
    return [(op.name, op.outputs[0].dtype.name) for op in graph.get_operations()
            if op.type == op_type]


def _user(tmp_path, builder: str, policy: str):
    import keras

    keras.mixed_precision.set_global_policy(policy)
    return text_amp_check_of(f"{text_builders.MODULE}:{builder}", SEQ, VOCAB, CLASSES,
                             model_path=text_builders.write_module(tmp_path))


@pytest.mark.parametrize("policy", MIXED)
def test_keras_attention_with_dropout_runs_its_softmax_in_half_precision(policy):
    """What Keras does (multi_head_attention.py builds Softmax(dtype=self.dtype_policy))."""
    import keras

    from ampflow.modeling.text_layers import Float32SoftmaxAttention

    half = "float16" if policy == "mixed_float16" else "bfloat16"
    keras.mixed_precision.set_global_policy(policy)
    ids = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, 16)(ids)
    stock = keras.layers.MultiHeadAttention(2, 8, dropout=0.1, name="stock")(x, x)
    ours = Float32SoftmaxAttention(2, 8, dropout=0.1, name="ours")(x, x)
    model = keras.Model(ids, [stock, ours])

    softmax = dict(_graph_ops(model, "Softmax"))
    assert [d for n, d in softmax.items() if "/stock" in n] == [half]
    assert [d for n, d in softmax.items() if "/ours" in n] == ["float32"]
    assert model.get_layer("ours").compute_dtype == half  # projections stay half precision


@pytest.mark.slow  # traces bert_tiny's train step per policy
@pytest.mark.parametrize("policy", MIXED)
def test_bert_tiny_keeps_the_rules_and_passes_the_amp_check(policy):
    """Softmax of the scores, LayerNorm and the head in float32, read from the graph; and the
    check says so, with no warning."""
    import keras

    keras.mixed_precision.set_global_policy(policy)
    report = text_amp_check_of("bert_tiny", SEQ, VOCAB, CLASSES)
    assert report.ok and report.warnings == [], report.table()
    assert {f.kind for f in report.findings} <= {"float32_by_design"}
    by_design = " ".join(f.message for f in report.findings)
    assert "softmax_float32" in by_design and "attention scores in float32" in by_design
    assert "LayerNormalization" in by_design

    model, half = report.model, "float16" if policy == "mixed_float16" else "bfloat16"
    softmax = _graph_ops(model, "Softmax")
    attention = [d for n, d in softmax if "_attention" in n]
    assert attention == ["float32", "float32"]  # one per encoder block
    assert [d for n, d in softmax if "probabilities" in n] == ["float32"]
    # LayerNormalization's statistics: the Rsqrt of the variance, in float32 (5 norms)
    rsqrt = [d for n, d in _graph_ops(model, "Rsqrt") if "norm" in n]
    assert rsqrt == ["float32"] * 5
    assert model.get_layer("encoder_0_intermediate").compute_dtype == half
    assert model.get_layer("logits").compute_dtype == "float32"


@pytest.fixture
def prepared_texts(tmp_path):
    """A real prepared text dataset (prepare-data --text-folder): 3 classes of short texts."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    for label, words in {"pos": "great fun", "neg": "dull boring", "odd": "strange"}.items():
        folder = tmp_path / "texts" / label
        folder.mkdir(parents=True)
        for i in range(6):
            (folder / f"{i}.txt").write_text(f"a {words} film, number {i}")
    return run_prepare_data(PrepareDataConfig(text_folder=tmp_path / "texts",
                                              output_dir=tmp_path / "prepared")).output_dir


def test_check_model_names_a_minus_1e9_mask_under_float16_with_the_reason(
        prepared_texts, tmp_path, capsys):
    from ampflow.cli import main

    code = main(["check-model", "--data-dir", str(prepared_texts), "--model",
                 f"{text_builders.MODULE}:hand_attention", "--model-path",
                 text_builders.write_module(tmp_path), "--precision", "mixed_float16",
                 "--output-dir", str(tmp_path / "report")])
    out, err = capsys.readouterr()
    assert code == 2
    assert "ampflow check-model: error: model 'usertext:hand_attention' cannot train under " \
           "mixed_float16: layer 'hand_attention' (HandAttention) holds the constant -inf in " \
           "float16 (float16's largest value is 65504: a mask value such as -1e9" in err
    assert "0 × inf is NaN wherever the mask keeps a score" in err
    assert "hand_attention" in out and "overflowing_constant" in out  # the pre-flight table
    report = json.loads((tmp_path / "report" / "amp_report.json").read_text())
    named = {f["kind"]: f for f in report["findings"] if f["layer"] == "hand_attention"}
    assert named["overflowing_constant"]["severity"] == "error"
    assert "softmax of its attention scores in float16" in \
        named["float16_attention_softmax"]["message"]


def test_check_model_passes_the_built_in_bert_tiny_under_float16(prepared_texts, tmp_path,
                                                                capsys):
    """What names the user's -1e9 mask passes the built-in encoder: exit 0, no warning."""
    from ampflow.cli import main

    code = main(["check-model", "--data-dir", str(prepared_texts), "--model", "bert_tiny",
                 "--precision", "mixed_float16", "--output-dir", str(tmp_path / "report")])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "report" / "amp_report.json").read_text())
    assert not {"error", "warning"} & {f["severity"] for f in report["findings"]}, report
    assert "float32_by_design" in out


def test_a_cast_constant_is_named_with_the_value_written(tmp_path):
    report = _user(tmp_path, "hand_attention_cast_mask", "mixed_float16")
    found = [f for f in report.findings if f.kind == "overflowing_constant"]
    assert [f.layer for f in found] == ["hand_attention"] and not report.ok
    assert "casts the constant -1e+09 to float16" in found[0].message
    assert found[0].detail["value"] == -1e9


def test_what_the_check_names_is_what_happens(tmp_path):
    """The -1e9 model's outputs under mixed_float16 are NaN on a padded batch (finite once
    the mask value fits float16), so the refusal is not a false alarm."""
    import keras

    ids = np.array([[5, 6, 7] + [0] * (SEQ - 3)], "int32")
    keras.mixed_precision.set_global_policy("mixed_float16")
    outputs = {}
    for builder in ("hand_attention", "hand_attention_safe_mask"):
        built = make_text_model(f"{text_builders.MODULE}:{builder}", SEQ, VOCAB, CLASSES,
                                model_path=text_builders.write_module(tmp_path))
        outputs[builder] = built.model(ids).numpy()
    assert np.isnan(outputs["hand_attention"]).all()
    assert np.isfinite(outputs["hand_attention_safe_mask"]).all()


def test_a_mask_value_that_fits_and_bfloat16_are_not_named(tmp_path):
    safe = _user(tmp_path, "hand_attention_safe_mask", "mixed_float16")
    assert "overflowing_constant" not in safe.kinds() and safe.ok
    assert "float16_attention_softmax" in safe.kinds()  # its softmax is still float16
    bf16 = _user(tmp_path, "hand_attention", "mixed_bfloat16")  # bfloat16 holds -1e9
    assert not {"overflowing_constant", "float16_attention_softmax"} & bf16.kinds()
    assert bf16.ok


def test_keras_attention_with_dropout_is_named_with_the_fix(tmp_path):
    report = _user(tmp_path, "keras_attention_with_dropout", "mixed_float16")
    found = [f for f in report.findings if f.kind == "float16_attention_softmax"]
    assert [f.layer for f in found] == ["mha"]
    assert "dropout=0" in found[0].message and "Float32SoftmaxAttention" in found[0].message


def test_a_hand_set_float32_attention_is_named_with_its_casts(tmp_path):
    report = _user(tmp_path, "hand_attention_float32", "mixed_float16")
    found = [f for f in report.findings if f.kind == "hand_set_dtype"
             and f.layer == "hand_attention"]
    assert found and found[0].detail["input_casts"] > 0
    assert "computes in float32 while the policy computes in float16" in found[0].message
    assert "overflowing_constant" not in report.kinds()  # -1e9 fits its float32 math


def test_the_fix_the_check_advises_passes_it(tmp_path):
    """A hand-written attention that casts its scores to float32 for the mask and softmax (what
    the float16_attention_softmax warning advises) is the rule kept, not a hard-coded dtype."""
    report = _user(tmp_path, "hand_attention_float32_softmax", "mixed_float16")
    assert report.ok and report.warnings == [], report.table()
    kept = [f for f in report.findings if f.layer == "hand_attention"]
    assert [f.kind for f in kept] == ["float32_by_design"]
    assert "casts its attention scores to float32 for the softmax" in kept[0].message
