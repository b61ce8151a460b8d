"""Converter failures and bad inputs come back as one explained error, not an MLIR dump."""

import numpy as np
import pytest

from ampflow.components.convert_tflite import ConvertConfig, convert_variant, run_convert
from ampflow.components.convert_tflite.explain import explain_conversion_error
from ampflow.components.convert_tflite.step import resolve_saved_model_dir
from ampflow.errors import ConfigError, ConversionError, ModelLoadError


@pytest.mark.slow
def test_convert_variant_mixed_float16_export_raises_explained_flex_error(mixed_savedmodel):
    with pytest.raises(ConversionError) as info:
        convert_variant(mixed_savedmodel, "float32")
    message = str(info.value)
    assert "ERROR_NEEDS_FLEX_OPS" in message and "Conv2D" in message
    assert "computes in float16" in message and "float32 twin" in message
    assert "loc(" not in message and len(message) < 1500
    assert info.value.__cause__ is not None  # the converter's own error stays chained


@pytest.mark.slow
def test_run_convert_mixed_graph_with_contract_signature_raises_explained_error(
        mixed_trained, prepared_digits, tmp_path):
    from tflite_helpers import save_contract_savedmodel

    version_dir = tmp_path / "digits" / "1"
    version_dir.mkdir(parents=True)
    save_contract_savedmodel(mixed_trained[0], version_dir, [str(d) for d in range(10)])
    config = ConvertConfig(saved_model_dir=version_dir, data_dir=prepared_digits,
                           output_dir=tmp_path / "out", variants=("float16",))
    with pytest.raises(ConversionError, match=r"'float16' variant failed \[ERROR_NEEDS_FLEX_OPS\]"
                                              r".*Fix: export from the float32 twin"):
        run_convert(config)
    assert not (tmp_path / "out").exists()  # nothing half-written is published


@pytest.mark.slow
def test_convert_variant_representative_wrong_shape_raises_clear_error(float32_savedmodel):
    wrong = np.zeros((4, 9, 9, 1), np.float32)
    with pytest.raises(ConfigError, match=r"must have the model input's shape \[8, 8, 1\].*"
                                          r"Received: images of shape \[9, 9, 1\]"):
        convert_variant(float32_savedmodel, "full_int8", representative=wrong)


def test_convert_variant_representative_missing_or_empty_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="needs a representative dataset"):
        convert_variant(tmp_path, "full_int8", representative=None, input_shape=(8, 8, 1))
    with pytest.raises(ConfigError, match=r"at least one image\. Received: shape=\[0, 8, 8, 1\]"):
        convert_variant(tmp_path, "full_int8", representative=np.zeros((0, 8, 8, 1)),
                        input_shape=(8, 8, 1))


def test_convert_variant_missing_savedmodel_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"must hold a SavedModel with the signature "
                                             r"'serving_default'\. Received: saved_model_dir="):
        convert_variant(tmp_path / "nope", "float32")


def test_explain_unsupported_float32_op_suggests_select_tf_ops():
    text = ("Could not translate MLIR to FlatBuffer.<unknown>:0: error: loc(callsite(fused"
            "[\"Erf:\", \"model/gelu/Erf@__inference\"])): 'tf.Erf' op is neither a custom op "
            "nor a flex op\nsee current operation: %3 = \"tf.Erf\"(%2) : (tensor<?x64xf32>) -> "
            "tensor<?x64xf32>\nError code: ERROR_NEEDS_FLEX_OPS")
    error = explain_conversion_error(RuntimeError(text), variant="float32", source="m/1")
    message = str(error)
    assert message.startswith("TFLite conversion of m/1 to the 'float32' variant failed "
                              "[ERROR_NEEDS_FLEX_OPS]: op(s) Erf could not be converted")
    assert "SELECT_TF_OPS" in message and "float16" not in message


def test_explain_unknown_failure_keeps_first_line_without_mlir_locations():
    text = "<unknown>:0: error: loc(\"x\"): something odd happened\n<unknown>:0: note: loc(y)"
    message = str(explain_conversion_error(ValueError(text), variant="float16", source="m"))
    assert "something odd happened" in message and "loc(" not in message


def test_resolve_saved_model_dir_picks_highest_version_or_raises(tmp_path):
    for version in ("1", "2", "10"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "saved_model.pb").write_bytes(b"")
    (tmp_path / "11").mkdir()  # no saved_model.pb: an incomplete version is not taken
    assert resolve_saved_model_dir(tmp_path) == tmp_path / "10"
    assert resolve_saved_model_dir(tmp_path / "2") == tmp_path / "2"
    with pytest.raises(ModelLoadError, match="saved_model_dir must be a SavedModel version dir"):
        resolve_saved_model_dir(tmp_path / "11")
