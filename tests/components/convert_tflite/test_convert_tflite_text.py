"""TFLite variants of a text model (issue 39 point 5): token ids in, the vocabulary beside.

The SavedModel is the real export of bert_tiny trained by `ampflow train` under mixed_float16
(tests/tiny_text_model.py, made once per test run for every test that needs it). The
conversion runs once per module with the default variants, and every one passes its gate
(full_int8 too, since issue 46). Every variant is then loaded in the pip LiteRT interpreter
(the runtime an app ships) and fed ids made with the shipped vocab.txt, and compared with the
SavedModel served on the raw sentences.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_text_model import export_text_model

from ampflow.errors import ConfigError


@pytest.fixture(scope="module")
def text_savedmodel(tmp_path_factory):
    """(prepared text dir, the version run_export published; shared with export's tests)."""
    data_dir, _, version_dir = export_text_model(tmp_path_factory)
    return data_dir, version_dir


@pytest.fixture(scope="module")
def text_conversion(tmp_path_factory, text_savedmodel):
    """(output dir, report.json, the exit code of `ampflow convert` with its defaults)."""
    from ampflow.cli import main

    data_dir, version_dir = text_savedmodel
    out = tmp_path_factory.mktemp("text-tflite") / "tflite"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["convert", "--saved-model-dir", str(version_dir), "--data-dir",
                     str(data_dir), "--output-dir", str(out), "--latency-runs", "5",
                     "--warmup-runs", "1"])
    return out, json.loads((out / "report.json").read_text()), code


def _litert_outputs(path: Path, ids: np.ndarray) -> dict:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    runner = interpreter.get_signature_runner("token_ids")
    rows = [runner(input_ids=ids[i:i + 1]) for i in range(len(ids))]  # one sentence each
    return {key: np.concatenate([r[key] for r in rows]) for key in rows[0]}


@pytest.mark.slow  # trains, exports and converts bert_tiny (the module's one run)
def test_float_and_dynamic_range_variants_agree_in_litert_on_shipped_vocabulary_ids(
        text_conversion, text_savedmodel):
    import tensorflow as tf

    from ampflow.data import load_texts
    from ampflow.modeling.tokenizer import load_tokenizer

    out, report, _ = text_conversion
    data_dir, version_dir = text_savedmodel
    for name in ("vocab.txt", "tokenizer.json"):  # the vocabulary ships beside the models
        assert (out / name).read_bytes() == (version_dir / "assets" / name).read_bytes()
    texts, labels = load_texts(data_dir, "test")
    ids = np.asarray(load_tokenizer(out).tokenize(tf.constant(texts)), np.int32)
    served = tf.saved_model.load(str(version_dir)).signatures["serving_default"](
        text=tf.constant(texts))
    served_ids = served["class_ids"].numpy()
    for variant in ("float32", "float16", "dynamic_range"):
        entry = report["variants"][variant]
        assert entry["passed"], (variant, entry["checks"])
        lite = _litert_outputs(out / f"{variant}.tflite", ids)
        agreement = float(np.mean(lite["class_ids"] == served_ids))
        assert agreement >= {"float32": 0.999, "float16": 0.995, "dynamic_range": 0.98}[variant]
        assert abs(agreement - entry["agreement"]) <= 1 / len(texts)  # what the report says
        meta = json.loads((out / f"{variant}.json").read_text())
        assert meta["signature_key"] == "token_ids" and meta["modality"] == "text"
        assert meta["inputs"]["input_ids"]["dtype"] == "int32"
        assert meta["inputs"]["input_ids"]["shape"] == [-1, 16]
        assert meta["tokenizer"]["vocabulary_file"] == "vocab.txt"
    float32 = _litert_outputs(out / "float32.tflite", ids)
    np.testing.assert_allclose(float32["probabilities"], served["probabilities"].numpy(),
                               atol=1e-4)
    assert np.mean(served_ids == labels) > 0.7  # a model that learnt, not chance (1/3)


