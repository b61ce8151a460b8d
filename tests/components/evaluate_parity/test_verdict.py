"""The verdict artifact: whose model it judges (sha256) and the gate that reads it."""

from __future__ import annotations

import hashlib
import json

import pytest

from ampflow.artifacts.verdict import model_sha256, require_passed, require_same_model
from ampflow.errors import GateFailedError, ModelLoadError

FAILED = [
    {"name": "argmax_agreement", "value": 0.91, "op": ">=", "threshold": 0.99, "passed": False},
    {"name": "baseline_mcnemar_p_value", "value": 0.0012, "op": ">=", "threshold": 0.05,
     "passed": False},
]


def _model_dir(path, content: bytes = b"PK weights"):
    path.mkdir(parents=True)
    (path / "model.keras").write_bytes(content)
    return path


def _eval_dir(path, **verdict):
    path.mkdir(parents=True)
    (path / "verdict.json").write_text(json.dumps({"failed_checks": [], **verdict}))
    return path


def test_model_sha256_is_the_hash_of_model_keras(tmp_path):
    model = _model_dir(tmp_path / "m", b"some model bytes")
    assert model_sha256(model) == hashlib.sha256(b"some model bytes").hexdigest()
    with pytest.raises(ModelLoadError, match="cannot read .*model.keras"):
        model_sha256(tmp_path / "missing")


def test_require_same_model_accepts_the_judged_model(tmp_path):
    model = _model_dir(tmp_path / "m")
    verdict = {"passed": True, "model_sha256": model_sha256(model)}
    assert require_same_model(verdict, model) == verdict["model_sha256"]


@pytest.mark.parametrize("recorded, shown", [
    (hashlib.sha256(b"another model").hexdigest()[:64], "received sha256 "),
    (None, "received no model_sha256"),
])
def test_require_same_model_refuses_another_models_verdict_in_one_line(tmp_path, recorded, shown):
    model = _model_dir(tmp_path / "m")
    verdict = {"passed": True, **({"model_sha256": recorded} if recorded else {})}
    with pytest.raises(GateFailedError) as info:
        require_same_model(verdict, model)
    message = str(info.value)
    assert "the parity verdict is not for this model" in message and shown in message
    assert model_sha256(model)[:12] in message and len(message.splitlines()) == 1


def test_require_passed_names_every_failed_check(tmp_path):
    eval_dir = _eval_dir(tmp_path / "e", passed=False, failed_checks=FAILED)
    with pytest.raises(GateFailedError) as info:
        require_passed(eval_dir)
    message = str(info.value)
    assert "failed 2 check(s), so the run stops before export" in message
    assert "argmax_agreement: measured 0.91 vs threshold >= 0.99" in message
    assert "baseline_mcnemar_p_value: measured 0.0012 vs threshold >= 0.05" in message


def test_require_passed_returns_a_passed_verdict_and_rejects_a_missing_one(tmp_path):
    assert require_passed(_eval_dir(tmp_path / "ok", passed=True))["passed"] is True
    with pytest.raises(ModelLoadError, match="is not an evaluation output"):
        require_passed(tmp_path / "nothing")
