"""AMP's second promise, measured: the peak memory of training, and the largest batch that fits.

`PeakMemory` reads the peak of a region from TF's allocator (GPU or CPU) and from the process's
resident-set high-water mark; `find_max_batch_size` and `auto_batch_size` search for the largest
batch a GPU holds (a CPU keeps `CPU_AUTO_BATCH_SIZE`: running out of host RAM is no error a
search can catch), answering with gradient accumulation when `--effective-batch-size` does not
fit. How each peak is read, measured: docs/explanation/design-notes.md, "memory.py".
"""

from __future__ import annotations

import gc
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError

log = logging.getLogger(__name__)

SOURCES = ("gpu_allocator_peak", "cpu_allocator_peak", "process_vmhwm_reset",
           "process_maxrss_lifetime")
ALLOCATOR_SOURCES = SOURCES[:2]
# "CPU:0" without statistics (measured, TF 2.21): oneDNN's and the BFC allocator keep them, TF's
# default one not; oneDNN is on by default only with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX.
NO_CPU_STATS_HINT = ("TF's default CPU allocator keeps no statistics; set "
                     "TF_CPU_ALLOCATOR_USE_BFC=true or TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow "
                     "starts to measure tensors")
AUTO = "auto"
# `--batch-size auto` on a machine without a GPU: TrainConfig.batch_size's default (a test ties
# the two), since there is no accelerator memory to fill (module docstring).
CPU_AUTO_BATCH_SIZE = 32
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
# Messages of out-of-memory errors that TF does not raise as ResourceExhaustedError.
_OOM_TEXT = re.compile(r"out of memory|\bOOM\b|RESOURCE_EXHAUSTED|Dst tensor is not initialized",
                       re.IGNORECASE)
# A probe step that loss scaling skips (non-finite gradients) never runs the optimizer's update,
# whose temporaries are part of every real step's peak: under mixed_float16 the probe runs on,
# one step at a time and at most this many more, until one update was applied. Each skip
# halves the scale, so gradients that are finite at any scale >= 1 get there within 16.
MAX_PROBE_EXTRA_STEPS = 16


# ---- measuring a region's peak ---------------------------------------------------------------

@dataclass(frozen=True)
class MemoryPeak:
    """The peak memory of one region, and what measured it.

    `peak_bytes` is the absolute high-water mark during the region, including the
    `baseline_bytes` already in use when it began (a GPU must hold both).
    """

    peak_bytes: int
    baseline_bytes: int
    device: str  # "GPU:0", "CPU:0" or "process"
    source: str  # one of SOURCES
    resettable: bool  # False: the peak is the process's lifetime peak, not the region's
    process_peak_bytes: int | None = None  # the process's RSS peak beside an allocator's
    process_baseline_bytes: int | None = None
    process_source: str | None = None
    per_device: dict[str, int] = field(default_factory=dict)  # several GPUs: each one's peak
    seconds: float = 0.0

    @property
    def region_bytes(self) -> int:
        """What the region added on top of what was in use when it began."""
        return self.peak_bytes - self.baseline_bytes

    def to_json(self) -> dict[str, Any]:
        """The `memory` block of metadata.json (plain JSON types)."""
        out = asdict(self)
        out["region_bytes"] = self.region_bytes
        out["peak_mib"] = round(self.peak_bytes / 2**20, 1)
        return out


def why_not_comparable(a: MemoryPeak, b: MemoryPeak) -> str | None:
    """None when the regions of `a` and `b` can be compared; else one line that says why not.

    Only an allocator's counters see the tensors of a region. The process's resident set does
    not grow when memory freed before the region is reused (so whichever region runs second
    looks smaller), and the kernel's RSS counters are approximate (per-CPU batches of pages),
    so two process peaks differ by noise as large as a small model's activations.
    """
    if a.source != b.source:
        return f"the peaks were measured differently: {a.source} vs {b.source}"
    if a.source not in ALLOCATOR_SOURCES:
        return (f"{a.source} cannot compare two regions' tensors: the process reuses memory "
                f"freed before a region without its resident set growing ({NO_CPU_STATS_HINT})")
    return None


