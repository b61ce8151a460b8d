"""`ampflow demo` end to end, as a user runs it: pipeline, `ampflow serve`, gRPC, cleanup.

The command runs in a child process, so the test sees exactly what a terminal shows (stdout
and stderr, TensorFlow's C++ lines included) and what the demo leaves in its workdir. The demo
is `run-local` plus a server and a query, so its first run is also where every artifact of a
whole local pipeline run is checked; its second run, in the same workdir, is the run the
parity gate stops (the in-process `run_local` API's successful run is
tests/pipeline/test_image_folder_pipeline.py's).
"""

import hashlib
import json
import re
import subprocess
import sys

import pytest

# two demo runs of up to 900 s each (RUN_TIMEOUT_S); pyproject's 600 s is per test
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.serving,
              pytest.mark.timeout(1900)]
RUN_TIMEOUT_S = 900
TASKS = ("prepare-data", "train", "train-2", "evaluate-parity", "parity-gate",
         "export-savedmodel", "convert-tflite", "compare-serving", "serving-gate",
         "deploy-serving")  # the kfp local runner's
# the names KFP shows, which the demo's lines and log files use (the runner's folders keep its own)
SHOWN = {"train": "train-amp", "train-2": "train-float32"}
STEPS = tuple(SHOWN.get(task, task) for task in TASKS)
# TensorFlow's start-up lines that a CPU-only machine prints and a newcomer reads as failures
# (its own phrases, not any line naming oneDNN: on a bf16 CPU the demo's precision line says
# "oneDNN runs bfloat16 conv/matmul about 1.9x float32", which is ours and meant to be read)
NOISE = re.compile(r"cuInit|cudart|cuda drivers|oneDNN custom operations|absl::InitializeLog"
                   r"|cpu_feature_guard|^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")
MAX_LINES = 80


def _demo(workdir, *flags, exit_code=0):
    # 2 epochs check the flow; AMP-vs-float32 accuracy still moves by points there, so the
    # training-parity thresholds are opened (their statistics: test_training_parity.py)
    cmd = [sys.executable, "-m", "ampflow.cli", "demo", "--workdir", str(workdir), "--epochs",
           "2", "--num-queries", "2",
           "--max-baseline-accuracy-drop", "100", "--baseline-alpha", "1e-300", *flags]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert run.returncode == exit_code, run.stdout[-4000:]
    return run.stdout


