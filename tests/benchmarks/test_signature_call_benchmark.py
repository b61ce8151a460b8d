"""benchmarks/serving/signature_call.py runs as documented and reports what it claims."""

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving" / "signature_call.py"


def run_script_here(argv: list[str], monkeypatch) -> int:
    """`python signature_call.py *argv`, in this process: its exit code.

    In a child it imported TensorFlow again (~5 CPU-s, 9/10 of the test); here it runs as its
    `__main__`, from its own command line. What it changes is undone: sys.argv, sys.path (it
    puts its folder first) and the modules it imported from that folder (`run`, a name that
    must not stay taken in a test worker).
    """
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        for name in set(sys.modules) - before:
            if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == SCRIPT.parent:
                del sys.modules[name]
    return done.value.code


def test_signature_call_benchmark_times_the_three_calls_and_names_the_host(tmp_path, monkeypatch,
                                                                           capsys):
    code = run_script_here(["--rounds", "2", "--calls", "5", "--out", str(tmp_path),
                            "--name", "smoke"], monkeypatch)
    assert code == 0, capsys.readouterr().err[-2000:]
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert set(result["median_us"]) == {"public", "flat", "runtime"}
    assert all(v > 0 for v in result["median_us"].values())
    assert len(result["per_round_us"]) == 2
    for name, ratio in result["ratios"].items():
        a, b = name.split("/")
        expected = [r[a] / r[b] for r in result["per_round_us"]]
        assert ratio["min"] == min(expected) and ratio["max"] == max(expected), name
    assert result["host"]["flags"] is not None and result["host"]["cores"] >= 1
    assert "| runtime/flat |" in (tmp_path / "smoke.md").read_text()
