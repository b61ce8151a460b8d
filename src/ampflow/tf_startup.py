"""TensorFlow's C++ log lines, filtered as `TF_CPP_MIN_LOG_LEVEL` says they should be.

On a CPU-only machine TensorFlow prints notices and error-level lines through absl before it
reads `TF_CPP_MIN_LOG_LEVEL` (tensorflow/tensorflow#100442), and a newcomer reads them as
failures. `filter_stderr_for_life()` sends this process's stderr (and its children's) through a
small filter process that drops those lines and passes everything else untouched; a process,
so a crash's last lines still come out. Which lines, and why:
docs/explanation/design-notes.md, "tf_startup.py".
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys

# absl's line prefix: severity letter, MMDD, time, thread id, file:line]
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] (.*)$")
_SEVERITY = "IWEF"
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
# The second line of the (info-level) CPU feature notice of cpu_feature_guard.cc.
_CONTINUATION = "To enable the following instructions:"
_EXPECTED_ERRORS = ("oneDNN supports DT_HALF only on platforms with AVX-512",)
_NO_GPU_ERRORS = ("failed call to cuInit",)
_NVIDIA_DEVICE = "/dev/nvidiactl"


def is_tensorflow_noise(line: str, min_level: int, has_gpu: bool) -> bool:
    """Whether one stderr line is noise (see the module docstring)."""
    text = line.rstrip("\n")
    if text.startswith(_ABSL_NOTICE) or (min_level >= 1 and text.startswith(_CONTINUATION)):
        return True
    match = _ABSL_LINE.match(text)
    if not match:
        return False
    severity, message = _SEVERITY.index(match.group(1)), match.group(2)
    if severity < min_level or message.startswith(_EXPECTED_ERRORS):
        return True
    return not has_gpu and message.startswith(_NO_GPU_ERRORS)


def filter_stderr_for_life() -> None:
    """Route fd 2 of this process through the filter process until this process exits."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
        filter_proc = subprocess.Popen(
            [sys.executable, "-m", "ampflow.tf_startup"], stdin=read_end, stdout=2, stderr=2,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": str(_min_level())})
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return  # unfiltered, as without this call
    original = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    os.close(read_end)

    def restore() -> None:  # later lines go straight out; the filter sees EOF and ends
        sys.stderr.flush()
        os.dup2(original, 2)
        try:
            filter_proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass  # a child still writes through it; it ends with that child

    atexit.register(restore)


def _min_level() -> int:
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def _filter(stdin, stdout) -> None:
    """Copy the lines of `stdin` that are not noise to `stdout` (binary streams)."""
    min_level, has_gpu = _min_level(), os.path.exists(_NVIDIA_DEVICE)
    for raw in stdin:
        if not is_tensorflow_noise(raw.decode(errors="replace"), min_level, has_gpu):
            stdout.write(raw)
            stdout.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the command, not its stderr
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _filter(sys.stdin.buffer, sys.stdout.buffer)