def test_demo_prints_a_line_per_step_and_the_results_and_a_rerun_the_gate_stops_says_why(
        tmp_path):
    first = _demo(tmp_path)
    lines = first.splitlines()
    assert len(lines) < MAX_LINES, first
    assert not [line for line in lines if NOISE.search(line)], first
    assert "KFP Executor" not in first and "Executing task" not in first  # those are in logs/
    assert "--precision auto would pick" in first
    for task in STEPS:  # a start line, then an end line with its time and headline
        start = lines.index(f"  {task:<18} started")
        end = next(i for i, x in enumerate(lines) if re.match(rf"  {task} +done in +\d", x))
        assert start < end, first
    # above chance, the twin's four, the float32-trained model's two
    assert re.search(r"  evaluate-parity +done in .* gate PASS \(7 of 7 checks\): agreement", first)
    # nothing is serving yet in a new workdir: the first release, compared with nothing
    assert re.search(r"  compare-serving +done in .* no model serving to compare with \(no "
                     r"version serving there: the first release\)", first)
    assert re.search(r"  serving-gate +done in .* passed: deploy may go on", first)
    # chance is the most frequent digit's share of the test split: 37 of 359
    assert re.search(r"release\.vs_chance +accuracy 0\.\d{4} vs chance 0\.1031 \(binomial p",
                     first), first
    assert re.search(r"  train-float32 +done in .* float32, XLA \w+: val_accuracy 0\.\d{4}",
                     first)
    assert re.search(r"  export-savedmodel +done in .* SavedModel version ampflow/1", first)
    assert re.search(r"  convert-tflite +done in .* 4 of 4 variants checked and passed", first)
    assert re.search(r"  serve +done in .* version 1 AVAILABLE", first)
    assert re.search(r"  gRPC Predict +done in .* label→predicted \d→\d \d→\d", first)
    assert "serve              stopped (exit code 0)" in first
    assert f"Full logs, one per step: {tmp_path}/logs/<step>.log" in first

    # each step's own output is in its log file, not in another's
    logs = tmp_path / "logs"
    assert {f"{t}.log" for t in (*STEPS, "serve", "pipeline")} <= {p.name for p in
                                                                   logs.iterdir()}
    for task, step in zip(TASKS, STEPS, strict=True):
        text = (logs / f"{step}.log").read_text()
        assert f"Executing task '{task}'" in text and f"/{task}/executor_output.json" in text
        assert f"Task '{task}' finished with status SUCCESS" in text
    assert "epoch 2/2" in (logs / "train-amp.log").read_text()
    serve_log = (logs / "serve.log").read_text()
    assert "ampflow serve: listening on" in serve_log and not NOISE.search(serve_log)

    # the table printed is the table saved; results.json holds the same rows, unformatted
    from ampflow.pipeline.report import results_table
    from ampflow.pipeline.task_logs import plain

    saved = json.loads((tmp_path / "results.json").read_text())
    table = (tmp_path / "results.txt").read_text()
    assert table == results_table(saved["results"]) + "\n" and table in first
    assert saved["serving"]["version"] == 1 == saved["results"]["serving.version"]
    assert saved["serving"]["served_accuracy"] > 0.5  # the served model learned the digits
    _check_served_accuracy_is_the_twins(saved["serving"], _latest_run(tmp_path))
    assert saved["results"]["parity.gate"] == "passed"
    assert "parity.amp_vs_float32_trained" in table and "parity.amp_training_speedup" in table
    assert saved["logs"]["train-amp"] == str(logs / "train-amp.log")
    _check_every_artifact(tmp_path)

    # the second run, in the same workdir: the run the FP32-parity gate stops (a threshold of 0
    # on the twin comparison), with --verbose, and trained by two local worker processes
    # (MultiWorkerMirroredStrategy over loopback with the TF_CONFIG a TFJob sets) that the train
    # task itself starts. Without the baseline branch it trains once, for one epoch.
    second = plain(_demo(tmp_path, "--no-with-float32-baseline", "--verbose",
                         "--train-workers", "2", "--epochs", "1",
                         "--max-relative-logit-diff", "0", exit_code=1))
    _check_the_gate_stopped_the_run(second, tmp_path, _latest_run(tmp_path))
    # --verbose streams what the logs hold, TensorFlow's start-up lines included
    assert "KFP Executor" in second and "Executing task 'train'" in second
    assert "failed call to cuInit" in second
    assert not (logs / "train-float32.log").exists()  # the logs are the latest run's
    trained = _latest_run(tmp_path) / "train" / "model" / "metadata.json"
    distribution = json.loads(trained.read_text())["distribution"]
    assert (distribution["strategy"], distribution["num_workers"]) == ("multi_worker", 2)
    assert "started worker 1 of 2" in second
    # the train task only launches its workers: it starts no TensorFlow of its own first
    # (that import delayed the workers by seconds); TensorFlow's start-up lines are theirs
    launcher = (logs / "train-amp.log").read_text().split("started worker 0 of 2")[0]
    assert not [line for line in launcher.splitlines() if NOISE.search(line.strip())], launcher


def _check_the_gate_stopped_the_run(output: str, workdir, run) -> None:
    """The error ends the output: the failed task, each failed check measured against its
    threshold, where the evaluate report and log are; nothing of the run was exported, the
    served version 1 is untouched and the previous run's results are gone."""
    evaluated = run / "evaluate-parity"
    message = output[output.index("ampflow demo: error: "):]
    assert message.startswith("ampflow demo: error: the local pipeline run stopped at step "
                              "'parity-gate'.\n"), message
    assert "The FP32-parity gate failed 1 check(s), so nothing was exported:" in message
    # the CLI names the flag (--max-relative-logit-diff), the task's own log the setting
    assert re.search(r"^  - --max-relative-logit-diff: measured \S+ vs threshold <= 0$",
                     message, re.M), message
    assert f"evaluate report: {evaluated / 'report'}" in message
    assert f"evaluate log:    {workdir / 'logs' / 'evaluate-parity.log'}" in message
    # progress: a line as each task starts and ends
    assert re.search(r"^  evaluate-parity +done in .* gate FAIL \(4 of 5 checks\)", output,
                     re.M), output[-4000:]
    assert re.search(r"^  parity-gate +FAILED after \d+\.\d s$", output, re.M), output[-4000:]
    assert not re.search(r"^  (export-savedmodel|compare-serving|serve) ", output,
                         re.M), output[-4000:]
    gate_log = (workdir / "logs" / "parity-gate.log").read_text()
    assert "GateFailedError" in gate_log and "max_relative_logit_diff: measured" in gate_log
    assert not (workdir / "results.json").exists() and not (workdir / "results.txt").exists()
    tasks = {p.name for p in run.iterdir()}
    assert {"train", "evaluate-parity"} <= tasks and "export-savedmodel" not in tasks
    assert not json.loads((evaluated / "verdict" / "verdict.json").read_text())["passed"]
    # evaluate succeeded, so every output a KFP backend would upload exists
    assert {"report", "verdict"} <= {p.name for p in evaluated.iterdir()}
    outputs = json.loads((evaluated / "executor_output.json").read_text())
    assert outputs["parameterValues"]["gate_passed"] is False
    published = {name: a["artifacts"][0]["metadata"] for name, a in outputs["artifacts"].items()}
    assert published["metrics"]["gate_passed"] == 0.0
    assert len(published["confusion"]["confusionMatrix"]["rows"]) == 10
    assert "max_relative_logit_diff" in published["verdict"]["failed_checks"]
    names = sorted(p.name for p in (workdir / "serving" / "ampflow").iterdir())
    # the first run's version dir, and the deploy's claim lock (hidden: no server loads it)
    assert [n for n in names if not n.startswith(".")] == ["1"]
    assert set(names) - {"1"} <= {".versions.lock"}, names


