"""TensorFlow's C++ start-up lines, filtered as `TF_CPP_MIN_LOG_LEVEL` says they should be.

Importing TensorFlow 2.21 on a CPU-only machine prints, through absl before anything calls
`absl::InitializeLog()`, a notice about that, the oneDNN notice, "Could not find cuda drivers",
the CPU-feature notice, and, at the first device discovery, an error-level "failed call to
cuInit". `TF_CPP_MIN_LOG_LEVEL` does not reach these lines (absl logs them before TensorFlow
reads it: tensorflow/tensorflow#100442), and a newcomer reads them as failures.

`quiet_tensorflow_startup()` installs an import hook: the first `import tensorflow` of the
process (whoever imports it: keras, the serving client, a step) runs with file descriptor 2
sent to a temporary file, then finds the devices (where cuInit runs), then puts fd 2 back and
writes out every captured line except the noise: lines below `TF_CPP_MIN_LOG_LEVEL`'s severity
(the CLI sets 2: errors only), absl's "before InitializeLog" notice, and the cuInit error on a
machine without an NVIDIA device node (on a GPU machine it is a real error and is kept). Python
warnings and errors of that window, and everything after it, pass through untouched.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# absl's line prefix: severity letter, MMDD, time, thread id, file:line]
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] (.*)$")
_SEVERITY = "IWEF"
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
# The second line of the (info-level) CPU feature notice of cpu_feature_guard.cc.
_CONTINUATION = "To enable the following instructions:"
_NO_GPU_ERRORS = ("failed call to cuInit",)
_NVIDIA_DEVICE = "/dev/nvidiactl"


def quiet_tensorflow_startup() -> None:
    """Filter the start-up lines of this process's first `import tensorflow` (idempotent)."""
    if "tensorflow" in sys.modules:
        return
    if not any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())


def is_startup_noise(line: str, min_level: int, has_gpu: bool) -> bool:
    """Whether one line of the start-up window is noise (see the module docstring)."""
    text = line.rstrip("\n")
    if text.startswith(_ABSL_NOTICE) or (min_level >= 1 and text.startswith(_CONTINUATION)):
        return True
    match = _ABSL_LINE.match(text)
    if not match:
        return False
    severity, message = _SEVERITY.index(match.group(1)), match.group(2)
    if severity < min_level:
        return True
    return not has_gpu and any(message.startswith(e) for e in _NO_GPU_ERRORS)


@contextlib.contextmanager
def filtered_stderr_fd() -> Iterator[None]:
    """Send fd 2 to a temporary file for the block; then write back what is not noise."""
    min_level = _min_level()
    has_gpu = os.path.exists(_NVIDIA_DEVICE)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(x for x in lines if not is_startup_noise(x, min_level, has_gpu))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def _min_level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the next finders do, with a loader that runs it filtered."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the real finders answer from here on
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """Runs the wrapped loader's `exec_module` and the device discovery in the filter."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            with filtered_stderr_fd():
                self._loader.exec_module(module)
                module.config.list_physical_devices()  # cuInit runs here, not at import
        finally:  # the module keeps its own loader (resources, reload)
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader
