"""One name per step wherever it is read: KFP's (the compiled IR's task names as its UI shows
them), the local run's progress lines and its log files.

The two train tasks are `train`/`train-2` to the runner and `train-amp`/`train-float32` in KFP;
the local run's lines and logs said `train`/`train-2` (issue 27).
"""

from __future__ import annotations

import io

import yaml

from ampflow.pipeline.pipeline import PipelineOptions, build_pipeline, compile_pipeline, step_names
from ampflow.pipeline.run_local import _Progress
from ampflow.pipeline.task_logs import TaskLogRouter


def _ir_display_names(path) -> dict[str, str]:
    spec = next(yaml.safe_load_all(open(path)))
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    return {name: task["taskInfo"]["name"] for dag in dags for name, task in dag["tasks"].items()
            if not name.startswith("condition-")}


def test_step_names_are_the_names_kfp_shows(tmp_path):
    options = PipelineOptions(gpu=False)
    names = step_names(build_pipeline(options))
    assert names == _ir_display_names(compile_pipeline(tmp_path / "p.yaml", options))
    assert names["train"] == "train-amp" and names["train-2"] == "train-float32"
    assert set(names.values()) >= {"prepare-data", "evaluate-parity", "parity-gate",
                                   "export-savedmodel", "convert-tflite", "deploy-serving"}


def test_a_local_runs_lines_and_logs_use_the_step_names(tmp_path):
    names = {"train": "train-amp", "train-2": "train-float32"}
    console = io.StringIO()
    progress = _Progress(console, lambda: tmp_path, names)
    router = TaskLogRouter(tmp_path / "logs", on_start=progress.started, on_end=progress.ended,
                           step_names=names)
    for task in ("train", "train-2"):
        router.write(f"Executing task '{task}'\nepoch 1/1\n"
                     f"Task '{task}' finished with status FAILURE\n{'-' * 40}\n")
    router.close()
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["train-amp.log", "train-float32.log"]
    assert "epoch 1/1" in (tmp_path / "logs" / "train-float32.log").read_text()
    lines = console.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["train-amp"] * 2 + ["train-float32"] * 2
