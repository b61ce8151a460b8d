"""Progress of the long steps: a live bar on a terminal, a plain line every N seconds elsewhere.

One abstraction for every step that runs for minutes, so a step adds two or three lines
(`with Progress(total=..., desc=..., unit=...) as progress: ... progress.update()`) and never
prints on its own: a `tqdm` bar when stderr is a terminal, one plain log line every `every_s`
seconds elsewhere, nothing when `quiet` or not the chief. Settings live in the environment
(`AMPFLOW_QUIET`, `AMPFLOW_PROGRESS_EVERY_S`) so the processes a step starts inherit them.
Where it shows and what it costs: docs/explanation/design-notes.md, "progress.py".
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TextIO, TypeVar

from ampflow.errors import ConfigError

QUIET_ENV = "AMPFLOW_QUIET"
EVERY_S_ENV = "AMPFLOW_PROGRESS_EVERY_S"
DEFAULT_EVERY_S = 30.0  # the one home of the default (the CLI flag's default is "unset")
BAR_INTERVAL_S = 0.1  # a terminal bar redraws at most this often
_RATE_WINDOW = 20  # a bar's rate is measured over its last this many redraws (~2 s)
MIN_BAR_WIDTH = 10  # a bar is never drawn narrower: fields are dropped first
# The fields a narrow terminal keeps, most wanted first: the loss (is it learning?), the run's
# ETA (when is it done?), the loss scale (is AMP healthy?), the rate; the accuracy last (each
# epoch's line says it). A field not named here goes after them.
KEEP_FIRST = ("loss", "run ETA", "scale", "rate", "ETA", "accuracy")
_UNSIZED_COLUMNS = 100  # a terminal that reports no size is drawn this wide
_TQDM_UNSIZED_BAR = 10  # the bar tqdm draws when given no width
_FALSE = ("", "0", "false", "no", "off")

log = logging.getLogger("ampflow.progress")
Values = Mapping[str, object] | Callable[[], Mapping[str, object]] | None
T = TypeVar("T")

_terminal: TextIO | None = None


@dataclass(frozen=True)
class Settings:
    """What the environment says about progress displays."""

    quiet: bool = False
    every_s: float = DEFAULT_EVERY_S


def configure(*, quiet: bool | None = None, every_s: float | None = None) -> None:
    """Set the progress settings for this process and the processes it starts (None: unchanged).

    >>> configure(quiet=True)            # ampflow --quiet
    >>> configure(every_s=5)             # ampflow --progress-every-s 5
    """
    if every_s is not None:
        _check_every_s(every_s, "progress_every_s")
        os.environ[EVERY_S_ENV] = repr(float(every_s))
    if quiet is not None:
        os.environ[QUIET_ENV] = "1" if quiet else "0"


def settings() -> Settings:
    """The settings in effect: the environment, else the defaults."""
    quiet = os.environ.get(QUIET_ENV, "").strip().lower() not in _FALSE
    raw = os.environ.get(EVERY_S_ENV, "").strip()
    if not raw:
        return Settings(quiet=quiet)
    try:
        every_s = float(raw)
    except ValueError:
        every_s = math.nan
    _check_every_s(every_s, EVERY_S_ENV, raw)
    return Settings(quiet=quiet, every_s=every_s)


def keep_terminal() -> None:
    """Keep this process's stderr for progress bars if it is a terminal (before fd 2 is rerouted).

    The CLI calls it before `ampflow.tf_startup.filter_stderr_for_life()`; calling it again,
    or where stderr is no terminal, does nothing.
    """
    global _terminal
    if _terminal is not None:
        return
    try:
        if not os.isatty(2):
            return
        encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
        _terminal = os.fdopen(os.dup(2), "w", encoding=encoding, errors="replace")
    except OSError:
        _terminal = None


def display_stream() -> TextIO:
    """Where a display goes: `sys.stderr`, or the kept terminal while fd 2 goes to the filter.

    A `sys.stderr` replaced by an object without fd 2 (a test's capture, the demo's per-task
    log router) is respected: it is what the caller wants written to.
    """
    stream = sys.stderr
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream
    if fd == 2 and _terminal is not None and not _isatty(stream):
        return _terminal
    return stream


class Progress:
    """Progress of one long loop: `update()` once per unit of work; `close()` at the end.

    Args:
        total: units planned (None: unknown; the display counts without a bar).
        desc: what runs ("epoch 2/8", "convert full_int8 (3/4)").
        unit: the unit counted ("step", "batch", "example", "candidate").
        items_per_unit, item: also show a rate in items, e.g. `(global_batch, "img")` shows
            img/s for steps of that many images.
        remaining_after: units still to run after this display's `total` at the same pace
            (the later epochs of a run): the display adds the run's ETA.
        initial: units already done (a resumed epoch).
        transient: a bar is erased when it closes (a short phase between lines that stay).
        show_rate: False where units per second say nothing (a display counting seconds).
        enabled: False shows nothing (a worker that is not the chief).
        every_s: seconds between plain lines (default: `settings().every_s`).
        quiet: default `settings().quiet`.
        stream: the display's stream (default: `display_stream()`); a terminal gets a bar.
        logger: the logger of plain lines (default `ampflow.progress`).
    """

    def __init__(self, total: int | None, desc: str, *, unit: str = "step",
                 items_per_unit: float | None = None, item: str = "item",
                 remaining_after: int = 0, initial: int = 0, transient: bool = False,
                 show_rate: bool = True,
                 enabled: bool = True, every_s: float | None = None, quiet: bool | None = None,
                 stream: TextIO | None = None, logger: logging.Logger | None = None) -> None:
        current = settings() if every_s is None or quiet is None else None
        self.total, self.desc, self.unit = total, desc, unit
        self.items_per_unit, self.item = items_per_unit, item
        self.remaining_after = remaining_after
        self.show_rate = show_rate
        self.n = self._initial = initial
        self.every_s = every_s if every_s is not None else current.every_s
        _check_every_s(self.every_s, "every_s")
        quiet = quiet if quiet is not None else current.quiet
        self._log = logger or log
        self._bar = None
        self._values: Mapping[str, object] = {}
        self._start = time.monotonic()
        self._lines = 0
        self._closed = False
        if quiet or not enabled:
            self.mode = "off"
            return
        stream = stream if stream is not None else display_stream()
        self._stream = stream
        self.mode = "bar" if _isatty(stream) else "lines"
        interval = BAR_INTERVAL_S if self.mode == "bar" else self.every_s
        self._interval = interval
        self._due = self._start + interval
        self._marks: collections.deque = collections.deque(
            [(self._start, self.n)], maxlen=_RATE_WINDOW if self.mode == "bar" else 2)
        if self.mode == "bar":
            from tqdm import tqdm

            sized = _columns(stream) > 0  # a fresh pseudo-terminal reports 0 columns
            self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream,
                             dynamic_ncols=sized, ncols=None if sized else _UNSIZED_COLUMNS,
                             nrows=None if sized else 24,  # tqdm draws nothing on 0 rows
                             leave=not transient, mininterval=0, miniters=1, smoothing=0.3,
                             # with a rate in items, that rate replaces tqdm's in units
                             bar_format=("{l_bar}{bar}| {n_fmt}/{total_fmt} "
                                         "[{elapsed}<{remaining}{postfix}]")
                             if items_per_unit and total is not None else None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1, values: Values = None) -> None:
        """Count `n` more units; `values` (or a callable giving them) shown when a display is due.

        A callable is called only when a display is due: pass one where the values cost
        anything to compute.
        """
        if self.mode == "off":
            return
        self.n += n
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self._interval
        self._show(now, values)

    def close(self, values: Values = None) -> None:
        """End the display: a bar shows its final state.

        Plain lines end with one closing line if any line was written (a step that ended
        within `every_s` writes none).
        """
        if self._closed or self.mode == "off":
            self._closed = True
            return
        self._closed = True
        now = time.monotonic()
        if self.mode == "bar":
            self._show(now, values)
            self._bar.close()
        elif self._lines:
            self._show(now, values, closing=True)

    # ---- display --------------------------------------------------------------------------

    def _show(self, now: float, values: Values, closing: bool = False) -> None:
        if values is not None:
            self._values = values() if callable(values) else values
        self._marks.append((now, self.n))
        t0, n0 = (self._start, self._initial) if closing else self._marks[0]
        rate = (self.n - n0) / (now - t0) if now > t0 and self.n > n0 else None
        if self.mode == "bar":
            self._bar.set_postfix_str(self._fitted_postfix(rate), refresh=False)
            if self.n > self._bar.n:
                self._bar.update(self.n - self._bar.n)  # redraws (mininterval=0)
            else:
                self._bar.refresh()
            return
        self._lines += 1
        line = self._line(now, rate, closing)
        if self._log.isEnabledFor(logging.INFO) and self._log.hasHandlers():
            self._log.info("%s", line)
        else:  # logging not set up for INFO (a script, a notebook): to the stream itself
            self._stream.write(line + "\n")
            self._stream.flush()

    def _rate_text(self, rate: float | None) -> list[str]:
        if rate is None or not self.show_rate or (self.mode == "bar" and not self.items_per_unit):
            return []  # a bar shows its rate in units itself
        if self.items_per_unit:
            return [f"{rate * self.items_per_unit:,.1f} {self.item}/s"]
        return [f"{rate:,.2f} {self.unit}/s"]

    def _eta(self, rate: float | None) -> tuple[float | None, float | None]:
        """(seconds left of this display, seconds left of the run) at `rate`."""
        if not rate or self.total is None:
            return None, None
        left = max(self.total - self.n, 0) / rate
        run = left + self.remaining_after / rate if self.remaining_after else None
        return left, run

    def _postfix_fields(self, rate: float | None, with_eta: bool) -> list[tuple[str, str]]:
        """(name, text) of each field after the count: the rate, the values, the ETAs."""
        fields = [("rate", text) for text in self._rate_text(rate)]
        fields += [(k, f"{k} {_format(v)}") for k, v in self._values.items() if v is not None]
        left, run = self._eta(rate)
        if with_eta and left is not None and self.mode == "lines":  # a bar shows its own
            fields.append(("ETA", f"ETA {_duration(left)}"))
        if run is not None and with_eta:
            fields.append(("run ETA", f"run ETA {_duration(run)}"))
        return fields

    def _postfix(self, rate: float | None, with_eta: bool) -> str:
        return ", ".join(text for _, text in self._postfix_fields(rate, with_eta))

    def _fitted_postfix(self, rate: float | None) -> str:
        """The bar's fields that fit the terminal beside a bar of at least `MIN_BAR_WIDTH`.

        Fields are dropped, least wanted first (`KEEP_FIRST` says the order), never the bar:
        tqdm would otherwise shrink the bar to one character and cut the line's end.
        """
        fields = self._postfix_fields(rate, with_eta=True)
        room = self._width() - self._bar_line_without_postfix(rate) - MIN_BAR_WIDTH
        kept: set[int] = set()
        used = 0
        for i in sorted(range(len(fields)), key=lambda i: _keep_rank(fields[i][0])):
            cost = len(fields[i][1]) + 2  # ", " before it
            if used + cost <= room:
                kept.add(i)
                used += cost
        return ", ".join(text for i, (_, text) in enumerate(fields) if i in kept)

    def _width(self) -> int:
        return _columns(self._stream) or _UNSIZED_COLUMNS

    def _bar_line_without_postfix(self, rate: float | None) -> int:
        """Characters of the line about to be drawn, less its postfix and its bar.

        tqdm's own format, at this display's count and rate (tqdm's still hold the last
        redraw's: a "?" ETA is 4 characters shorter than "00:07"), plus 2 for an ETA that
        grows by an hours field before the next redraw.
        """
        meter = dict(self._bar.format_dict, n=self.n, rate=rate, postfix=None,
                     ncols=None)  # ncols None: tqdm draws a bar of _TQDM_UNSIZED_BAR
        return len(self._bar.format_meter(**meter)) - _TQDM_UNSIZED_BAR + 2

    def _line(self, now: float, rate: float | None, closing: bool) -> str:
        if self.total is not None:
            count = f"{self.unit} {self.n}/{self.total}"
            if self.total:
                count += f" ({100 * self.n / self.total:.0f}%)"
        else:
            count = f"{self.unit} {self.n}"
        tail = self._postfix(rate, with_eta=not closing)
        if closing:
            tail = ", ".join(filter(None, [tail, f"in {_duration(now - self._start)}"]))
        return f"{self.desc}: {count}" + (f", {tail}" if tail else "")


def track(iterable: Iterable[T], total: int | None, desc: str, *, unit: str = "item",
          **kwargs) -> Iterator[T]:
    """Yield from `iterable`, counting each item into a `Progress` (closed at the end).

    For generators that write as they go, e.g. a TFDS builder's `_generate_examples`:
    `for image, label in track(rows, len(rows), "prepare digits", unit="example"): yield ...`
    """
    with Progress(total, desc, unit=unit, **kwargs) as progress:
        for item in iterable:
            yield item
            progress.update()


def keras_callback(progress: Progress):
    """A Keras callback that counts the batches of `predict`/`evaluate`/`fit` into `progress`."""
    import keras

    class _CountBatches(keras.callbacks.Callback):
        def on_predict_batch_end(self, batch, logs=None):
            progress.update()

        def on_test_batch_end(self, batch, logs=None):
            progress.update()

        def on_train_batch_end(self, batch, logs=None):
            progress.update()

    return _CountBatches()


def _keep_rank(name: str) -> int:
    """Where a field stands in `KEEP_FIRST` (unknown fields after every known one)."""
    return KEEP_FIRST.index(name) if name in KEEP_FIRST else len(KEEP_FIRST)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


def _columns(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _format(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or (value.is_integer() and abs(value) >= 100):
        return f"{int(value)}"
    return f"{value:.4f}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _check_every_s(value: float, name: str, received: object = None) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        shown = value if received is None else received
        raise ConfigError(f"{name} must be a number of seconds > 0. Received: {name}={shown!r}")
