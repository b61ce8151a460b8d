"""A real text model for the export and convert tests (a plain module: conftest cannot be imported).

A folder of short texts in 3 classes, prepared by `prepare-data --text-folder` and trained by
`ampflow train --model bert_tiny --precision mixed_float16` for 2 epochs at sequence length 16:
the model and tokenizer every later step gets from a real run. Each text is filler words around
one keyword of its class, so the model learns far above chance (1/3) in two epochs. The convert
tests load this file by its path (tests/components/convert_tflite/test_convert_tflite_text.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from pathlib import Path

import numpy as np

SEQ = 16
CLASSES = ("gloomy", "happy", "weird")
KEYWORDS = {"gloomy": ("awful", "dreadful", "dull"), "happy": ("great", "superb", "wonderful"),
            "weird": ("odd", "strange", "surreal")}
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city", "and",
          "its", "cast", "plot", "ending", "really", "quite", "music")
TRAIN_PER_CLASS, TEST_PER_CLASS = 90, 30


def write_text_folder(root: Path, seed: int = 7) -> Path:
    """`root/{train,test}/<class>/<i>.txt`: keyword sentences, one per file."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                (folder / f"{i}.txt").write_text(" ".join(keyword_words(rng, name)).capitalize()
                                                 + ".", encoding="utf-8")
    return root


def keyword_words(rng, name: str) -> list[str]:
    """4 to 9 filler words with one keyword of class `name` at a random place.

    The texts of every text-model test (here and tests/components/train/test_text_train.py):
    a model that learns reaches far above chance in two epochs.
    """
    words = list(rng.choice(FILLER, size=int(rng.integers(4, 10))))
    words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(KEYWORDS[name])))
    return words


def prepare_and_train(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared data dir, trained model dir), made once per test session and shared."""
    root = _once(tmp_path_factory, "ampflow-text-run", _prepare_and_train)
    return root / "prepared", root / "model"


def export_text_model(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(data dir, model dir, exported version dir): `run_export` behind a passed verdict, once.

    The version is `<root>/serving/reviews/1` with 4 warm-up Predict requests on text.
    """
    data_dir, model_dir = prepare_and_train(tmp_path_factory)

    def export(root: Path) -> None:
        import json
        import shutil

        from ampflow.components.evaluate_parity import model_sha256
        from ampflow.components.export_savedmodel import ExportConfig, run_export

        shutil.rmtree(root / "serving", ignore_errors=True)  # a run killed half-way
        (root / "eval").mkdir(exist_ok=True)
        (root / "eval" / "verdict.json").write_text(json.dumps(
            {"passed": True, "failed_checks": [], "model_sha256": model_sha256(model_dir)}))
        run_export(ExportConfig(model_dir=model_dir, data_dir=data_dir, eval_dir=root / "eval",
                                export_base=root / "serving", model_name="reviews",
                                num_warmup_records=4))

    root = _once(tmp_path_factory, "ampflow-text-export", export)
    return data_dir, model_dir, root / "serving" / "reviews" / "1"


def _once(tmp_path_factory, name: str, make) -> Path:
    """`make(root)` run once per test session, whichever pytest-xdist worker comes first.

    The export and the convert tests both need the trained model and its export; under
    pytest-xdist they may run in two workers, so the first to come makes it under a file lock
    in the session's shared temp dir (the workers' basetemps' parent) and the other reuses it.
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "done").is_file():
            make(root)
            (root / "done").write_text("")
    return root


def _prepare_and_train(root: Path) -> None:
    """prepare-data and train through the CLI, as a user runs them, into `root`."""
    import shutil

    from ampflow.cli import main

    data_dir, model_dir = root / "prepared", root / "model"
    for leftover in ("reviews", data_dir.name, model_dir.name):  # a run killed half-way
        shutil.rmtree(root / leftover, ignore_errors=True)
    folder = write_text_folder(root / "reviews")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["prepare-data", "--text-folder", str(folder), "--output-dir",
                     str(data_dir)]) == 0, stdout.getvalue()
        # --xla off: XLA's compile costs the suite ~10 s and changes nothing exported
        code = main(["train", "--data-dir", str(data_dir), "--output-dir", str(model_dir),
                     "--model", "bert_tiny", "--precision", "mixed_float16", "--xla", "off",
                     "--max-sequence-length", str(SEQ), "--epochs", "2", "--seed", "1"])
    assert code == 0, stdout.getvalue()