@pytest.mark.slow
def test_full_int8_is_calibrated_on_training_sentences_and_passes_its_gate_in_both_runtimes(
        text_conversion):
    """Issue 46: full_int8 of a built-in text model passes the default gate, LiteRT's included.

    Before, its attention scores shared one int8 scale with the -1e9 mask (every score
    quantized to 0), its mean pooling divided by a quantized token count (int8 DIV refused
    some sentences: 65 % agreement) and the edge check asked LiteRT for tf.lite's very
    probabilities, which int8 kernels do not promise. Now: no DIV op, every sentence runs,
    LiteRT's own answers pass the gate, and the runtimes' largest difference is reported.
    """
    from ai_edge_litert.interpreter import Interpreter

    out, report, exit_code = text_conversion
    entry = report["variants"]["full_int8"]
    meta = json.loads((out / "full_int8.json").read_text())
    assert meta["quantization"]["representative_dataset"]["split"] == "train"
    assert entry["tensor_dtypes"].get("int8", 0) > 0
    interpreter = Interpreter(model_path=str(out / "full_int8.tflite"))
    interpreter.get_signature_runner("token_ids")
    assert "DIV" not in {op["op_name"] for op in interpreter._get_ops_details()}
    assert entry["failed_examples"] == 0
    assert entry["passed"], entry["checks"]
    assert exit_code == 0 and report["passed"]  # `ampflow convert` with its defaults
    edge = entry["edge"]
    assert edge["status"] == "ran" and edge["rule"] == "gate"
    gated = {c["name"]: c for c in entry["checks"]}
    assert gated["edge_agreement"]["threshold"] == gated["agreement"]["threshold"] == 0.97
    assert gated["edge_agreement"]["value"] == edge["agreement"] >= 0.97
    assert "edge_max_abs_diff" not in gated and edge["max_abs_diff"] >= 0.0  # reported
    (row,) = [line for line in (out / "report.md").read_text().splitlines()
              if line.startswith("| full_int8 |")]
    assert f"agreement {edge['agreement']:.4f}, max diff" in row and "same (" not in row


@pytest.mark.slow
def test_a_text_savedmodel_with_image_data_is_one_line(text_savedmodel, prepared_digits,
                                                       tmp_path):
    from ampflow.components.convert_tflite.config import ConvertConfig
    from ampflow.components.convert_tflite.step import run_convert

    _, version_dir = text_savedmodel
    with pytest.raises(ConfigError, match=r"data_dir must hold the data of the SavedModel "
                                          r"\(text\). Received: image data"):
        run_convert(ConvertConfig(saved_model_dir=version_dir, data_dir=prepared_digits,
                                  output_dir=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_token_ids_without_a_quantization_scale_are_cast_not_quantized():
    from ampflow.components.convert_tflite.checks import quantize_input

    ids = np.array([[2, 17, 1, 0]], np.int64)
    fed = quantize_input(ids, {"dtype": np.int32, "quantization": (0.0, 0)})
    assert fed.dtype == np.int32 and fed.tolist() == [[2, 17, 1, 0]]  # was x / 0: garbage


def test_convert_runs_each_example_alone_when_a_batch_fails_and_counts_the_failures():
    """A variant whose kernel refuses some inputs: the others are measured, the rest counted."""
    from ampflow.components.convert_tflite.step import _predict_each_that_runs

    class Refusing:  # a runner that fails on any batch holding an odd first id
        def predict(self, batch, batch_size, desc=None):
            if (batch[:, 0] % 2).any():
                raise RuntimeError("div.cc:242 data[i] != 0 was not true.\nmore")
            probs = np.tile([[0.25, 0.75]], (len(batch), 1)).astype(np.float32)
            return {"probabilities": probs, "class_ids": probs.argmax(-1)}

    ids = np.array([[2, 0], [3, 0], [4, 0], [5, 0]], np.int32)
    out, failures = _predict_each_that_runs(Refusing(), ids, 4, "check")
    assert failures == {"failed_examples": 2,
                        "first_error": "div.cc:242 data[i] != 0 was not true."}
    assert out["ran"].tolist() == [True, False, True, False]
    assert out["class_ids"].tolist() == [1, -1, 1, -1]
    assert np.isnan(out["probabilities"][1]).all()


@pytest.mark.slow
def test_a_text_savedmodel_without_its_export_json_is_still_read_as_text(text_savedmodel,
                                                                         tmp_path):
    import shutil

    from ampflow.components.convert_tflite.modalities import savedmodel_modality
    from ampflow.data.modalities import TEXT

    _, version_dir = text_savedmodel
    copy = tmp_path / "1"
    shutil.copytree(version_dir, copy)
    (copy / "ampflow_export.json").unlink()
    assert savedmodel_modality(version_dir) is TEXT and savedmodel_modality(copy) is TEXT
