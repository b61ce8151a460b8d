"""Checkpoints against a full disk and torn files (issue 24, item 2).

The full disk is simulated with RLIMIT_FSIZE set in the writing process itself (SIGXFSZ
ignored, so that the write fails with EFBIG as on a full disk instead of killing the process):
this test process's soft limit for one save (`_file_size_limit`), a child's for `ampflow
train` (tests/full_disk.py). A tiny filesystem would need root (mount, losetup) or FUSE,
neither of which this machine or CI's runners grant to tests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from full_disk import file_size_limited

from ampflow.components.train.run import checkpoints

pytestmark = pytest.mark.timeout(300)

FILE_SIZE_LIMIT = 16 * 1024  # bytes: the logs fit, no checkpoint of the test model does


def _state(seed: int):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(3)])
    step = tf.Variable(0, dtype=tf.int64)
    return tf.train.Checkpoint(model=model, step=step), model, step


def _save_two(directory: Path):
    import tensorflow as tf

    checkpoint, model, step = _state(1)
    manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=2,
                                         checkpoint_name="ckpt")
    saved = {}
    for number in (1, 2):
        model.layers[0].kernel.assign(np.full((64, 256), number, np.float32))
        step.assign(number)
        checkpoints.save(manager, number)
        saved[number] = f"{directory}/ckpt-{number}"
    return saved


def _restored(directory: Path):
    checkpoint, model, step = _state(7)
    path = checkpoints.restore(checkpoint, str(directory))
    return path, int(step.numpy()), float(model.layers[0].kernel.numpy()[0, 0])


@pytest.mark.parametrize("damage", ["truncated index", "truncated data", "missing data",
                                    "flipped byte in data"])
def test_unreadable_latest_checkpoint_falls_back_to_the_previous_and_says_so(
        tmp_path, caplog, damage):
    saved = _save_two(tmp_path)
    index = Path(saved[2] + ".index")
    (data,) = Path(tmp_path).glob("ckpt-2.data-*")
    if damage == "truncated index":
        index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    elif damage == "truncated data":
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    elif damage == "missing data":
        data.unlink()
    else:
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        path, step, weight = _restored(tmp_path)
    assert (path, step, weight) == (saved[1], 1, 1.0)
    assert f"checkpoint {saved[2]} is unreadable" in caplog.text
    assert f"falling back to {saved[1]}" in caplog.text


def test_readable_latest_checkpoint_is_restored_without_a_warning(tmp_path, caplog):
    saved = _save_two(tmp_path)
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        assert _restored(tmp_path) == (saved[2], 2, 2.0)
    assert not caplog.records


def test_every_checkpoint_unreadable_refuses_instead_of_starting_from_scratch(tmp_path):
    _save_two(tmp_path)
    for index in tmp_path.glob("*.index"):
        index.write_bytes(b"\x00" * 10)
    with pytest.raises(checkpoints.CheckpointError, match="refusing to start over"):
        _restored(tmp_path)


def test_no_checkpoint_starts_from_scratch(tmp_path):
    path, step, _weight = _restored(tmp_path)
    assert (path, step) == (None, 0)



@contextlib.contextmanager
def _file_size_limit(limit: int):
    """Writes of this process past `limit` bytes fail with EFBIG, as on a full disk, inside
    the block: the soft limit only (the hard one is kept, so the old soft limit can come
    back), with SIGXFSZ ignored meanwhile. In process: the child that did it imported
    TensorFlow again (~6 CPU-s) for one save."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, handler)


def test_checkpoint_write_on_a_full_disk_fails_clearly_and_keeps_the_previous_one(tmp_path):
    """Checkpoint 1 is saved, the disk fills up, and the save of 2 fails."""
    import tensorflow as tf

    checkpoint, model, step = _state(1)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2,
                                         checkpoint_name="ckpt")
    step.assign(1)
    model.layers[0].kernel.assign(np.full((64, 256), 1, np.float32))
    checkpoints.save(manager, 1)
    step.assign(2)
    model.layers[0].kernel.assign(np.full((64, 256), 2, np.float32))
    with _file_size_limit(FILE_SIZE_LIMIT), pytest.raises(checkpoints.CheckpointError) as info:
        checkpoints.save(manager, 2)
    (line,) = str(info.value).splitlines()
    assert line.startswith("could not write the checkpoint of step 2")
    assert "ckpt-1" in line and "free space and rerun" in line
    assert _restored(tmp_path) == (f"{tmp_path}/ckpt-1", 1, 1.0)


