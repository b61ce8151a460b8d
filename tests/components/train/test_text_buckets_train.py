"""`ampflow train` on text batched by length bucket, end to end (issue 50): with gradient
accumulation on the local launcher's two workers, the global batch is kept, the workers end
identical and every test text is scored.

A text folder of keyword sentences of 1 to 50 words (so a 64 cap has three buckets: 16, 32,
64), prepared by `prepare-data --text-folder`; bert_tiny trains a few steps in float32.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ampflow.cli import main

CLASSES = {"gloomy": "dreadful", "happy": "superb", "weird": "surreal"}
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city")
PER_CLASS = {"train": 40, "test": 12}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bucket-texts")
    rng = np.random.default_rng(5)
    for split, count in PER_CLASS.items():
        for name, keyword in CLASSES.items():
            folder = root / "texts" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                words = list(rng.choice(FILLER, size=int(rng.integers(0, 50))))
                words.insert(int(rng.integers(0, len(words) + 1)), keyword)
                (folder / f"{i}.txt").write_text(" ".join(words), encoding="utf-8")
    assert main(["prepare-data", "--text-folder", str(root / "texts"), "--output-dir",
                 str(root / "prepared")]) == 0
    return root / "prepared"


def _train_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--data-dir", str(data_dir), "--output-dir", str(out), "--model",
            "bert_tiny", "--precision", "float32", "--max-sequence-length", "64",
            "--batch-size", "8", "--epochs", "1", "--steps-per-epoch", "3", *extra]


def _checked(out: Path, global_batch: int) -> dict:
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["text_padding"]["mode"] == "buckets"
    assert meta["text_padding"]["lengths"] == [16, 32, 64]
    assert meta["distribution"]["global_batch_size"] == global_batch
    assert meta["epochs"][-1]["steps"] == 3
    assert meta["epochs"][-1]["val_examples"] == PER_CLASS["test"] * len(CLASSES)  # all, once
    return meta


@pytest.mark.slow  # two worker processes train bert_tiny: ~40 s on a quiet 2-core host
def test_two_accumulating_workers_train_bucketed_batches_to_identical_weights(prepared,
                                                                              tmp_path):
    """One run for both paths: 2 workers × 2 micro-batches of 8 = a global batch of 32."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "ampflow.cli", *_train_args(
        prepared, out, "--workers", "2", "--accumulation-steps", "2")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    meta = _checked(out, 32)
    assert meta["accumulation"]["accumulation_steps"] == 2
    assert meta["distribution"]["num_workers"] == 2
    assert meta["distribution"]["weights_identical_on_all_workers"] is True
