"""Server-side batching: concurrent Predict calls on one signature run as one batch.

Like TF Serving's `--enable_batching`, requests queue per (model version, signature); one
worker takes the first, waits up to `batch_timeout_ms` for more with the same input
structure, concatenates along the batch dimension (up to `max_batch_size` rows), runs once and
splits the outputs back. Requests that cannot merge (different trailing shapes or dtypes, or
an output without a batch dimension) simply run alone, so batching never changes an answer.
A text model's requests merge only within one length bucket (core/tokens.py has split each
request by bucket), so a long text does not pad 31 short ones (TF Serving's batcher pads to
the longest); a request that does not fit the batch being filled waits for the next one,
without closing it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from ampflow.serving.config import BatchingConfig
from ampflow.serving.core.tokens import request_tokens
from ampflow.serving.models.servable import Servable

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Item:
    inputs: dict[str, np.ndarray]
    rows: int
    key: tuple
    future: Future


BatchObserver = Callable[[int, int], None]  # (requests merged, rows) of one model run


class _Queue:
    """One queue + worker thread for one (servable, signature)."""

    def __init__(self, servable: Servable, signature: str, config: BatchingConfig,
                 observe: BatchObserver | None = None):
        self._observe = observe
        self._servable = servable
        self._signature = signature
        self._config = config
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._pending: collections.deque[_Item] = collections.deque()  # for the next batches
        self._closing = False
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"ampflow-batch-{servable.model}-{signature}")
        self._thread.start()

    def submit(self, item: _Item) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            if self._pending:
                first = self._pending.popleft()
            elif self._closing:
                return
            else:
                first = self._queue.get()
                if first is None:
                    return
            self._run(self._collect(first))

    def _collect(self, first: _Item) -> list[_Item]:
        """Gather items like `first` (waiting ones first) until full or the timeout passes.

        An item that differs, or does not fit, waits for a later batch; the close marker ends
        the gathering, and the loop once every waiting item has run.
        """
        batch, rows, limit = [first], first.rows, self._config.max_batch_size
        for item in list(self._pending):
            if item.key == first.key and rows + item.rows <= limit:
                self._pending.remove(item)
                batch.append(item)
                rows += item.rows
        deadline = time.monotonic() + self._config.batch_timeout_ms / 1000.0
        while rows < limit and not self._closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if item is None:
                self._closing = True
            elif item.key != first.key or rows + item.rows > limit:
                self._pending.append(item)
            else:
                batch.append(item)
                rows += item.rows
        return batch

    def _run(self, batch: list[_Item]) -> None:
        if self._observe is not None:
            self._observe(len(batch), sum(item.rows for item in batch))
        try:
            if len(batch) == 1:
                batch[0].future.set_result(self._servable.run(self._signature, batch[0].inputs))
                return
            merged = {k: np.concatenate([it.inputs[k] for it in batch]) for k in batch[0].inputs}
            try:
                outputs = self._servable.run(self._signature, merged)
            except Exception:  # whose input failed is known only alone: each runs by itself
                self._run_alone(batch)
                return
            total = sum(it.rows for it in batch)
            if any(np.ndim(v) == 0 or np.shape(v)[0] != total for v in outputs.values()):
                self._run_alone(batch)  # outputs without a batch dim cannot be split
                return
            start = 0
            for item in batch:
                end = start + item.rows
                item.future.set_result({k: v[start:end] for k, v in outputs.items()})
                start = end
        except Exception as e:  # every waiting request gets the error, the worker lives on
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)

    def _run_alone(self, batch: list[_Item]) -> None:
        """Run each request by itself; each gets its own answer or its own error."""
        for item in batch:
            try:
                item.future.set_result(self._servable.run(self._signature, item.inputs))
            except Exception as e:
                item.future.set_exception(e)


class Batcher:
    """Routes runs to per-(servable, signature) queues; created once per server."""

    def __init__(self, config: BatchingConfig, observe: BatchObserver | None = None) -> None:
        self._config = config
        self._observe = observe
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, str], tuple[Servable, _Queue]] = {}

    def run(self, servable: Servable, signature: str, inputs: dict[str, np.ndarray],
            timeout_s: float | None) -> dict[str, np.ndarray]:
        """Run through the batch queue; falls back to a direct run for unbatchable inputs."""
        rows = _batch_rows(inputs)
        if rows is None or rows >= self._config.max_batch_size:
            return servable.run(signature, inputs)
        key = (*sorted((k, v.dtype.str, v.shape[1:]) for k, v in inputs.items()),
               _length_bucket(servable, inputs))
        future: Future = Future()
        with self._lock:  # submit under the lock: a queue is never closed between get and put
            slot = (id(servable), signature)
            if slot not in self._queues:
                self._queues[slot] = (servable, _Queue(servable, signature, self._config,
                                                             self._observe))
            self._queues[slot][1].submit(_Item(inputs, rows, key, future))
        return future.result(timeout=timeout_s)

    def retire(self, live: set[int]) -> None:
        """Close queues of servables no longer served (`live` holds the served ones' ids).

        Queued work still runs (the close marker goes after it); a late request for a retired
        version gets a fresh queue, which the next `retire` closes again.
        """
        with self._lock:
            for slot in [s for s in self._queues if s[0] not in live]:
                self._queues.pop(slot)[1].close()

    def close(self) -> None:
        """Stop every worker after it drains what is queued."""
        with self._lock:
            for _servable, q in self._queues.values():
                q.close()
            self._queues.clear()


def _length_bucket(servable: Servable, inputs: dict[str, np.ndarray]) -> tuple[int, int]:
    """A text request's length bucket and its longest text's byte class; (0, 0) for others.

    core/tokens.py runs a request's rows apart by both, so requests merge by both too.
    """
    cost = request_tokens(servable, inputs)
    if cost is None:
        return 0, 0
    classes = cost.row_byte_classes
    return cost.padded_length, int(classes.max(initial=0)) if classes is not None else 0


def _batch_rows(inputs: dict[str, np.ndarray]) -> int | None:
    """The common first dimension of all inputs, or None when they do not share one."""
    rows = {v.shape[0] if v.ndim else None for v in inputs.values()}
    if len(rows) != 1:
        return None
    (value,) = rows
    return value if value else None
