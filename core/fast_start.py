"""Keras's start-up without scikit-learn: every ampflow process that imports TensorFlow.

`import tensorflow` imports Keras, and Keras imports scikit-learn at start-up when it is
installed, only to define its `keras.wrappers.SKLearn*` estimator wrappers. ampflow installs
scikit-learn (its offline digits dataset ships inside the scikit-learn wheel), so every step,
worker and server process paid for an import it never used: about 1.2 of 5.5 CPU-seconds of
`import tensorflow` on a 2-core Zen 4 host, side by side in one minute (4.3-4.5 s without it).

The finder below makes scikit-learn look absent to Keras's wrapper modules only, which is a
case Keras supports (the wrappers then raise "requires scikit-learn" when used); every other
importer, ampflow's own `sklearn.datasets.load_digits` included, gets the real package. If
scikit-learn was imported before Keras, nothing changes. Installed when the `ampflow` package
is imported, which every ampflow entry point does before it imports TensorFlow.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

KERAS_WRAPPERS = "keras.src.wrappers"


class KerasWithoutScikitLearn(MetaPathFinder):
    """`import sklearn` fails (ModuleNotFoundError) when Keras's wrapper modules ask for it."""

    def find_spec(self, name, path=None, target=None):
        if name != "sklearn":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__", "").startswith(KERAS_WRAPPERS):
                raise ModuleNotFoundError(
                    "scikit-learn is not imported for Keras's sklearn wrappers in ampflow "
                    "processes (ampflow.fast_start)", name=name)
            frame = frame.f_back
        return None  # anyone else: the normal finders


def install() -> None:
    """Put the finder first on `sys.meta_path`, once."""
    if not any(isinstance(f, KerasWithoutScikitLearn) for f in sys.meta_path):
        sys.meta_path.insert(0, KerasWithoutScikitLearn())
