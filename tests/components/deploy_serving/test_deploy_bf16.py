"""deploy --compute-precision bfloat16 (issue 42 point 4): the parity gate that lets a version be
served in bfloat16, its evidence in the deploy record, and its refusals.

On the session's tiny export and the session's digits data: the gate runs the test split in
float32 and in bfloat16 through serve's own servable. Where the CPU has no AVX512_BF16/AMX-BF16
the gate is refused: the gate's test asserts that refusal there, read from the machine's own
CPU flags, instead of being skipped (issue 46 item 7), and the refusal is also tested with the
CPU-flags probe injected, so that it runs on every machine.
"""

from __future__ import annotations

import json

import pytest
from deploy_helpers import MODEL_NAME

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.components.deploy_serving.model_store import DEPLOY_RECORD
from ampflow.errors import ConfigError
from ampflow.serving import cpu_features

NATIVE_BF16 = bool(cpu_features.bf16_flags(cpu_features.read_cpu_flags()))
# the one line deploy ends with where the CPU cannot run the gate (bf16_parity.check)
REFUSAL = ("ampflow deploy: error: the bfloat16 parity check runs the model here, and cannot: "
           "--compute-precision bfloat16 needs a CPU with AVX512_BF16 or AMX-BF16; this one "
           "has neither")


def _config(export_base, store, data_dir, **overrides) -> DeployConfig:
    return DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(store),
                        compute_precision="bfloat16", data_dir=data_dir, **overrides)


def test_bf16_gate_passes_records_its_evidence_and_fails_closed_or_is_refused_without_bf16(
        export_base, prepared_digits, tmp_path, capsys):
    if not NATIVE_BF16:  # this CPU's real flags: refused in one line, exit 2, nothing published
        code, err = _deploy_bf16(export_base, tmp_path / "store", prepared_digits, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(REFUSAL), err
        assert not (tmp_path / "store" / MODEL_NAME / "1").exists()
        return
    result = run_deploy(_config(export_base, tmp_path / "store", prepared_digits,
                                bfloat16_test_limit=160))
    record = json.loads((tmp_path / "store" / MODEL_NAME / "1" / DEPLOY_RECORD).read_text())
    evidence = record["bf16_parity"]
    assert result.compute_precision == "bfloat16" and result.bf16_parity == evidence
    assert evidence["passed"] and evidence["num_examples"] == 160
    assert any("MatMul" in op for op in evidence["rewrite"]["bfloat16_ops"])
    assert {c["name"] for c in evidence["checks"]} == {
        "agreement", "accuracy_drop_points", "max_abs_prob_diff"}
    assert 0 < evidence["max_abs_prob_diff"] <= 0.02  # bfloat16's rounding, within the gate
    assert result.summary()["bf16_parity"].startswith("passed on 160 test examples: agreement ")

    # the same version with a bound bfloat16 cannot meet: refused, nothing published
    with pytest.raises(ConfigError, match=r"failed its parity gate .*max_abs_prob_diff = "):
        run_deploy(_config(export_base, tmp_path / "other", prepared_digits,
                           bfloat16_max_prob_diff=0.0, bfloat16_test_limit=64))
    assert not (tmp_path / "other" / MODEL_NAME / "1").exists()


def test_bf16_deploy_is_refused_in_one_line_where_it_cannot_run(export_base, tmp_path,
                                                                monkeypatch, capsys):
    for data_dir, wrong, match in ((tmp_path, {"target": "kubernetes"}, "needs target 'local'"),
                                   (None, {}, "needs data_dir")):
        with pytest.raises(ConfigError, match=match):
            _config(export_base, tmp_path / "store", data_dir, **wrong)
    monkeypatch.setattr(cpu_features, "read_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    code, err = _deploy_bf16(export_base, tmp_path / "store", tmp_path, capsys)
    assert code == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith(REFUSAL), err
    assert not (tmp_path / "store" / MODEL_NAME / "1").exists()


def _deploy_bf16(export_base, store, data_dir, capsys) -> tuple[int, list[str]]:
    """`ampflow deploy --compute-precision bfloat16` of version 1: (exit code, stderr lines)."""
    from ampflow.cli import main

    code = main(["deploy", "--saved-model-dir", str(export_base / MODEL_NAME / "1"),
                 "--model-store", str(store), "--compute-precision", "bfloat16",
                 "--data-dir", str(data_dir)])
    return code, capsys.readouterr().err.strip().splitlines()
