"""Progress displays (issue 25): a bar on a terminal, plain periodic lines elsewhere, nothing
under quiet; and `ampflow train` as a user sees it, under a pseudo-terminal and through a pipe.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from ampflow import progress as progress_module
from ampflow.errors import ConfigError
from ampflow.progress import Progress, configure, settings

CONTROL = re.compile(r"[\r\x1b]")  # a carriage return or the start of an ANSI escape


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (no size: the bar takes its fallback width)."""

    def isatty(self):
        return True


@pytest.fixture
def clean_env(monkeypatch):
    """The progress variables unset, and unset again after the test even where `configure()`
    set them: `delenv(raising=False)` of an unset variable records nothing for monkeypatch to
    undo, so set first (test_configure_... left AMPFLOW_PROGRESS_EVERY_S=2.0 in the process)."""
    for name in (progress_module.QUIET_ENV, progress_module.EVERY_S_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _run(progress: Progress, steps: int, pause_s: float = 0.0, values=None) -> None:
    for _ in range(steps):
        if pause_s:
            time.sleep(pause_s)
        progress.update(values=values)
    progress.close()


# ---- the abstraction -----------------------------------------------------------------------

def test_progress_on_a_terminal_is_a_bar_redrawn_in_place_with_the_rate_and_values(clean_env):
    terminal = FakeTerminal()
    shown = Progress(20, "epoch 1/2", items_per_unit=32, item="img", remaining_after=20,
                     stream=terminal)
    assert shown.mode == "bar"
    _run(shown, 20, pause_s=0.012, values={"loss": 0.25, "scale": 32768.0})
    text = terminal.getvalue()
    redraws = text.split("\r")
    counts = {m.group(1) for m in re.finditer(r"\| (\d+)/20 ", text)}
    assert len(redraws) > 3 and len(counts) >= 3, text  # it advanced in place
    assert "20/20" in redraws[-1] and "loss 0.2500" in text
    assert "scale 32768" in text and "run ETA" in text  # (no room for img/s in 100 columns)


def _terminal_of(columns: int):
    """(the master fd, the slave as a text stream) of a real pseudo-terminal `columns` wide."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, os.fdopen(slave, "w", encoding="utf-8")


def _drawn(master: int) -> list[str]:
    """Every redraw the terminal received, escape codes removed."""
    os.set_blocking(master, False)
    raw = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        raw += chunk
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", raw.decode("utf-8", "replace"))
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


@pytest.mark.parametrize("columns, kept", [
    (80, ("loss", "run ETA")),
    (120, ("loss", "run ETA", "scale", "img/s")),
])
def test_the_training_bar_drops_fields_not_the_bar_to_fit_the_terminal(columns, kept, clean_env):
    # Before: at 80 columns tqdm drew the bar one character wide and cut the loss scale and
    # the run's ETA off the end of the line.
    master, terminal = _terminal_of(columns)
    try:
        shown = Progress(100, "epoch 1/8", items_per_unit=32, item="img",
                         remaining_after=700, stream=terminal)
        for _ in range(10):
            time.sleep(0.012)
            shown.update(10, values={"loss": 0.2345, "accuracy": 0.9, "scale": 32768.0})
        shown.close()
        terminal.flush()
        lines = _drawn(master)
    finally:
        terminal.close()
        os.close(master)
    final = lines[-1]
    assert final.startswith("epoch 1/8: 100%|"), lines
    for line in lines:
        assert len(line) <= columns, (columns, line)
        bar = line.split("|")[1]
        assert len(bar) >= progress_module.MIN_BAR_WIDTH, (columns, line)
    for name in kept:
        assert name in final, (columns, final)
    assert columns > 80 or "accuracy" not in final  # the least wanted goes first


def test_progress_off_a_terminal_writes_plain_lines_every_every_s(clean_env, caplog):
    stream = io.StringIO()
    caplog.set_level(logging.INFO, logger="ampflow.progress")
    shown = Progress(30, "convert", unit="example", every_s=0.05, stream=stream)
    assert shown.mode == "lines"
    began = time.monotonic()
    _run(shown, 30, pause_s=0.01, values=lambda: {"max |diff|": 0.001})
    elapsed = time.monotonic() - began  # ~0.3 s; seconds on a loaded host (14 lines seen)
    lines = [r.getMessage() for r in caplog.records]
    assert stream.getvalue() == ""  # lines go to the log, with its time stamps
    # the first line, at most one per 0.05 s after it, and the closing line
    assert 2 <= len(lines) <= elapsed / 0.05 + 2, (elapsed, lines)
    assert all(re.match(r"convert: example \d+/30 \(\d+%\), [\d.,]+ example/s", x)
               for x in lines), lines
    assert "ETA" in lines[0] and lines[-1].startswith("convert: example 30/30 (100%)")
    assert re.search(r", in \d\d:\d\d$", lines[-1])
    assert not any(CONTROL.search(x) for x in lines)


@pytest.mark.parametrize("unset", ["no_handler", "above_info"])
def test_progress_lines_go_to_the_stream_where_logging_does_not_show_info(unset, clean_env,
                                                                          monkeypatch):
    logger = logging.getLogger("ampflow.progress")
    if unset == "no_handler":
        monkeypatch.setattr(logger, "hasHandlers", lambda: False)
    else:
        monkeypatch.setattr(logger, "isEnabledFor", lambda level: level >= logging.WARNING)
    stream = io.StringIO()
    _run(Progress(3, "script", every_s=1e-6, stream=stream), 3, pause_s=0.001)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("script: step 1/3") and lines[-1].startswith("script: step 3/3")
    assert not CONTROL.search(stream.getvalue())


def test_progress_a_step_shorter_than_every_s_writes_no_line(clean_env, caplog):
    caplog.set_level(logging.INFO, logger="ampflow.progress")
    _run(Progress(100, "fast", stream=io.StringIO()), 100)
    assert not caplog.records


@pytest.mark.parametrize("how", ["quiet", "env", "not_chief"])
def test_progress_quiet_or_not_the_chief_shows_nothing(how, clean_env, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ampflow.progress")
    terminal = FakeTerminal()
    kwargs = {"quiet": True} if how == "quiet" else {"enabled": False} if how == "not_chief" \
        else {}
    if how == "env":
        monkeypatch.setenv(progress_module.QUIET_ENV, "1")
    shown = Progress(10, "x", every_s=1e-6, stream=terminal, **kwargs)
    assert shown.mode == "off"
    _run(shown, 10, pause_s=0.001, values=lambda: pytest.fail("values read while quiet"))
    assert terminal.getvalue() == "" and not caplog.records


def test_progress_values_are_computed_only_when_a_display_is_due(clean_env):
    calls = []
    shown = Progress(1000, "x", every_s=3600, stream=io.StringIO())
    for _ in range(1000):
        shown.update(values=lambda: calls.append(1) or {})
    assert calls == []  # 1,000 updates within every_s: no display, no values read


def test_keras_callback_counts_the_batches_of_a_predict(clean_env, caplog):
    import keras
    import numpy as np

    caplog.set_level(logging.INFO, logger="ampflow.progress")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with Progress(5, "predict", unit="batch", every_s=1e-6, stream=io.StringIO()) as shown:
        model.predict(np.zeros((10, 3), "float32"), batch_size=2, verbose=0,
                      callbacks=[progress_module.keras_callback(shown)])
    assert shown.n == 5
    assert caplog.records[-1].getMessage().startswith("predict: batch 5/5 (100%)")


def test_track_counts_the_items_a_generator_yields(clean_env, caplog):
    caplog.set_level(logging.INFO, logger="ampflow.progress")

    def examples():
        for i in progress_module.track(range(4), 4, "prepare", unit="example", every_s=1e-6,
                                       stream=io.StringIO()):
            yield i * 2

    assert list(examples()) == [0, 2, 4, 6]
    assert caplog.records[-1].getMessage().startswith("prepare: example 4/4 (100%)")


def test_configure_writes_the_environment_children_inherit(clean_env):
    assert settings() == progress_module.Settings(quiet=False, every_s=30.0)
    configure(quiet=True, every_s=2)
    assert settings() == progress_module.Settings(quiet=True, every_s=2.0)
    child = subprocess.run(
        [sys.executable, "-c", "from ampflow.progress import settings; print(settings())"],
        capture_output=True, text=True, check=True)
    assert "quiet=True, every_s=2.0" in child.stdout
    configure(quiet=False)
    assert not settings().quiet


@pytest.mark.parametrize("bad", ["0", "-1", "soon", "nan"])
def test_progress_every_s_from_the_environment_must_be_positive(bad, clean_env, monkeypatch):
    monkeypatch.setenv(progress_module.EVERY_S_ENV, bad)
    with pytest.raises(ConfigError, match="AMPFLOW_PROGRESS_EVERY_S must be a number of seconds"
                                          f" > 0. Received: AMPFLOW_PROGRESS_EVERY_S='{bad}'"):
        settings()


def test_display_stream_respects_a_replaced_stderr(monkeypatch):
    replaced = io.StringIO()
    monkeypatch.setattr(sys, "stderr", replaced)
    monkeypatch.setattr(progress_module, "_terminal", FakeTerminal())
    assert progress_module.display_stream() is replaced  # the demo's router, a capture


def _in_a_pty(argv: list[str], env: dict, timeout: int = 240) -> str:
    """Run `argv` with stdout and stderr on a new pseudo-terminal; everything it showed."""
    main, child = os.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=child, stderr=child,
                            env=env, close_fds=True)
    os.close(child)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the child side closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(main)
        proc.wait(timeout=30)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode(errors="replace")


def test_keep_terminal_draws_the_bar_on_the_terminal_while_stderr_goes_through_a_filter(
        clean_env):
    # what `ampflow` does: keep the terminal, then send fd 2 through a line filter (here a pipe
    # nobody reads to the end): the bar must still reach the terminal, redrawn in place
    script = textwrap.dedent("""
        import os, sys, time
        from ampflow import progress
        progress.keep_terminal()
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        shown = progress.Progress(5, "kept", stream=None)
        print("mode", shown.mode, flush=True)
        for _ in range(5):
            time.sleep(0.15)
            shown.update()
        shown.close()
    """)
    out = _in_a_pty([sys.executable, "-c", script], dict(os.environ), timeout=60)
    assert "mode bar" in out and out.count("kept:") >= 3, out
    assert re.search(r"kept: +\d+%.*\r.*kept: 100%.*5/5", out, re.S), out


# ---- `ampflow train` as a user sees it ----------------------------------------------------

def _train_argv(data_dir, out) -> list[str]:
    return ["train", "--data-dir", str(data_dir), "--output-dir", str(out), "--epochs", "1",
            "--steps-per-epoch", "40", "--precision", "float32"]


@pytest.mark.slow
def test_train_under_a_terminal_shows_the_bar_advance_within_the_epoch(prepared_digits,
                                                                       tmp_path, clean_env):
    # the console script's own path: its stderr goes through the line filter, which the bar
    # bypasses (src/ampflow/cli.py calls progress.keep_terminal() first)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = _in_a_pty([sys.executable, "-m", "ampflow.cli", *_train_argv(prepared_digits,
                                                                       tmp_path)], env)
    epoch_end = out.index("epoch 1/1: loss")
    bar = out[:epoch_end]
    counts = {int(m.group(1)) for m in re.finditer(r"epoch 1/1: +\d+%\|[^|]*\| (\d+)/40 ", bar)}
    assert len(counts) >= 3 and 0 < min(counts - {0}) < 40 and 40 in counts, bar[-3000:]
    assert "\r" in bar and "img/s" in bar and re.search(r"loss \d\.\d{4}, accuracy", bar)


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True], ids=["lines", "quiet"])
def test_train_through_a_pipe_logs_periodic_plain_lines_or_none_when_quiet(
        prepared_digits, tmp_path, quiet, clean_env):
    # a line due at every step (every_s ~0): the first is written only every_s after the
    # epoch began, and a fast host may run all 40 steps within a fixed 0.2 s; at most one line
    # per every_s is the unit test's claim (test_progress_off_a_terminal_writes_plain_lines_...)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
           progress_module.EVERY_S_ENV: "1e-6", progress_module.QUIET_ENV: "1" if quiet else ""}
    run = subprocess.run([sys.executable, "-m", "ampflow.cli",
                          *_train_argv(prepared_digits, tmp_path)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [x for x in run.stderr.splitlines() if "ampflow.progress:" in x]
    assert "epoch 1/1: loss" in run.stderr
    assert not CONTROL.search(run.stdout + run.stderr)
    # absl's per-checkpoint timing line is start-up noise like TF's (src/ampflow/tf_startup.py)
    assert "Sharding callback duration" not in run.stderr
    if quiet:
        assert lines == []
        return
    steps = [int(m.group(1)) for x in lines
             for m in [re.search(r"epoch 1/1: step (\d+)/40 \(\d+%\)", x)] if m]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == 40, lines
    assert any(re.search(r"img/s, loss \d\.\d{4}, accuracy \d\.\d{4}, ETA", x) for x in lines)


def test_train_display_shows_what_telemetry_read_and_reads_nothing_itself(monkeypatch):
    import keras
    import numpy as np

    from ampflow.components.train.run import telemetry as telemetry_module
    from ampflow.components.train.run.loop import TELEMETRY_KEY, progress_values
    from ampflow.components.train.run.telemetry import GuardLimits, LossScaleTelemetry

    reads = []
    real = keras.ops.convert_to_numpy
    monkeypatch.setattr(telemetry_module.keras.ops, "convert_to_numpy",
                        lambda x: reads.append(1) or real(x))
    callback = LossScaleTelemetry(GuardLimits(warmup_steps=1000), every_n=4)
    callback.set_params({"steps": 10, "epochs": 1})
    callback.on_epoch_begin(0)
    # [loss, scale, iterations, epoch sums: loss, correct, examples, steps] as loop.py packs it
    packed = keras.ops.convert_to_tensor(np.array([0.5, 1024.0, 4.0, 2.4, 96.0, 128.0, 4.0]))
    for batch in range(6):
        callback.on_train_batch_end(batch, {TELEMETRY_KEY: packed})
    assert len(reads) == 1 and callback.last_read["step"] == 4  # the recorded step only
    assert progress_values(callback.last_read) == {"loss": 0.6, "accuracy": 0.75,
                                                   "scale": 1024.0}
    # without loss scaling: [loss, epoch sums]
    assert progress_values({"loss": 0.5, "epoch_loss_sum": 1.0, "epoch_correct": 3.0,
                            "epoch_examples": 4.0, "epoch_steps": 2.0}) == {
        "loss": 0.5, "accuracy": 0.75}
