"""benchmarks/serving/signature_call.py runs as documented and reports what it claims."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving" / "signature_call.py"


def test_signature_call_benchmark_times_the_three_calls_and_names_the_host(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "2", "--calls", "5",
                           "--out", str(tmp_path), "--name", "smoke"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
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
