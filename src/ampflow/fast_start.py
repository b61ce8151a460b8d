"""Keras's start-up without scikit-learn, matplotlib and pandas: every ampflow process.

Keras imports those three optional packages at start-up when they are installed, and no
ampflow process uses the Keras features they serve; a finder makes each package look absent to
the Keras modules that import it optionally, and to those only (every other importer gets the
real package). `quiet_python_noise()` drops absl's per-checkpoint "Sharding callback duration"
line. The saving, measured: docs/explanation/design-notes.md, "fast_start.py".
"""

from __future__ import annotations

import logging
import sys
from importlib.abc import MetaPathFinder

# (importer module prefix, the package it imports optionally) that ampflow never needs
OPTIONAL_IMPORTS_OF_KERAS = (
    ("keras.src.wrappers", "sklearn"),
    ("keras.src.visualization", "matplotlib"),
    ("keras.src.trainers.data_adapters", "pandas"),
)
BLOCKED = {package for _, package in OPTIONAL_IMPORTS_OF_KERAS}


class KerasWithoutOptionalPackages(MetaPathFinder):
    """`import <package>` fails when Keras's module that imports it optionally asks.

    ModuleNotFoundError, as if it were not installed; for anyone else the normal finders answer.
    """

    def find_spec(self, name, path=None, target=None):
        if name not in BLOCKED:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            importer = frame.f_globals.get("__name__", "")
            for prefix, package in OPTIONAL_IMPORTS_OF_KERAS:
                if name == package and importer.startswith(prefix):
                    raise ModuleNotFoundError(
                        f"{package} is not imported for {prefix} in ampflow processes "
                        "(ampflow.fast_start)", name=name)
            frame = frame.f_back
        return None


def install() -> None:
    """Put the finder first on `sys.meta_path`, once."""
    if not any(isinstance(f, KerasWithoutOptionalPackages) for f in sys.meta_path):
        sys.meta_path.insert(0, KerasWithoutOptionalPackages())


# absl's Python logger: TensorFlow's checkpoint code logs one INFO line per save through it
# ("Sharding callback duration: 201 microseconds", tensorflow/python/checkpoint/
# functional_saver.py), which fills a training log with a timing only TF's developers read.
_ABSL_LOGGER = "absl"
_PYTHON_NOISE = ("Sharding callback duration",)


class _DropPythonNoise(logging.Filter):
    """Drops absl's start-up and per-checkpoint timing lines (`_PYTHON_NOISE`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_PYTHON_NOISE)


def python_noise_quieted() -> bool:
    """Whether `quiet_python_noise`'s filter is on absl's logger now."""
    return any(type(f).__name__ == _DropPythonNoise.__name__
               for f in logging.getLogger(_ABSL_LOGGER).filters)


def quiet_python_noise(quiet: bool = True) -> None:
    """Silence TensorFlow's Python-side noise, as `tf_startup` filters its C++ lines.

    A filter on absl's logger (not a level: its warnings still show); installing it twice
    adds nothing; `quiet=False` takes it off (`--log-level DEBUG`).
    """
    logger = logging.getLogger(_ABSL_LOGGER)
    # by name: a test that re-imports ampflow makes a second class of the same filter
    installed = [f for f in logger.filters if type(f).__name__ == _DropPythonNoise.__name__]
    if quiet and not installed:
        logger.addFilter(_DropPythonNoise())
    elif not quiet:
        for noise_filter in installed:
            logger.removeFilter(noise_filter)
