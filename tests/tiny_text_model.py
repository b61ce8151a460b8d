"""The test suite's one tiny trained text model, shared by every test that needs one.

A folder of short texts in 3 classes (one file not UTF-8), prepared by `prepare-data
--text-folder` and trained by `ampflow train --model bert_tiny --precision mixed_float16` for 2
epochs at sequence length 16, at the default (the encoders' own) learning rate: the model and
tokenizer every later step gets from a real run. Each text is filler words around one keyword of
its class, so the model learns far above chance (1/3) in two epochs; every test text also holds
a word no training text has (TEST_ONLY_WORD), which must stay out of the vocabulary.

Made once per test run, whichever pytest-xdist worker asks first (`_once`: a file lock in the
session's shared temp dir), so the train, evaluate, export, convert, release and deploy tests
all read the same model: one training for the whole suite. A plain module on the tests' path
(`from tiny_text_model import ...`), not conftest, which cannot be imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEQ = 16
CLASSES = ("gloomy", "happy", "weird")
KEYWORDS = {"gloomy": ("awful", "dreadful", "dull"), "happy": ("great", "superb", "wonderful"),
            "weird": ("odd", "strange", "surreal")}
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city", "and",
          "its", "cast", "plot", "ending", "really", "quite", "music")
TRAIN_PER_CLASS, TEST_PER_CLASS = 90, 30
TEST_ONLY_WORD = "zebra"  # in every test text, in no training text
NOT_UTF8_FILE = ("train", "happy", "latin1.txt")  # skipped by prepare-data, and counted
EPOCHS = 2


@dataclass(frozen=True)
class TrainedTextModel:
    """The shared run: its prepared data, its model dir and what `ampflow train` printed."""

    data_dir: Path
    model_dir: Path
    train_stdout: str


def write_text_folder(root: Path, seed: int = 7) -> Path:
    """`root/{train,test}/<class>/<i>.txt`: keyword sentences, one per file, and one file that
    is not UTF-8."""
    rng = np.random.default_rng(seed)
    for split, count, extra in (("train", TRAIN_PER_CLASS, []),
                                ("test", TEST_PER_CLASS, [TEST_ONLY_WORD])):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                words = keyword_words(rng, name) + extra
                (folder / f"{i}.txt").write_text(" ".join(words).capitalize() + ".",
                                                 encoding="utf-8")
    root.joinpath(*NOT_UTF8_FILE).write_bytes("un film très réussi".encode("latin-1"))
    return root


def keyword_words(rng, name: str) -> list[str]:
    """4 to 9 filler words with one keyword of class `name` at a random place."""
    words = list(rng.choice(FILLER, size=int(rng.integers(4, 10))))
    words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(KEYWORDS[name])))
    return words


def prepared_texts(tmp_path_factory) -> Path:
    """The folder prepared by `prepare-data --text-folder` (no training), once per test run."""
    return _once(tmp_path_factory, "ampflow-text-data", _prepare) / "prepared"


def trained_text_model(tmp_path_factory) -> TrainedTextModel:
    """The prepared data and the trained bert_tiny, made once per test run and shared."""
    data_dir = prepared_texts(tmp_path_factory)
    root = _once(tmp_path_factory, "ampflow-text-run", lambda root: _train(data_dir, root))
    return TrainedTextModel(data_dir, root / "model",
                            (root / "train_stdout.txt").read_text(encoding="utf-8"))


def prepare_and_train(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared data dir, trained model dir) of the shared run."""
    trained = trained_text_model(tmp_path_factory)
    return trained.data_dir, trained.model_dir


def export_text_model(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(data dir, model dir, exported version dir): `run_export` behind a passed verdict, once.

    The version is `<root>/serving/reviews/1` with 4 warm-up Predict requests on text.
    """
    data_dir, model_dir = prepare_and_train(tmp_path_factory)

    def export(root: Path) -> None:
        import json
        import shutil

        from ampflow.artifacts.verdict import model_sha256
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
    """`make(root)` run once per test run, whichever pytest-xdist worker comes first.

    A pytest session fixture would be made once per worker; the first worker to come makes it
    under a file lock in the run's shared temp dir (the workers' basetemps' parent) and the
    others reuse it.
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


def _prepare(root: Path) -> None:
    """The folder written and prepared through the CLI, as a user runs it, into `root`."""
    import shutil

    from ampflow.cli import main

    for leftover in ("reviews", "prepared"):  # a run killed half-way
        shutil.rmtree(root / leftover, ignore_errors=True)
    folder = write_text_folder(root / "reviews")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["prepare-data", "--text-folder", str(folder), "--output-dir",
                     str(root / "prepared")])
    assert code == 0, stdout.getvalue()
    (root / "prepare_stdout.txt").write_text(stdout.getvalue(), encoding="utf-8")


def prepare_stdout(tmp_path_factory) -> str:
    """What `ampflow prepare-data --text-folder` printed for the shared folder."""
    prepared_texts(tmp_path_factory)
    return (_once(tmp_path_factory, "ampflow-text-data", _prepare)
            / "prepare_stdout.txt").read_text(encoding="utf-8")


def _train(data_dir: Path, root: Path) -> None:
    """`ampflow train` through the CLI into `root/model`; its stdout kept beside."""
    import shutil

    from ampflow.cli import main

    shutil.rmtree(root / "model", ignore_errors=True)  # a run killed half-way
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        # --xla off: XLA's compile costs the suite ~10 s and changes nothing exported
        code = main(["train", "--data-dir", str(data_dir), "--output-dir", str(root / "model"),
                     "--model", "bert_tiny", "--precision", "mixed_float16", "--xla", "off",
                     "--max-sequence-length", str(SEQ), "--epochs", str(EPOCHS), "--seed", "1"])
    assert code == 0, stdout.getvalue()
    (root / "train_stdout.txt").write_text(stdout.getvalue(), encoding="utf-8")
