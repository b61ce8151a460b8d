"""Bad inputs to `export` fail clearly, before anything is written; the CLI lists every option."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ampflow.components.export_savedmodel import ExportConfig, run_export
from ampflow.errors import DatasetError, ModelLoadError


def test_run_export_missing_model_dir_raises_model_load_error(prepared_digits, passed_eval_dir,
                                                              tmp_path):
    config = ExportConfig(model_dir=tmp_path / "nope", data_dir=prepared_digits,
                          export_base=tmp_path / "base", eval_dir=passed_eval_dir)
    with pytest.raises(ModelLoadError, match="is not a published model"):
        run_export(config)
    assert not (tmp_path / "base").exists()


def test_run_export_corrupt_model_file_raises_model_load_error(prepared_digits, passed_eval_dir,
                                                               tmp_path):
    model_dir = tmp_path / "model"  # published-looking (metadata.json present), model truncated
    model_dir.mkdir()
    (model_dir / "metadata.json").write_text(json.dumps({
        "model_name": "small_cnn", "input_shape": [8, 8, 1], "num_classes": 10,
        "precision": {"policy": "mixed_float16"}}))
    (model_dir / "model.keras").write_bytes(b"PK\x03\x04 truncated zip archive")
    config = ExportConfig(model_dir=model_dir, data_dir=prepared_digits,
                          export_base=tmp_path / "base", eval_dir=passed_eval_dir)
    with pytest.raises(ModelLoadError, match=r"model\.keras .*corrupt"):
        run_export(config)
    assert not (tmp_path / "base").exists()


@pytest.mark.slow
def test_run_export_missing_data_dir_raises_dataset_error(trained_model, mixed_eval_dir,
                                                          tmp_path):
    config = ExportConfig(model_dir=trained_model("mixed_float16"), data_dir=tmp_path / "none",
                          export_base=tmp_path / "base", eval_dir=mixed_eval_dir)
    with pytest.raises(DatasetError, match="is not a prepared dataset"):
        run_export(config)


def test_export_cli_help_lists_every_option(capsys):
    from ampflow.cli import build_parser

    with pytest.raises(SystemExit) as excinfo:
        build_parser().parse_args(["export", "--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    for field in dataclasses.fields(ExportConfig):
        assert "--" + field.name.replace("_", "-") in text, field.name
    assert "--no-force" in text and "(default: 1e-05)" in text


def test_export_cli_missing_model_one_line_error_exit_2(prepared_digits, passed_eval_dir,
                                                        tmp_path, capsys):
    from ampflow.cli import main

    code = main(["export", "--model-dir", str(tmp_path / "nope"), "--data-dir",
                 str(prepared_digits), "--export-base", str(tmp_path / "base"),
                 "--eval-dir", str(passed_eval_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 2  # a flag that names no model: a configuration error (src/ampflow/errors.py)
    assert err.startswith("ampflow export: error: ") and "is not a published model" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_export_cli_no_eval_dir_config_error_exit_2(tmp_path, capsys):
    from ampflow.cli import main

    code = main(["export", "--model-dir", str(tmp_path), "--data-dir", str(tmp_path),
                 "--export-base", str(tmp_path)])
    assert code == 2
    assert "--eval-dir must be given" in capsys.readouterr().err