@pytest.mark.slow  # trains through the ampflow CLI in a child process
def test_train_on_a_full_disk_exits_1_with_one_line(prepared_digits, tmp_path):
    """`ampflow train` whose process cannot write its first checkpoint: one line, exit 1.

    Two steps: the first checkpoint is written at the end of epoch 1, whatever its length."""
    cmd = [sys.executable, "-m", "ampflow.cli", "train", "--data-dir", str(prepared_digits),
           "--output-dir", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt"),
           "--epochs", "1", "--steps-per-epoch", "2", "--precision", "float32"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(file_size_limited(cmd, FILE_SIZE_LIMIT), capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # `ampflow train` on a CPU-only machine: none of TensorFlow's C++ start-up lines
    # (tests/test_tf_startup.py), and its own log lines do show
    assert not re.search(r"cuInit|cudart|cuda drivers|oneDNN|absl::InitializeLog",
                         done.stdout + done.stderr), done.stderr[:2000]
    assert "AMP check ok" in done.stderr
    errors = [line for line in done.stderr.splitlines() if "could not write the checkpoint" in line]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "none yet" in errors[0]


# `ampflow train` (argv after the first two) whose save of step argv[1] returns, then touches
# the file argv[2] and waits for its SIGKILL: the kill lands after a known checkpoint on any
# host, where a kill timed from outside raced the run's remaining epochs.
_HELD_AFTER_SAVE = textwrap.dedent("""
    import runpy, sys, time
    from ampflow.components.train.run import checkpoints
    hold_at, saved_marker = int(sys.argv[1]), sys.argv[2]
    real_save = checkpoints.save

    def save(manager, step):
        path = real_save(manager, step)
        if step == hold_at:
            open(saved_marker, "w").close()
            time.sleep(600)
        return path

    checkpoints.save = save
    sys.argv = ["ampflow", *sys.argv[3:]]
    runpy.run_module("ampflow.cli", run_name="__main__")
""")


@pytest.mark.slow  # trains through the ampflow CLI in a child process
def test_train_killed_then_latest_checkpoint_torn_resumes_from_the_previous_one(
        prepared_digits, tmp_path, caplog):
    """A retried pod: the first run is SIGKILLed, then the newest checkpoint's data file is
    cut short (a copy or disk fault). The second run gets a NEW output dir (as a KFP retry
    does) and the same --checkpoint-dir: it says the newest is unreadable, resumes from the one
    before, and finishes the planned epochs.

    One kill/resume pair checks both the durable resume and the torn-checkpoint fallback (it
    was two runs of the same work; tests/components/train/test_train.py pointed here). The
    first run is killed once its epoch-3 checkpoint is saved (`_HELD_AFTER_SAVE`), so the
    second resumes at epoch 3 from epoch 2's and trains 3 and 4: 5 epochs in all, where a
    kill timed from outside needed 15 planned to land before the run ended.
    """
    import io
    import json
    import time

    from ampflow.cli import main

    durable = tmp_path / "durable"
    epochs, killed_after = 4, 3
    # What is checked is epoch-level (which checkpoint, which epochs, how many lines), not the
    # steps inside an epoch: 10 steps instead of the digits' full 45.
    steps_per_epoch = 10

    def args(out):
        return ["train", "--data-dir", str(prepared_digits), "--output-dir", str(out),
                "--checkpoint-dir", str(durable), "--epochs", str(epochs), "--steps-per-epoch",
                str(steps_per_epoch), "--precision", "float32"]

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    saved = tmp_path / "saved"
    first = subprocess.Popen(
        [sys.executable, "-c", _HELD_AFTER_SAVE, str(killed_after * steps_per_epoch),
         str(saved), *args(tmp_path / "pod1")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and first.poll() is None and not saved.exists():
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=30)
    assert saved.exists() and first.returncode == -signal.SIGKILL, first.returncode
    assert durable.joinpath("backup").is_dir() and not (tmp_path / "pod1" / "backup").exists()
    backup = str(durable / "backup")
    newest, previous = checkpoints.checkpoint_paths(backup)[:2]
    assert newest.endswith(f"-{killed_after * steps_per_epoch}"), newest
    for data in Path(backup).glob(Path(newest).name + ".data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    # The retry in this process: what it resumes from is on disk only, and the child
    # that would run it imported TensorFlow again (the process-level checks of `ampflow
    # train` are test_train_on_a_full_disk_exits_1_with_one_line's)
    out = tmp_path / "pod2"
    with caplog.at_level(logging.INFO), contextlib.redirect_stdout(io.StringIO()):
        assert main(args(out)) == 0, caplog.text[-3000:]
    assert f"checkpoint {newest} is unreadable" in caplog.text
    assert f"falling back to {previous}" in caplog.text
    assert f"restored {previous}" in caplog.text
    assert f"epoch {epochs}/{epochs}" in caplog.text
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["resumed"] and meta["resumed_at_epoch"] == killed_after
    assert [e["epoch"] for e in meta["epochs"]] == list(range(1, epochs + 1))
    assert len((out / "epochs.jsonl").read_text().splitlines()) == epochs
    assert not (durable / "backup").exists()  # removed after the successful run


def _access_errors():
    import tensorflow as tf

    return {
        "permission denied": tf.errors.PermissionDeniedError(None, None, "ckpt: Permission denied"),
        "unavailable": tf.errors.UnavailableError(None, None, "ckpt: Transport endpoint is not "
                                                              "connected"),
        "unknown from the reader": tf.errors.OpError(None, None, "ckpt-2.index; Permission "
                                                                 "denied", tf.errors.UNKNOWN),
        "os error": PermissionError(13, "Permission denied", "ckpt-2.index"),
    }


@pytest.mark.parametrize("kind", ["permission denied", "unavailable", "unknown from the reader",
                                  "os error"])
def test_an_access_error_is_no_corruption_and_is_raised_not_fallen_back_from(
        tmp_path, monkeypatch, caplog, kind):
    """A permission error or a storage hiccup says nothing about the file: falling back to an
    older checkpoint (or refusing as if all were damaged) would hide it and lose steps. Fault
    injected at the reader: this machine runs tests as root, which no file mode stops."""
    import tensorflow as tf

    saved = _save_two(tmp_path)
    error = _access_errors()[kind]

    def reader_failing(path):
        raise error

    monkeypatch.setattr(tf.train, "load_checkpoint", reader_failing)
    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        with pytest.raises(checkpoints.CheckpointError) as info:
            _restored(tmp_path)
    message = str(info.value)
    assert message.startswith(f"could not read the checkpoint {saved[2]} (")
    assert "denied" in message or "not connected" in message  # its own message
    assert "falling back" not in caplog.text
