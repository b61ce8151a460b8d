"""The export gate: a failed parity verdict blocks the export unless forced, loudly."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from verdict_helpers import write_verdict

from ampflow.artifacts.versions import list_versions
from ampflow.components.export_savedmodel import ExportConfig, run_export
from ampflow.errors import ConfigError, GateFailedError, ModelConfigError


def test_run_export_failed_verdict_refuses_without_export(failed_eval_dir, tmp_path):
    # model_dir/data_dir need not exist: the gate is checked before anything is loaded
    config = ExportConfig(model_dir=tmp_path / "model", data_dir=tmp_path / "data",
                          export_base=tmp_path / "base", eval_dir=failed_eval_dir)
    with pytest.raises(GateFailedError, match=r"parity gate failed.*argmax_agreement.*--force"):
        run_export(config)
    assert not (tmp_path / "base").exists()


def test_run_export_missing_verdict_refuses(tmp_path):
    config = ExportConfig(model_dir=tmp_path / "model", data_dir=tmp_path / "data",
                          export_base=tmp_path / "base", eval_dir=tmp_path / "eval")
    (tmp_path / "eval").mkdir()  # an eval dir without its verdict: the gate refuses
    with pytest.raises(GateFailedError, match=r"eval_dir must hold verdict.json"):
        run_export(config)
    assert not (tmp_path / "base").exists()
    # no eval dir at all: the flag names nothing, a configuration error (exit 2)
    config = dataclasses.replace(config, eval_dir=tmp_path / "no-eval")
    with pytest.raises(ModelConfigError, match=r"eval_dir must be the output dir.*no such dir"):
        run_export(config)
    assert not (tmp_path / "base").exists()


def test_run_export_malformed_verdict_refuses(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "verdict.json").write_text('{"passed": "yes"}')
    config = ExportConfig(model_dir=tmp_path / "model", data_dir=tmp_path / "data",
                          export_base=tmp_path / "base", eval_dir=tmp_path / "eval")
    with pytest.raises(GateFailedError, match=r"must hold an object with a bool 'passed'"):
        run_export(config)


@pytest.mark.slow
def test_run_export_failed_verdict_forced_exports_with_loud_warning(
        trained_model, prepared_digits, failed_mixed_eval_dir, tmp_path, caplog):
    config = ExportConfig(model_dir=trained_model("mixed_float16"), data_dir=prepared_digits,
                          export_base=tmp_path, eval_dir=failed_mixed_eval_dir, force=True,
                          num_warmup_records=2, num_parity_images=32)
    with caplog.at_level(logging.WARNING):
        result = run_export(config)
    assert result.forced and list_versions(result.model_base) == [1]
    meta = json.loads((result.version_dir / "ampflow_export.json").read_text())
    assert meta["forced"] is True
    assert meta["gate"]["verdict_passed"] is False
    assert meta["gate"]["failed_checks"][0]["name"] == "argmax_agreement"
    assert "FAILED parity gate" in meta["gate"]["warning"]
    forced_logs = [r for r in caplog.records
                   if r.levelno == logging.WARNING and "FORCED EXPORT" in r.getMessage()]
    assert len(forced_logs) == 1 and "!!!!" in forced_logs[0].getMessage()


@pytest.mark.slow
def test_run_export_verdict_of_another_model_refused_in_one_line(
        trained_model, prepared_digits, tmp_path):
    # a passed verdict, but for the float32 model: it says nothing about the mixed one
    eval_dir = write_verdict(tmp_path / "eval", True, model_dir=trained_model("float32"))
    config = ExportConfig(model_dir=trained_model("mixed_float16"), data_dir=prepared_digits,
                          export_base=tmp_path / "base", eval_dir=eval_dir)
    with pytest.raises(GateFailedError) as info:
        run_export(config)
    message = str(info.value)
    assert message.startswith("the parity verdict is not for this model: expected model_sha256 ")
    assert len(message.splitlines()) == 1
    assert not (tmp_path / "base").exists()


@pytest.mark.slow
def test_run_export_verdict_without_model_hash_refused(trained_model, prepared_digits,
                                                       passed_eval_dir, tmp_path):
    config = ExportConfig(model_dir=trained_model("mixed_float16"), data_dir=prepared_digits,
                          export_base=tmp_path / "base", eval_dir=passed_eval_dir)
    with pytest.raises(GateFailedError, match=r"not for this model.*received no model_sha256"):
        run_export(config)
    assert not (tmp_path / "base").exists()


@pytest.mark.slow
def test_run_export_records_the_judged_model_hash(mixed_export, trained_model):
    from ampflow.artifacts.verdict import model_sha256

    meta = json.loads((mixed_export.version_dir / "ampflow_export.json").read_text())
    assert meta["gate"]["model_sha256"] == model_sha256(trained_model("mixed_float16"))
    assert meta["gate"]["forced"] is False


def test_export_config_no_eval_dir_without_force_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"eval_dir must be given.*eval_dir=None, force=False"):
        ExportConfig(model_dir=tmp_path, data_dir=tmp_path, export_base=tmp_path)
    assert ExportConfig(model_dir=tmp_path, data_dir=tmp_path, export_base=tmp_path,
                        force=True).eval_dir is None


@pytest.mark.parametrize("field, value, message", [
    ("version", 0, "version must be > 0. Received: version=0"),
    ("num_warmup_records", 999, "num_warmup_records must be in [0, 998]"),
    ("num_warmup_records", -1, "num_warmup_records must be in [0, 998]"),
    ("num_parity_images", 0, "num_parity_images must be > 0. Received: num_parity_images=0"),
    ("parity_atol", -1e-3, "parity_atol must be >= 0. Received: parity_atol=-0.001"),
    ("parity_rtol", float("nan"), "parity_rtol must be >= 0. Received: parity_rtol=nan"),
    ("model_name", "../evil", "model_name must be letters"),
    ("model_name", "7", None),
])
def test_export_config_bad_value_rejected_with_keras_message(tmp_path, field, value, message):
    kwargs = {"model_dir": tmp_path, "data_dir": tmp_path, "export_base": tmp_path,
              "force": True, field: value}
    if message is None:  # a numeric model name is legal (TF Serving names are strings)
        assert getattr(ExportConfig(**kwargs), field) == value
        return
    with pytest.raises(ConfigError) as excinfo:
        ExportConfig(**kwargs)
    assert message in str(excinfo.value)


@pytest.mark.slow
def test_check_export_parity_perturbed_reference_raises(mixed_export, trained_model,
                                                        prepared_digits):
    import tensorflow as tf

    from ampflow.artifacts.model_dir import load_trained_model
    from ampflow.components.export_savedmodel.parity import check_export_parity
    from ampflow.data import load_arrays
    from ampflow.modeling.models import build_model

    trained, meta = load_trained_model(trained_model("mixed_float16"))
    images, _ = load_arrays(prepared_digits, "test", limit=32)
    loaded = tf.saved_model.load(str(mixed_export.version_dir))
    twin = build_model(meta["architecture"], (8, 8, 1), 10, policy="float32")
    weights = trained.get_weights()
    twin.set_weights(weights)
    report = check_export_parity(loaded, twin, trained, images, meta["class_names"],
                                 atol=1e-5, rtol=1e-5)
    assert report.passed and report.max_abs_diff <= 1e-5
    weights[-1] = weights[-1] + np.linspace(0, 0.1, 10, dtype=np.float32)  # logits bias
    twin.set_weights(weights)
    with pytest.raises(GateFailedError, match=r"export parity failed.*max \|serving_default"):
        check_export_parity(loaded, twin, trained, images, meta["class_names"],
                            atol=1e-5, rtol=1e-5)
    wrong_labels = [f"x{i}" for i in range(10)]
    twin.set_weights(trained.get_weights())
    with pytest.raises(GateFailedError, match="classes are labels=False"):
        check_export_parity(loaded, twin, trained, images, wrong_labels, atol=1e-5, rtol=1e-5)
    with pytest.raises(GateFailedError, match=r"max \|image_bytes\(PNG\) − serving_default\|"):
        check_export_parity(_DriftingDecode(loaded), twin, trained, images,
                            meta["class_names"], atol=1e-5, rtol=1e-5)


class _DriftingDecode:
    """The loaded SavedModel with an image_bytes path that loses the low bits of every pixel.

    What a decode drifting from training does (another resize, a lossy re-encode): the
    parity check must catch it.
    """

    def __init__(self, loaded) -> None:
        import tensorflow as tf

        real = loaded.signatures["image_bytes"]

        def drifting(image_bytes):
            pixels = tf.map_fn(lambda b: tf.io.decode_png(b) // 16 * 16, image_bytes,
                               fn_output_signature=tf.uint8)
            return real(image_bytes=tf.map_fn(tf.io.encode_png, pixels,
                                               fn_output_signature=tf.string))

        self.signatures = {**loaded.signatures, "image_bytes": drifting}


@pytest.mark.slow
def test_run_export_verdict_of_another_model_forced_is_recorded(trained_model, prepared_digits,
                                                                tmp_path):
    eval_dir = write_verdict(tmp_path / "eval", True, model_dir=trained_model("float32"))
    result = run_export(ExportConfig(model_dir=trained_model("mixed_float16"),
                                     data_dir=prepared_digits, export_base=tmp_path / "base",
                                     eval_dir=eval_dir, force=True, num_warmup_records=1,
                                     num_parity_images=32))
    gate = json.loads((result.version_dir / "ampflow_export.json").read_text())["gate"]
    assert result.forced and gate["forced"] is True and gate["model_sha256"] is None
    assert "exported WITHOUT a verdict for this model" in gate["warning"]