_ACTIVE: list[PeakMemory] = []  # open regions, outermost first
_WARNED: set[str] = set()  # devices whose missing statistics were logged (once per process)


class PeakMemory:
    """Measure the peak memory of a region: `with PeakMemory() as peak: ...; peak.result`.

    `device`: None (every local GPU, else "CPU:0"), or a TF device name ("GPU:1", "CPU:0").
    `source`: "auto" (the TF allocator of `device`, the process's RSS beside it), "allocator"
    (the same, but fail rather than fall back), or "process" (the process's RSS only).
    Also usable as `start()` / `stop()` (which returns the `MemoryPeak`).
    Both counters are the whole process's: memory another thread (or the cyclic GC) frees inside
    the region offsets what the region allocates, so measure in a process doing nothing else.
    """

    def __init__(self, device: str | None = None, source: str = "auto"):
        if source not in ("auto", "allocator", "process"):
            raise ConfigError("source must be one of ('auto', 'allocator', 'process'). "
                              f"Received: source={source!r}")
        self.device, self.source = device, source
        self.result: MemoryPeak | None = None
        self._devices: list[str] = []
        self._folded: dict[str, int] = {}  # peaks seen before an inner region's reset
        self._baseline: dict[str, int] = {}
        self._began = 0.0

    def __enter__(self) -> PeakMemory:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> PeakMemory:
        """Reset the counters (folding them into any enclosing region first) and begin."""
        self._devices = self._allocator_devices() if self.source != "process" else []
        for outer in _ACTIVE:
            outer._fold()
        _ACTIVE.append(self)
        self._folded = {}
        self._baseline = {}
        for device in self._devices:
            self._baseline[device] = _reset_allocator(device)
        self._process_resettable = _reset_process_peak()
        self._baseline["process"] = _process_rss()
        self._began = time.perf_counter()
        return self

    def stop(self) -> MemoryPeak:
        """End the region; the `MemoryPeak` (also kept in `.result`)."""
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        seconds = time.perf_counter() - self._began
        peaks = {device: max(_allocator_peak(device), self._folded.get(device, 0))
                 for device in self._devices}
        process = max(_process_peak(), self._folded.get("process", 0))
        process_source = ("process_vmhwm_reset" if self._process_resettable
                          else "process_maxrss_lifetime")
        # A region's peak holds what was in use when it began: a counter read below it (the
        # kernel's per-CPU RSS counters are approximate) is its baseline, never a negative region.
        peaks = {device: max(peak, self._baseline[device]) for device, peak in peaks.items()}
        process = max(process, self._baseline["process"])
        if peaks:
            top = max(peaks, key=peaks.get)
            self.result = MemoryPeak(
                peak_bytes=peaks[top], baseline_bytes=self._baseline[top],
                device=top if len(peaks) == 1 else f"{top} (max of {len(peaks)} GPUs)",
                source="gpu_allocator_peak" if top.startswith("GPU") else "cpu_allocator_peak",
                resettable=True, process_peak_bytes=process,
                process_baseline_bytes=self._baseline["process"], process_source=process_source,
                per_device=peaks if len(peaks) > 1 else {}, seconds=seconds)
        else:
            self.result = MemoryPeak(
                peak_bytes=process, baseline_bytes=self._baseline["process"], device="process",
                source=process_source, resettable=self._process_resettable, seconds=seconds)
        return self.result

    def _fold(self) -> None:
        """Keep the peaks so far: an inner region is about to reset the counters."""
        for device in self._devices:
            self._folded[device] = max(self._folded.get(device, 0), _allocator_peak(device))
        self._folded["process"] = max(self._folded.get("process", 0), _process_peak())

    def _allocator_devices(self) -> list[str]:
        import tensorflow as tf

        if self.device is not None:
            devices = [self.device]
        else:
            gpus = tf.config.list_logical_devices("GPU")
            devices = [d.name.replace("/device:", "") for d in gpus] or ["CPU:0"]
        usable = []
        for device in devices:
            try:
                tf.config.experimental.get_memory_info(device)
                usable.append(device)
            except (ValueError, tf.errors.OpError) as e:
                hint = f"; {NO_CPU_STATS_HINT}" if device.startswith("CPU") else ""
                if self.source == "allocator":
                    raise ConfigError(f"device must have TF allocator statistics. Received: "
                                      f"device={device!r} ({e}){hint}") from e
                if device not in _WARNED:
                    _WARNED.add(device)
                    log.warning("no allocator statistics for %s (%s): measuring the process's "
                                "peak instead%s", device, e, hint)
        return usable


