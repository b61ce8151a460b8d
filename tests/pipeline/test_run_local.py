"""The whole pipeline through the real kfp local runner (SubprocessRunner), tiny epochs."""

import hashlib
import json
import re

import numpy as np
import pytest

from ampflow.errors import PipelineError
from ampflow.pipeline.run_local import LocalRunConfig, run_local
from ampflow.pipeline.task_logs import plain

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TASKS = {"prepare-data", "train", "train-2", "evaluate-parity", "parity-gate",
         "export-savedmodel", "convert-tflite", "deploy-serving"}
# These runs check the wiring; they train for 1-3 epochs, where AMP and float32 accuracy still
# move by several points from run to run, so the training-parity thresholds are opened here
# (their statistics are tested in tests/components/evaluate_parity/test_training_parity.py).
OPEN_TRAINING_GATE = {"max_baseline_accuracy_drop": 100.0, "baseline_alpha": 1e-300}


def test_run_local_produces_every_artifact_and_the_served_model_answers(tmp_path, capsys):
    from ampflow.components.prepare_data import load_arrays
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    config = LocalRunConfig(workdir=tmp_path, epochs=3, model_name="digits",
                            **OPEN_TRAINING_GATE)
    result = run_local(config, verbose=True)

    assert TASKS <= set(result.artifacts)
    # verbose: every line streamed as the local runner prints it, and each task's in its log
    out = plain(capsys.readouterr().out)  # without the runner's terminal colours
    assert "Executing task 'train-2'" in out and "[KFP Executor" in out
    assert set(result.logs) == TASKS
    for task, log in result.logs.items():
        assert log == tmp_path / "logs" / f"{task}.log"
        assert f"Task '{task}' finished with status SUCCESS" in log.read_text()
    art = result.artifacts
    assert (art["prepare-data"]["data"] / "dataset_info.json").is_file()
    assert (art["train"]["model"] / "model.keras").is_file()
    # two trainings, AMP and float32, each checkpointing to its own dir on the run's workspace
    amp_meta = json.loads((art["train"]["model"] / "metadata.json").read_text())
    base_meta = json.loads((art["train-2"]["model"] / "metadata.json").read_text())
    assert amp_meta["precision"]["policy"] == "mixed_float16"
    assert base_meta["precision"]["policy"] == "float32"
    assert amp_meta["config"]["checkpoint_dir"] == str(config.workspace / "checkpoints/train-amp")
    assert base_meta["config"]["checkpoint_dir"] == str(
        config.workspace / "checkpoints/train-float32")
    verdict = json.loads((art["evaluate-parity"]["verdict"] / "verdict.json").read_text())
    assert verdict["passed"]
    assert verdict["model_sha256"] == hashlib.sha256(
        (art["train"]["model"] / "model.keras").read_bytes()).hexdigest()
    metrics = json.loads((art["evaluate-parity"]["verdict"] / "metrics.json").read_text())
    assert {"baseline_accuracy", "baseline_mcnemar_p_value", "training_speedup"} <= set(metrics)
    assert "## Training parity" in art["evaluate-parity"]["report"].read_text()
    assert (art["evaluate-parity"]["report"]).read_text().startswith("#")
    assert (art["export-savedmodel"]["saved_model"] / "digits" / "1" / "saved_model.pb").is_file()
    tflite = art["convert-tflite"]["tflite"]
    assert {p.name for p in tflite.glob("*.tflite")} == {
        "float32.tflite", "float16.tflite", "dynamic_range.tflite", "full_int8.tflite"}
    endpoint = json.loads(art["deploy-serving"]["endpoint"].read_text())
    assert endpoint["target"] == "local" and endpoint["version"] == 1
    assert (result.serving_base / "1" / "saved_model.pb").is_file()

    server = start_local_server(ServerConfig(models=(ModelConfig("digits", result.serving_base),),
                                             host="127.0.0.1", port=0))
    try:
        images, labels = load_arrays(art["prepare-data"]["data"], "test", limit=64)
        with PredictionClient(server.address, timeout_s=10) as client:
            assert client.wait_until_available("digits", timeout=60) == 1
            out = client.predict("digits", images.astype("float32")).outputs
        assert out["probabilities"].shape == (64, 10)
        np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)
        assert np.mean(out["class_ids"] == labels) > 0.8
    finally:
        server.stop(0)


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
    assert message.startswith("the local pipeline run stopped at task 'parity-gate'.")
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
