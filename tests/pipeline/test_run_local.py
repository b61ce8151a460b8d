"""The pipeline through the real kfp local runner (SubprocessRunner), in process, tiny epochs.

A whole successful run, every artifact checked, is the demo's (tests/pipeline/test_demo.py:
`ampflow demo` is `run-local` plus a server and a query); here, a run the parity gate stops.
"""

import json
import re

import pytest

from ampflow.errors import PipelineError
from ampflow.pipeline.run_local import LocalRunConfig, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_local_failing_parity_gate_stops_before_export_and_says_why(tmp_path, capsys):
    # the twin comparison fails here; the baseline branch plays no part, so it is left out
    config = LocalRunConfig(workdir=tmp_path, epochs=1, max_relative_logit_diff=0.0,
                            with_float32_baseline=False)
    (tmp_path / "results.json").write_text("{}")  # a previous run's: it must not stay
    with pytest.raises(PipelineError) as info:
        run_local(config)
    run_dirs = list((tmp_path / "pipeline_root").iterdir())
    assert len(run_dirs) == 1
    evaluated = run_dirs[0] / "evaluate-parity"
    # the error ends the run's output: the failed task, each failed check measured against
    # its threshold, and where the evaluate report and log are
    message = str(info.value)
    assert message.startswith("the local pipeline run stopped at step 'parity-gate'.")
    assert "The FP32-parity gate failed 1 check(s), so nothing was exported:" in message
    assert re.search(r"^  - max_relative_logit_diff: measured \S+ vs threshold <= 0$", message,
                     re.M)
    assert f"evaluate report: {evaluated / 'report'}" in message
    assert f"evaluate log:    {tmp_path / 'logs' / 'evaluate-parity.log'}" in message
    # progress: a line as each task starts and ends, the executor dumps only in the logs
    out = capsys.readouterr().out
    assert re.search(r"^  evaluate-parity +done in .* gate FAIL \(3 of 4 checks\)", out, re.M)
    assert re.search(r"^  parity-gate +FAILED after \d+\.\d s$", out, re.M)
    assert "KFP Executor" not in out and "export-savedmodel" not in out
    gate_log = (tmp_path / "logs" / "parity-gate.log").read_text()
    assert "GateFailedError" in gate_log and "max_relative_logit_diff: measured" in gate_log
    assert not (tmp_path / "results.json").exists()
    tasks = {p.name for p in run_dirs[0].iterdir()}
    assert {"train", "evaluate-parity"} <= tasks and "export-savedmodel" not in tasks
    verdict = json.loads((evaluated / "verdict" / "verdict.json").read_text())
    assert not verdict["passed"]
    # evaluate succeeded, so every output a KFP backend would upload exists
    assert {"report", "verdict"} <= {p.name for p in evaluated.iterdir()}
    outputs = json.loads((evaluated / "executor_output.json").read_text())
    assert outputs["parameterValues"]["gate_passed"] is False
    published = {name: a["artifacts"][0]["metadata"] for name, a in outputs["artifacts"].items()}
    assert published["metrics"]["gate_passed"] == 0.0
    assert len(published["confusion"]["confusionMatrix"]["rows"]) == 10
    assert "max_relative_logit_diff" in published["verdict"]["failed_checks"]
    assert not list((tmp_path / "serving").rglob("saved_model.pb"))