def _reset_allocator(device: str) -> int:
    """Reset `device`'s peak to what is in use now; return that (the baseline)."""
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats(device)
    return int(tf.config.experimental.get_memory_info(device)["current"])


def _allocator_peak(device: str) -> int:
    import tensorflow as tf

    return int(tf.config.experimental.get_memory_info(device)["peak"])


def _status_kib(key: str) -> int | None:
    try:
        match = re.search(rf"^{key}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_process_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel refuses (then it is lifetime)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _process_rss() -> int:
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else _process_peak()


def _process_peak() -> int:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    import resource  # no /proc: the lifetime peak (kilobytes on Linux)

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# ---- the largest batch that fits -------------------------------------------------------------

@dataclass(frozen=True)
class BatchAttempt:
    """One trial of the search: the batch, whether it ran, how long, its measured peak.

    `peak_bytes` is what the trial itself needed at its peak (`MemoryPeak.region_bytes`: above
    what the process already held), so a search reads the same in a fresh process and in one
    that holds other tensors.
    """

    batch_size: int
    ok: bool
    seconds: float
    peak_bytes: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class BatchSearch:
    """The largest batch that ran (None: not even the smallest), and every attempt."""

    batch_size: int | None
    attempts: tuple[BatchAttempt, ...]
    start: int
    limit: int
    multiple_of: int
    stopped: str  # why the search ended

    @property
    def peak_bytes(self) -> int | None:
        """The measured peak of the chosen batch, where the trial reported one."""
        return next((a.peak_bytes for a in reversed(self.attempts)
                     if a.ok and a.batch_size == self.batch_size), None)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, for the metadata."""
        return {**asdict(self), "attempts": [asdict(a) for a in self.attempts],
                "peak_bytes": self.peak_bytes}


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says a device ran out of memory (and a smaller batch may fit)."""
    import tensorflow as tf

    if isinstance(error, tf.errors.ResourceExhaustedError | MemoryError | InjectedOutOfMemory):
        return True
    # XLA and some copies report OOM as InternalError ("Dst tensor is not initialized")
    return isinstance(error, tf.errors.OpError) and bool(_OOM_TEXT.search(str(error)))


def find_max_batch_size(try_batch: Callable[[int], Any], *, start: int, limit: int,
                        multiple_of: int = 1, max_attempts: int = 24,
                        is_oom: Callable[[BaseException], bool] = is_out_of_memory,
                        ) -> BatchSearch:
    """The largest batch (a multiple of `multiple_of`, <= `limit`) for which `try_batch` runs.

    Doubles from `start` until a batch runs out of memory or `limit` is reached, then bisects
    between the largest batch that ran and the smallest that did not; a `start` that does not
    fit bisects below it. `try_batch(b)` runs the work at batch `b` and may return its
    `MemoryPeak` (recorded per attempt); an error that `is_oom` accepts marks `b` too large,
    any other error propagates (a bug is not an out-of-memory). Assumes memory grows with the
    batch (a batch that fits implies every smaller one fits).
    """
    if multiple_of < 1:
        raise ConfigError(f"multiple_of must be >= 1. Received: multiple_of={multiple_of}")
    if start < multiple_of or start % multiple_of:
        raise ConfigError(f"start must be a positive multiple of multiple_of ({multiple_of}). "
                          f"Received: start={start}")
    if limit < start:
        raise ConfigError(f"limit must be >= start ({start}). Received: limit={limit}")
    limit -= limit % multiple_of
    attempts: list[BatchAttempt] = []

    def fits(batch: int) -> bool:
        began = time.perf_counter()
        try:
            peak = try_batch(batch)
        except Exception as e:
            if not is_oom(e):
                raise
            text = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            attempts.append(BatchAttempt(batch, False, time.perf_counter() - began,
                                         getattr(getattr(e, "peak", None), "region_bytes", None),
                                         text))
            log.info("batch %d: out of memory (%s)", batch, text)
            return False
        attempts.append(BatchAttempt(batch, True, time.perf_counter() - began,
                                     getattr(peak, "region_bytes", None)))
        log.info("batch %d: fits%s", batch, f" (peak {peak.region_bytes / 2**20:.0f} MiB)"
                 if isinstance(peak, MemoryPeak) else "")
        return True

    def done(best: int | None, why: str) -> BatchSearch:
        return BatchSearch(best, tuple(attempts), start, limit, multiple_of, why)

    good, bad = 0, None  # largest that ran (0: none yet), smallest that did not
    batch = start
    while bad is None:
        if len(attempts) >= max_attempts:
            return done(good or None, f"attempt budget ({max_attempts}) spent")
        if not fits(batch):
            bad = batch
        else:
            good = batch
            if batch >= limit:
                return done(good, f"the limit ({limit}) fits")
            batch = min(2 * batch, limit)
    while bad - good > multiple_of:
        if len(attempts) >= max_attempts:
            return done(good or None, f"attempt budget ({max_attempts}) spent")
        middle = (good + bad) // 2
        middle -= middle % multiple_of
        if fits(max(middle, good + multiple_of)):
            good = max(middle, good + multiple_of)
        else:
            bad = max(middle, good + multiple_of)
    if not good:
        return done(None, f"even batch {multiple_of} runs out of memory")
    return done(good, f"batch {good} fits and {bad} does not")


class InjectedOutOfMemory(Exception):
    """A trial whose measured peak exceeded an injected `MemoryLimit` (see `MemoryLimit`).

    `is_out_of_memory` accepts it as it accepts a `tf.errors.ResourceExhaustedError`.
    """

    def __init__(self, message: str, peak: MemoryPeak):
        super().__init__(message)
        self.peak = peak


@dataclass
class MemoryLimit:
    """`try_batch` on a device of `limit_bytes`: a trial whose *measured* peak exceeds it fails.

    For tests and machines without a GPU: the trial really runs, `PeakMemory` measures its peak
    (the probe's own measurement when it returns a `MemoryPeak`), and a peak above the limit
    raises `InjectedOutOfMemory`, as the allocator of a device that small would have. The limit
    is compared with the real measurement, never with a formula of the batch size — with what
    the trial itself needed (`region_bytes`), so the answer does not depend on what else the
    process happens to hold. It needs an allocator's peak (a `ConfigError` without one): the
    process's cannot compare two trials' tensors (`why_not_comparable`).
    """

    limit_bytes: int
    try_batch: Callable[[int], Any]
    device: str | None = None

    def __call__(self, batch: int) -> MemoryPeak:
        with PeakMemory(self.device, source="allocator") as region:
            returned = self.try_batch(batch)
        peak = returned if isinstance(returned, MemoryPeak) else region.result
        if peak.region_bytes > self.limit_bytes:
            raise InjectedOutOfMemory(
                f"OOM (injected): batch {batch} needed {peak.region_bytes / 2**20:.1f} MiB "
                f"({peak.source}), over the {self.limit_bytes / 2**20:.1f} MiB limit", peak)
        return peak


@dataclass(frozen=True)
class BatchChoice:
    """What `--batch-size auto` resolved to, and why (the metadata's `batch_size_auto`).

    `accumulation_steps` > 1 when a wanted effective batch did not fit (`with_accumulation`).
    """

    batch_size: int
    reason: str
    search: BatchSearch | None = None
    accumulation_steps: int = 1
    wanted_batch_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, for the metadata."""
        return {"batch_size": self.batch_size, "reason": self.reason,
                "accumulation_steps": self.accumulation_steps,
                "effective_batch_size": self.batch_size * self.accumulation_steps,
                "wanted_batch_size": self.wanted_batch_size,
                "search": self.search.to_json() if self.search else None}


def accumulation_for(wanted: int, fits: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for a wanted batch when only `fits` examples fit.

    The rule: as few accumulation steps as reach the wanted batch, K = ceil(wanted / fits)
    (each step costs a forward and backward pass, and a larger micro-batch runs faster), and
    the micro-batch wanted // K, which fits because wanted / K <= fits. The effective batch
    micro x K is then the wanted one whenever K divides it (a power of two wanted and fitting:
    always), and otherwise the nearest below it by less than K examples, which the log and the
    metadata say. A wanted batch that fits is itself, K = 1.
    """
    if wanted < 1 or fits < 1:
        raise ConfigError(f"wanted and fits must be >= 1. Received: wanted={wanted}, "
                          f"fits={fits}")
    steps = -(-wanted // fits)
    return wanted // steps, steps


def with_accumulation(choice: BatchChoice, wanted: int) -> BatchChoice:
    """`choice` (the largest batch that fits, or the CPU's default) made up to `wanted`."""
    micro, steps = accumulation_for(wanted, choice.batch_size)
    if steps == 1:
        reason = f"the wanted effective batch {wanted} fits: no accumulation ({choice.reason})"
    else:
        reason = (f"the wanted effective batch {wanted} does not fit ({choice.reason}): "
                  f"{steps} accumulation steps of micro-batch {micro} = {micro * steps}, "
                  f"the fewest steps whose micro-batch fits")
    log.info("batch size auto -> %d x %d accumulation step(s): %s", micro, steps, reason)
    return BatchChoice(micro, reason, choice.search, steps, wanted)


def auto_batch_size(try_batch: Callable[[int], Any], *, limit: int, start: int = 32,
                    multiple_of: int = 8, gpu: bool | None = None,
                    memory_limit_bytes: int | None = None,
                    default: int = CPU_AUTO_BATCH_SIZE) -> BatchChoice:
    """Resolve `--batch-size auto`: search on a GPU (or under an injected limit), else `default`.

    `limit` is the largest batch worth trying (the training split per replica). `gpu` None
    means "is there a local GPU". `memory_limit_bytes` injects a device of that size
    (`MemoryLimit`) and searches on any machine. A `ConfigError` when not even `multiple_of`
    fits.
    """
    if gpu is None:
        import tensorflow as tf

        gpu = bool(tf.config.list_physical_devices("GPU"))
    default = min(default, max(limit, 1))  # a small training split: no batch above it
    if not gpu and memory_limit_bytes is None:
        reason = (f"no accelerator memory to fill: on a CPU the batch is bounded by host RAM, "
                  f"where running out swaps or ends the process rather than raising an error a "
                  f"search can retry, and throughput saturates at small batches; kept "
                  f"{default} (pass --batch-size N to choose)")
        log.info("batch size auto -> %d: %s", default, reason)
        return BatchChoice(default, reason)
    if limit < 1:
        raise ConfigError(f"limit must be >= 1. Received: limit={limit}")
    trial = try_batch if memory_limit_bytes is None else MemoryLimit(memory_limit_bytes, try_batch)
    multiple_of = multiple_of if limit >= multiple_of else 1
    start = min(max(start - start % multiple_of, multiple_of), limit - limit % multiple_of)
    search = find_max_batch_size(trial, start=start, limit=limit, multiple_of=multiple_of)
    if search.batch_size is None:
        raise ConfigError(f"batch_size auto found no batch that fits: {search.stopped} "
                          f"(attempts: {[(a.batch_size, a.ok) for a in search.attempts]})")
    where = ("the GPU" if memory_limit_bytes is None
             else f"an injected limit of {memory_limit_bytes / 2**20:.0f} MiB")
    peak = search.peak_bytes
    reason = (f"largest batch that fits {where}: {search.stopped}"
              + (f"; its measured peak {peak / 2**20:.0f} MiB" if peak else "")
              + f" ({len(search.attempts)} trials)")
    log.info("batch size auto -> %d: %s", search.batch_size, reason)
    return BatchChoice(search.batch_size, reason, search)


# ---- the real trial: one train step of the actual model --------------------------------------

def train_step_probe(model_factory: Callable[[tuple[int, ...], int], Any],
                     input_shape: Sequence[int], num_classes: int, policy: str, *,
                     jit_compile: bool = False,
                     optimizer_factory: Callable[[], Any] | None = None,
                     steps: int = 2, device: str | None = None,
                     seed: int = 0) -> Callable[[int], MemoryPeak]:
    """A `try_batch` for the search: `steps` real train steps of a fresh model at batch `b`.

    Each call clears the Keras session, builds the model (`model_factory(input_shape,
    num_classes)`, under `policy`) and its optimizer (`optimizer_factory()`, default Adam;
    wrapped in a dynamic LossScaleOptimizer under mixed_float16 when it is not one), and runs
    `steps` steps of ampflow's own train step (`TrainLoop`, the default strategy, with
    `jit_compile`) on random pixels 0..255 and random labels, inside a `PeakMemory`, whose
    result it returns. Running the step twice includes what the first step leaves allocated
    (optimizer slots, XLA's buffers): a step's memory is fixed by its shapes and graph, so one
    steady-state step after the first is the whole evidence, provided it took the branch that
    training takes. Under mixed_float16 the first steps may be skipped by loss scaling, which
    never runs the update, so the probe runs on until one update was applied (at most
    MAX_PROBE_EXTRA_STEPS more; a warning if none was). Each call's steps are appended to
    `probe.runs` (batch, steps, updates applied). Memory is freed after every call
    (clear_session + gc); the global dtype policy is restored.
    """
    shape = tuple(int(d) for d in input_shape)
    runs: list[dict[str, int]] = []

    def probe(batch: int) -> MemoryPeak:
        import keras
        import tensorflow as tf

        from ampflow.components.train.run.loop import LoopConfig, TrainLoop
        from ampflow.components.train.run.strategy import Runtime

        previous = keras.mixed_precision.global_policy().name
        keras.backend.clear_session()
        gc.collect()
        try:
            keras.mixed_precision.set_global_policy(policy)
            keras.utils.set_random_seed(seed)
            with PeakMemory(device) as region:
                model = model_factory(shape, num_classes)
                model.compile(optimizer=_probe_optimizer(optimizer_factory, policy),
                              loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
                runtime = Runtime(tf.distribute.get_strategy(), "default", "batch-size probe")
                loop = TrainLoop(runtime, model, LoopConfig(
                    epochs=1, steps_per_epoch=steps, global_batch_size=batch,
                    jit_compile=jit_compile, loss_scaling=policy == "mixed_float16",
                    state_dir=""))
                images = tf.random.uniform((batch, *shape), 0.0, 255.0, seed=seed)
                labels = tf.random.uniform((batch,), 0, num_classes, tf.int64, seed=seed)
                data = tf.data.Dataset.from_tensors((images, labels)).repeat()
                iterator = iter(data)
                loop.run_steps(iterator, steps)
                extra = _run_until_an_update(loop, iterator, model.optimizer, policy)
                runs.append({"batch": batch, "steps": steps + extra,
                             "applied": int(model.optimizer.iterations.numpy())})
                del loop, model, data, images, labels, iterator
            if not runs[-1]["applied"]:
                log.warning("batch %d: loss scaling skipped all %d probe steps, so its peak "
                            "leaves out the optimizer update", batch, runs[-1]["steps"])
            return region.result
        finally:
            keras.backend.clear_session()
            gc.collect()
            keras.mixed_precision.set_global_policy(previous)

    probe.runs = runs
    return probe


def _run_until_an_update(loop, iterator, optimizer, policy: str) -> int:
    """Run single steps until `optimizer` applied an update (mixed_float16 only); how many."""
    extra = 0
    while (policy == "mixed_float16" and extra < MAX_PROBE_EXTRA_STEPS
           and int(optimizer.iterations.numpy()) == 0):
        loop.run_steps(iterator, 1)
        extra += 1
    return extra


def _probe_optimizer(optimizer_factory, policy: str):
    import keras

    optimizer = optimizer_factory() if optimizer_factory else keras.optimizers.Adam(1e-3)
    if policy == "mixed_float16" and not isinstance(optimizer,
                                                    keras.optimizers.LossScaleOptimizer):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