def _latest_run(workdir):
    """The pipeline root's newest run (each demo run adds one)."""
    return max((workdir / "pipeline_root").iterdir(),
               key=lambda run: (run / "train" / "model" / "metadata.json").stat().st_mtime)


def _check_served_accuracy_is_the_twins(served: dict, run) -> None:
    """The served model is the exported float32 twin, queried on the same test images that
    evaluate-parity scored it on: the accuracies agree to within one image (a flip of a
    near-tie between the server's and Keras's float32 kernels), not merely both "> 0.5"."""
    metrics = json.loads((run / "evaluate-parity" / "verdict" / "metrics.json").read_text())
    assert metrics["num_examples"] == served["served_examples"] == 359
    twin_right = metrics["fp32_twin_accuracy"] * metrics["num_examples"]
    served_right = served["served_accuracy"] * served["served_examples"]
    assert abs(served_right - twin_right) <= 1 + 1e-6, (served, metrics["fp32_twin_accuracy"])


def _check_every_artifact(workdir):
    """What each task of the (only) run left in the pipeline root, as the KFP backend would."""
    (run,) = (workdir / "pipeline_root").iterdir()
    assert set(TASKS) <= {p.name for p in run.iterdir()}
    assert (run / "prepare-data" / "data" / "dataset_info.json").is_file()
    amp_model, baseline_model = run / "train" / "model", run / "train-2" / "model"
    amp_meta = json.loads((amp_model / "metadata.json").read_text())
    baseline_meta = json.loads((baseline_model / "metadata.json").read_text())
    assert amp_meta["precision"]["policy"] in ("mixed_float16", "mixed_bfloat16")
    assert baseline_meta["precision"]["policy"] == "float32"
    # each training checkpoints to its own dir on the run's workspace (durable on a cluster)
    workspace = workdir / "workspace"
    assert amp_meta["config"]["checkpoint_dir"] == str(workspace / "checkpoints/train-amp")
    assert baseline_meta["config"]["checkpoint_dir"] == str(
        workspace / "checkpoints/train-float32")
    evaluated = run / "evaluate-parity"
    verdict = json.loads((evaluated / "verdict" / "verdict.json").read_text())
    assert verdict["passed"] and verdict["notes"] == []  # 359 test images are enough
    assert verdict["baselines"]["float32_trained"] == str(baseline_model)
    compared = json.loads((run / "compare-serving" / "comparison" /
                           "serving_verdict.json").read_text())
    assert compared["passed"] and compared["baselines"]["serving"] == {
        "base_path": str((workdir / "serving" / "ampflow").resolve()), "version": None,
        "why_none": "no version serving there: the first release"}
    assert verdict["model_sha256"] == hashlib.sha256(
        (amp_model / "model.keras").read_bytes()).hexdigest()
    metrics = json.loads((evaluated / "verdict" / "metrics.json").read_text())
    assert {"baseline_accuracy", "baseline_mcnemar_p_value", "training_speedup"} <= set(metrics)
    report = (evaluated / "report").read_text()
    assert report.startswith("#") and "## Training parity" in report
    assert (run / "export-savedmodel" / "saved_model" / "ampflow" / "1" /
            "saved_model.pb").is_file()
    assert {p.name for p in (run / "convert-tflite" / "tflite").glob("*.tflite")} == {
        "float32.tflite", "float16.tflite", "dynamic_range.tflite", "full_int8.tflite"}
    endpoint = json.loads((run / "deploy-serving" / "endpoint").read_text())
    assert endpoint["target"] == "local" and endpoint["version"] == 1
    assert (workdir / "serving" / "ampflow" / "1" / "saved_model.pb").is_file()
