"""TensorFlow's C++ start-up lines: filtered by default in every `ampflow` command, kept on ask.

The lines below are the ones TensorFlow 2.21 prints on this kind of machine (2 cores, no GPU),
copied from a real `import tensorflow`.
"""

import os
import subprocess
import sys

import pytest

from ampflow.cli import _shows_everything
from ampflow.tf_startup import filtered_stderr_fd, is_startup_noise

ABSL_NOTICE = ("WARNING: All log messages before absl::InitializeLog() is called are written "
               "to STDERR")
ONEDNN = ("I0000 00:00:1796295946.427682   10024 port.cc:153] oneDNN custom operations are "
          "on. You may see slightly different numerical results due to floating-point "
          "round-off errors from different computation orders. To turn them off, set the "
          "environment variable `TF_ENABLE_ONEDNN_OPTS=0`.")
CUDART = ("I0000 00:00:1796295946.428048   10024 cudart_stub.cc:31] Could not find cuda "
          "drivers on your machine, GPU will not be used.")
CPU_GUARD = ("I0000 00:00:1796295946.496038   10024 cpu_feature_guard.cc:227] This TensorFlow "
             "binary is optimized to use available CPU instructions in performance-critical "
             "operations.")
CPU_GUARD_2 = ("To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other "
               "operations, rebuild TensorFlow with the appropriate compiler flags.")
CUINIT = ("E0000 00:00:1796295950.765384   10024 cuda_platform.cc:52] failed call to cuInit: "
          "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
A_REAL_ERROR = ("E0000 00:00:1796295950.765384   10024 bfc_allocator.cc:475] Allocator ran "
                "out of memory trying to allocate 2.0GiB")
A_WARNING = "W0000 00:00:1796295950.765384   10024 op_kernel.cc:1840] OP_REQUIRES failed"


@pytest.mark.parametrize("line", [ABSL_NOTICE, ONEDNN, CUDART, CPU_GUARD, CPU_GUARD_2, CUINIT])
def test_startup_lines_of_a_cpu_only_machine_are_noise_at_the_cli_level(line):
    assert is_startup_noise(line + "\n", min_level=2, has_gpu=False)


def test_errors_python_output_and_cuinit_on_a_gpu_machine_are_kept():
    for line in (A_REAL_ERROR, "Traceback (most recent call last):", "UserWarning: x"):
        assert not is_startup_noise(line, min_level=2, has_gpu=False)
    assert not is_startup_noise(CUINIT, min_level=2, has_gpu=True)  # a real error there
    # TF_CPP_MIN_LOG_LEVEL's meaning: 0 keeps info, 1 drops info, 2 drops warnings too
    assert not is_startup_noise(ONEDNN, min_level=0, has_gpu=False)
    assert is_startup_noise(ONEDNN, min_level=1, has_gpu=False)
    assert not is_startup_noise(A_WARNING, min_level=1, has_gpu=False)
    assert is_startup_noise(A_WARNING, min_level=2, has_gpu=False)


def test_filtered_stderr_fd_drops_the_noise_written_to_fd_2_and_writes_back_the_rest(
        capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    with filtered_stderr_fd():  # C++ code writes to the descriptor, not to sys.stderr
        os.write(2, f"{ABSL_NOTICE}\n{ONEDNN}\n{A_REAL_ERROR}\n".encode())
        print("python says", file=sys.stderr)
    err = capfd.readouterr().err
    assert sorted(err.splitlines()) == sorted([A_REAL_ERROR, "python says"])


def test_verbose_or_debug_shows_everything_read_before_parsing():
    assert _shows_everything(["demo", "--verbose"])
    assert _shows_everything(["--log-level", "DEBUG", "train"])
    assert _shows_everything(["--log-level=DEBUG", "serve"])
    assert not _shows_everything(["--log-level", "INFO", "train", "--epochs", "2"])


@pytest.mark.slow  # two TensorFlow imports in child processes
def test_first_tensorflow_import_prints_no_startup_noise_once_quieted():
    code = ("import sys; from ampflow.tf_startup import quiet_tensorflow_startup;"
            "quiet_tensorflow_startup() if sys.argv[1] == 'quiet' else None;"
            "import tensorflow as tf; print(tf.reduce_sum(tf.ones(3)).numpy())")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}

    def run(mode):
        done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                              text=True, env=env, timeout=300)
        assert done.returncode == 0 and done.stdout == "3.0\n", done.stderr
        return done.stderr

    assert "failed call to cuInit" in run("plain")  # what this machine prints unfiltered
    assert run("quiet") == ""
