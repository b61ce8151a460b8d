"""Fixtures of the export tests: verdict dirs, and one real export of a mixed_float16 model."""

from __future__ import annotations

import pytest
from verdict_helpers import write_verdict


@pytest.fixture(scope="session")
def passed_eval_dir(tmp_path_factory):
    """A passed verdict that names no model: enough for inputs refused before the model check."""
    return write_verdict(tmp_path_factory.mktemp("eval-passed"), True)


@pytest.fixture(scope="session")
def mixed_eval_dir(tmp_path_factory, trained_model):
    """A passed verdict for the session's mixed_float16 model."""
    return write_verdict(tmp_path_factory.mktemp("eval-mixed"), True,
                         model_dir=trained_model("mixed_float16"))


@pytest.fixture(scope="session")
def failed_eval_dir(tmp_path_factory):
    return write_verdict(tmp_path_factory.mktemp("eval-failed"), False,
                         [{"name": "argmax_agreement", "value": 0.9, "threshold": 0.99,
                           "op": ">=", "passed": False}])


@pytest.fixture(scope="session")
def failed_mixed_eval_dir(tmp_path_factory, trained_model):
    """A failed verdict for the session's mixed_float16 model."""
    return write_verdict(tmp_path_factory.mktemp("eval-failed-mixed"), False,
                         [{"name": "argmax_agreement", "value": 0.9, "threshold": 0.99,
                           "op": ">=", "passed": False}],
                         model_dir=trained_model("mixed_float16"))


@pytest.fixture(scope="session")
def mixed_export(tmp_path_factory, trained_model, prepared_digits, mixed_eval_dir):
    """One export of the session's mixed_float16 model: the ExportResult."""
    from ampflow.components.export_savedmodel import ExportConfig, run_export

    base = tmp_path_factory.mktemp("serving-base")
    return run_export(ExportConfig(model_dir=trained_model("mixed_float16"),
                                   data_dir=prepared_digits, export_base=base,
                                   eval_dir=mixed_eval_dir))
