"""Fixtures of the export tests: verdict dirs, and one real export of a mixed_float16 model."""

from __future__ import annotations

import json

import pytest


def write_verdict(directory, passed: bool, failed_checks=()):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "verdict.json").write_text(json.dumps(
        {"passed": passed, "failed_checks": list(failed_checks)}))
    return directory


@pytest.fixture(scope="session")
def passed_eval_dir(tmp_path_factory):
    return write_verdict(tmp_path_factory.mktemp("eval-passed"), True)


@pytest.fixture(scope="session")
def failed_eval_dir(tmp_path_factory):
    return write_verdict(tmp_path_factory.mktemp("eval-failed"), False,
                         [{"name": "argmax_agreement", "value": 0.9, "threshold": 0.99,
                           "op": ">=", "passed": False}])


@pytest.fixture(scope="session")
def mixed_export(tmp_path_factory, trained_model, prepared_digits, passed_eval_dir):
    """One export of the session's mixed_float16 model: the ExportResult."""
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    base = tmp_path_factory.mktemp("serving-base")
    return run_export(ExportConfig(model_dir=trained_model("mixed_float16"),
                                   data_dir=prepared_digits, export_base=base,
                                   eval_dir=passed_eval_dir))
