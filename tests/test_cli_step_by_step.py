"""Every step of the how-tos, as a user types it, for a text folder and for an image folder.

Each command goes through `ampflow.cli.main(argv)` with the documented flags and defaults
(docs/tutorial/step-by-step.md, docs/how-to/own-data.md, text-data.md, text-models.md): it
must exit 0 and print no traceback. `run-local` calls the steps' functions, not their
commands, so a command's own code (its summary) is reached only here: `ampflow export` on a
text model published its version, then died on `KeyError: 'num_images'` (issue 46).

Cheap on purpose: one module fixture per modality and per tier walks the steps once, and the
tests read what each step printed and wrote. The fast tier prepares each folder and checks the
model (`check-model` trains nothing). The text walk needs a trained model, so it is `slow`: it
reuses the suite's one trained bert_tiny (tests/tiny_text_model.py, itself trained by `ampflow
train` through the CLI, its output kept). An image model's commands after prepare-data are
walked once, by tests/test_readme_step_by_step.py (the tutorial's block: train, evaluate,
export, convert, deploy, serve, predict on the offline digits, its export summary counting
images); a folder of photos through the pipeline, served and asked with `ampflow predict
photo.jpg` (image_bytes) over gRPC and REST, is tests/pipeline/test_image_folder_pipeline.py.
Commands run through tests/cli_walk.py, which the README's walk and the pipeline walks share.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from cli_walk import Step, run_cli
from tiny_text_model import prepare_stdout, prepared_texts, trained_text_model

COLOURS = {"blue": (40, 60, 210), "green": (40, 190, 60), "red": (200, 40, 40)}
SIZE = 16


# ---- the text folder ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_checked(tmp_path_factory):
    """prepare-data on the shared text folder (its output kept) and check-model as
    text-models.md types it."""
    data = prepared_texts(tmp_path_factory)
    prepared = Step(("prepare-data", "--text-folder", "..."), 0, prepare_stdout(tmp_path_factory))
    checked = run_cli("check-model", "--data-dir", data, "--model", "bert_tiny",
                   "--precision", "mixed_float16")
    return {"data": data, "prepare-data": prepared, "check-model": checked}


def test_text_folder_prepares_and_its_model_checks_as_typed(text_checked):
    for name in ("prepare-data", "check-model"):
        text_checked[name].assert_ok()
    info = json.loads((text_checked["data"] / "dataset_info.json").read_text())
    assert info["modality"] == "text" and info["name"] == "ampflow_text_folder"
    # the config as it ran: the folder, not --dataset's default (the offline digits)
    assert info["config"]["dataset"] is None and info["config"]["text_folder"]
    assert json.loads((text_checked["data"] / "config.json").read_text()) == info["config"]
    assert "ampflow prepare-data: done" in text_checked["prepare-data"].out


@pytest.fixture(scope="module")
def text_walk(tmp_path_factory, text_checked):
    """train (the shared run), evaluate, export, convert with its defaults and deploy, each as
    the how-tos type it, in one work dir."""
    trained = trained_text_model(tmp_path_factory)
    work, data, model = tmp_path_factory.mktemp("text-walk"), text_checked["data"], \
        trained.model_dir
    steps = {"train": Step(("train", "..."), 0, trained.train_stdout)}
    steps["evaluate"] = run_cli("evaluate", "--model-dir", model, "--data-dir", data,
                             "--output-dir", work / "eval")
    steps["export"] = run_cli("export", "--model-dir", model, "--data-dir", data,
                           "--export-base", work / "exports", "--eval-dir", work / "eval")
    steps["convert"] = run_cli("convert", "--saved-model-dir", work / "exports" / "ampflow",
                            "--data-dir", data, "--output-dir", work / "tflite")
    steps["deploy"] = run_cli("deploy", "--target", "local", "--saved-model-dir",
                           work / "exports" / "ampflow" / "1", "--model-store", work / "serving")
    # serve and predict --text on the deployed text model: tests/pipeline/test_text_pipeline.py
    # (text-models.md's block, as typed, over gRPC and REST)
    return {"work": work, "model": model, **steps}


@pytest.mark.slow  # reads the suite's trained bert_tiny, exports and converts it
@pytest.mark.parametrize("name", ["train", "evaluate", "export", "deploy"])
def test_text_folder_step_by_step_each_step_exits_0_without_traceback(text_walk, name):
    text_walk[name].assert_ok()


@pytest.mark.slow
def test_text_export_summary_counts_texts(text_walk):
    out = text_walk["export"].out
    assert re.search(r"export_parity +max \|SavedModel - Keras\| = \S+ on \d+ texts", out), out
    assert "images" not in out
    assert (text_walk["work"] / "exports" / "ampflow" / "1" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_text_convert_with_its_defaults_exits_0(text_walk):
    step = text_walk["convert"]
    assert "Traceback" not in step.out, step.out[-3000:]
    report = (text_walk["work"] / "tflite" / "report.md").read_text()
    assert "| texts/s (batch 32) |" in report and "img/s" not in report
    step.assert_ok()
    # every default variant of a text model passes its gate, full_int8 too (issue 46: it was
    # refused); the only proof of it (the text pipeline converts float32 alone)
    variants = json.loads((text_walk["work"] / "tflite" / "report.json").read_text())["variants"]
    assert {v: r["passed"] for v, r in variants.items()} == dict.fromkeys(
        ("float32", "float16", "dynamic_range", "full_int8"), True)



# ---- the image folder -----------------------------------------------------------------------


def _write_photos(root: Path) -> Path:
    """train/ and test/ of three colour classes, PNGs of different sizes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 40), ("test", 10)):
        for name, colour in COLOURS.items():
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                height, width = (int(n) for n in rng.integers(12, 40, size=2))
                pixels = np.clip(np.array(colour) + rng.normal(0, 25, (height, width, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def image_checked(tmp_path_factory):
    """prepare-data and check-model on a folder of photos, as own-data.md and own-model.md
    type them."""
    work = tmp_path_factory.mktemp("image-walk")
    photos = _write_photos(work / "photos")
    data = work / "work" / "photos"
    return {"work": work, "photos": photos, "data": data,
            "prepare-data": run_cli("prepare-data", "--image-folder", photos, "--image-size", SIZE,
                                 "--output-dir", data),
            "check-model": run_cli("check-model", "--data-dir", data, "--model", "small_cnn",
                                "--precision", "mixed_float16")}


def test_image_folder_prepares_and_its_model_checks_as_typed(image_checked):
    for name in ("prepare-data", "check-model"):
        image_checked[name].assert_ok()
    info = json.loads((image_checked["data"] / "dataset_info.json").read_text())
    assert info["modality"] == "image" and info["splits"] == {"train": 120, "test": 30}
    assert info["config"]["dataset"] is None and info["config"]["image_folder"]
