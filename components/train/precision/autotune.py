"""`ampflow train --autotune`: pick the (policy, XLA) pair by measuring it, within a hard budget.

The rule-based `auto` (precision.py) is right where it was measured, not everywhere, so each
candidate runs warm-up steps and then timed steps of the real training step; the fastest wins.
The candidates run in one child process that the parent kills when the budget is spent,
whatever it is doing (a trace or an XLA compile cannot be interrupted in-process). The rules
are autotune_rules.py's, the measuring process autotune_child.py's. Why, and the multi-worker
agreement: docs/explanation/design-notes.md, "autotune.py".
"""

from __future__ import annotations

import json
import logging
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ampflow.artifacts.throughput import ThroughputUnit, throughput_unit
from ampflow.components.train.clusters.tf_config import read_tf_config
from ampflow.components.train.precision.autotune_child import run_candidates  # noqa: F401 (tests' child)
from ampflow.components.train.precision.autotune_rules import (
    ALL_PAIRS,
    DROP_AFTER_STEPS,
    DROP_MARGIN,
    STALL_MIN_S,
    WARMUP_STEPS,
    XLA_MODES,
    config_to_dict,
    eta_s,
    hardware_to_dict,
    parse_policies,
    stall_limit_s,
    step_rates,
)
from ampflow.components.train.precision.policy import (
    HardwareInfo,
    PrecisionSetup,
    choose_jit,
    choose_policy,
    native_formats,
)
from ampflow.errors import ConfigError

log = logging.getLogger(__name__)

_READ_EVERY_S = 1.0  # how often the parent wakes to check the budget and refresh the progress


# ---- the parent: spawns, reads, enforces the budget ---------------------------------------

@dataclass
class _Child:
    process: Any
    fd: int
    buffer: bytes = b""


CHILD_COMMAND = (sys.executable, "-m", "ampflow.components.train.precision.autotune_child")


def spawn_child(request: dict, command: tuple[str, ...] = CHILD_COMMAND) -> _Child:
    """Start the measuring process; its events come on a pipe (stdout stays Keras's).

    `command` is followed by the request file and the pipe's fd (tests start a fake child).
    """
    read_fd, write_fd = os.pipe()
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="ampflow-autotune-",
                                     delete=False) as f:
        json.dump(request, f)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}  # measures locally
    env["AMPFLOW_QUIET"] = "1"
    try:
        process = subprocess.Popen(
            [*command, f.name, str(write_fd)],
            pass_fds=(write_fd,), env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL)
    finally:
        os.close(write_fd)
    process.request_path = f.name
    return _Child(process, read_fd)


@dataclass
class SearchResult:
    """What the child(ren) measured, for `choose` (the parent's rows, in candidate order)."""

    rows: list[dict[str, Any]]
    global_batch_size: int | None
    conv_layers: int | None
    elapsed_s: float
    budget_s: float
    stopped_at_budget: bool
    hardware: str | None = None
    restarts: int = 0
    cpu_s: float | None = None  # CPU seconds of the measuring processes (load-independent)
    modality: str | None = None  # the data's, from the plan: the rates' unit (throughput.py)


class _Search:
    """The parent's side: follow the child's events, stop it at the budget or on a stall."""

    def __init__(self, config, hardware: HardwareInfo | None, spawn: Callable, stall_min_s: float,
                 clock: Callable[[], float]) -> None:
        self.config, self.spawn, self.clock, self.stall_min_s = config, spawn, clock, stall_min_s
        self.started = clock()
        self.deadline = self.started + config.autotune_budget_s
        self.request = {"config": config_to_dict(config), "pairs": None, "best_median_s": None,
                        "hardware": hardware_to_dict(hardware) if hardware else None}
        self.pending: list[tuple[str, bool]] | None = None  # None: the plan has not come yet
        self.rows: dict[tuple[str, bool], dict[str, Any]] = {}
        self.skipped: list[dict[str, Any]] = []
        self.running: dict[str, Any] | None = None
        self.plan: dict[str, Any] = {}
        self.restarts = 0
        self.finished = False  # the child sent "end"
        self.stopped_at_budget = False
        self.progress = None
        cluster = read_tf_config()  # the chief alone shows progress and logs the candidates
        self.chief = cluster is None or cluster.is_chief

    # the loop
    def run(self) -> SearchResult:
        from ampflow.progress import Progress

        self.progress = Progress(None, "autotune", unit="candidates done", show_rate=False,
                                 enabled=self.chief)
        try:
            while self.pending is None or self.pending:
                if self.clock() >= self.deadline:
                    self._budget_spent()
                    break
                self.request.update(pairs=self.pending, best_median_s=self._best_median())
                if not self._follow(self.spawn(self.request)):
                    break
        finally:
            self.progress.close(values=lambda: {k: v for k, v in self._values().items()
                                                if k != "ETA"})  # nothing is left
        rows = [self.rows[p] for p in self.plan.get("pairs", []) if p in self.rows]
        rows += self.skipped
        return SearchResult(rows, self.plan.get("global_batch_size"),
                            self.plan.get("conv_layers"), self.clock() - self.started,
                            self.config.autotune_budget_s, self.stopped_at_budget,
                            self.plan.get("hardware"), self.restarts,
                            modality=self.plan.get("modality"))

    def _follow(self, child: _Child) -> bool:
        """Read one child to its end; False when the search must stop (budget, setup error)."""
        try:
            while True:
                now = self.clock()
                if now >= self.deadline:
                    self._stop(child, self._budget_reason())
                    self._budget_spent()
                    return False
                limit = self._stall_limit()
                if limit is not None and self.running and now - self.running["since"] > limit:
                    self._stop(child, self._stall_reason(now - self.running["since"]), "dropped")
                    self.restarts += 1
                    return True
                ready, _, _ = select.select([child.fd], [], [], max(0.0, min(
                    _READ_EVERY_S, self.deadline - now)))
                if ready:
                    chunk = os.read(child.fd, 65536)
                    if not chunk:
                        return self._ended(child)
                    child.buffer += chunk
                    *lines, child.buffer = child.buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self._event(json.loads(line))
                    if self.finished:  # its TF teardown takes seconds: not worth waiting for
                        return True
                self.progress.update(0, values=self._values)
        finally:
            _close(child)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "plan":
            self.pending = [tuple(p) for p in event["pairs"]]
            self.skipped = event["skipped"]
            self.plan = {**event, "pairs": list(self.pending)}
            for row in self.skipped:
                self._log(row)
        elif kind == "start":
            self.running = {"pair": (event["policy"], event["xla"]), "since": self.clock(),
                            "steps": [], "warmup_s": None}
        elif kind == "warm":
            self.running.update(warmup_s=event["warmup_s"], since=self.clock())
        elif kind == "step":
            self.running["steps"].append(event["seconds"])
            self.running["since"] = self.clock()
        elif kind == "done":
            row = event["row"]
            self._record((row["policy"], row["xla"]), row)
        elif kind == "end":
            self.finished = True
        elif kind == "error":
            raise ConfigError(f"autotune could not set up its candidates: {event['message']}")

    def _record(self, pair: tuple[str, bool], row: dict[str, Any]) -> None:
        self.rows[pair] = row
        if self.pending and pair in self.pending:
            self.pending.remove(pair)
        self.running = None
        self._log(row)
        self.progress.update(values=self._values)

    def _ended(self, child: _Child) -> bool:
        code = child.process.wait()
        if self.pending is None:
            raise ConfigError(f"autotune's measuring process exited with code {code} before "
                              "it planned its candidates (its log above says why)")
        if self.running:  # died inside a candidate: that one failed, the others may still run
            self._stop_row(f"the measuring process exited with code {code}", "failed")
            self.restarts += 1
            return True
        for pair in list(self.pending):  # died between candidates: no retry loop on a crash
            self._record(pair, {"policy": pair[0], "xla": pair[1], "status": "failed",
                                "reason": f"the measuring process exited with code {code} "
                                          "before it started"})
        return False

    # stopping
    def _stop(self, child: _Child, reason: str, status: str = "stopped") -> None:
        child.process.kill()
        child.process.wait()
        if self.running:
            self._stop_row(reason, status)

    def _stop_row(self, reason: str, status: str) -> None:
        pair, steps = self.running["pair"], self.running["steps"]
        row: dict[str, Any] = {"policy": pair[0], "xla": pair[1], "status": status,
                               "reason": reason}
        if self.running["warmup_s"] is not None:
            row["warmup_s"] = self.running["warmup_s"]
        if steps:
            row.update(step_rates(steps, self.plan.get("global_batch_size") or 0))
        self._record(pair, row)

    def _budget_spent(self) -> None:
        self.stopped_at_budget = True
        for pair in list(self.pending or ()):
            self._record(pair, {"policy": pair[0], "xla": pair[1], "status": "skipped",
                                "reason": f"time budget ({self.config.autotune_budget_s:g} s) "
                                          "spent before it started"})

    def _budget_reason(self) -> str:
        where = "before its plan" if not self.running else (
            "during its warm-up (tracing/compilation)" if self.running["warmup_s"] is None
            else f"after {len(self.running['steps'])} of {self.config.autotune_steps} timed "
                 "steps")
        return f"stopped at the time budget ({self.config.autotune_budget_s:g} s) {where}"

    def _stall_reason(self, seconds: float) -> str:
        return (f"clearly slower: a timed step still running after {seconds:.1f} s, over "
                f"{DROP_AFTER_STEPS} × {DROP_MARGIN:g} × the best's median step "
                f"{1000 * self._best_median():.0f} ms; its process was stopped")

    def _log(self, row: dict[str, Any]) -> None:
        if not self.chief:
            return
        what = (f"{row['images_per_sec']:.1f} {self._unit().rate} ({row.get('timed_steps')} "
                "timed steps)"
                if row["status"] == "measured" else row.get("reason", ""))
        log.info("autotune %s xla=%s: %s: %s", row["policy"], row["xla"], row["status"], what)

    # what is known so far
    def _unit(self) -> ThroughputUnit:
        return throughput_unit(self.plan.get("modality"))

    def _best(self) -> dict[str, Any] | None:
        ok = [r for r in self.rows.values() if r["status"] == "measured"]
        return max(ok, key=lambda r: r["images_per_sec"]) if ok else None

    def _best_median(self) -> float | None:
        best = self._best()
        return best["step_ms_median"] / 1000 if best else None

    def _stall_limit(self) -> float | None:
        if not self.running or self.running["warmup_s"] is None:
            return None  # warm-up (compile) is not throughput: only the budget bounds it
        return stall_limit_s(self._best_median(), self.stall_min_s)

    def _values(self) -> dict[str, Any]:
        from ampflow.progress import _duration

        best, now = self._best(), self.clock()
        running, state = None, None
        if self.running:
            policy, jit = self.running["pair"]
            warm = self.running["warmup_s"] is not None
            running = f"{policy} xla={jit} " + (
                f"step {len(self.running['steps'])}/{self.config.autotune_steps}" if warm
                else "warm-up")
            state = {"xla": jit, "warm": warm, "steps": self.running["steps"],
                     "phase_s": now - self.running["since"]}
        pending = [x for p, x in self.pending or () if not (self.running
                                                            and (p, x) == self.running["pair"])]
        measured = list(self.rows.values())
        if self.running and self.running["steps"]:  # the running one's own warm-up and steps
            measured.append({"xla": self.running["pair"][1],
                             "warmup_s": self.running["warmup_s"],
                             "step_ms_median": 1000 * statistics.median(self.running["steps"])})
        seconds, estimated = eta_s(pending, state, self.config.autotune_steps, measured,
                                   self.deadline - now)
        if self.pending is None:  # the plan has not come yet: nothing is known but the budget
            seconds, estimated = max(self.deadline - now, 0.0), False
        total = len(self.plan.get("pairs", ()))
        return {"planned": total or None,
                "running": running,
                "fastest": (f"{best['policy']} xla={best['xla']} "
                            f"{best['images_per_sec']:.1f} {self._unit().rate}" if best
                            else None),
                "ETA": (_duration(seconds) if estimated
                        else f"<= {_duration(seconds)} (budget left; not measured yet)")}


def _close(child: _Child) -> None:
    if child.process.poll() is None:
        child.process.kill()
        child.process.wait()
    try:
        os.close(child.fd)
    except OSError:
        pass
    path = getattr(child.process, "request_path", None)
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def search(config, hardware: HardwareInfo | None = None, *, spawn: Callable = spawn_child,
           stall_min_s: float = STALL_MIN_S,
           clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """Measure the candidates in a child process within `config.autotune_budget_s` (doc above).

    Call it before this process makes its tf.distribute strategy (run_train does).
    """
    parse_policies(config.autotune_policies)  # a bad list fails here, not in the child
    if config.autotune_xla not in XLA_MODES:
        raise ConfigError(f"autotune_xla must be one of {XLA_MODES}. "
                          f"Received: {config.autotune_xla!r}")
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = _Search(config, hardware, spawn, stall_min_s, clock).run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the children are waited for
    result.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


# ---- the choice -----------------------------------------------------------------------------

def choose(result: SearchResult, runtime, hardware: HardwareInfo, config
           ) -> tuple[PrecisionSetup, dict[str, Any]]:
    """Pick the fastest measured candidate (agreed over workers); set it; return it and a report.

    With nothing measured within the budget, the rule's choice (`auto`), and the report says so.
    """
    import keras

    from ampflow.components.train.precision.policy import configure_precision

    rates = _agreed_rates(result.rows, runtime)
    ok = [r for r in result.rows if r["status"] == "measured" and (r["policy"], r["xla"]) in rates]
    baseline = next((r for r in ok if r["policy"] == "float32" and not r["xla"]), None)
    for r in ok:
        r["ratio_vs_float32"] = (rates[(r["policy"], r["xla"])]
                                 / rates[("float32", False)] if baseline else None)
    rule_policy, _ = choose_policy("auto", hardware)
    rule_jit, _ = choose_jit(None, hardware, rule_policy)
    formats = native_formats(hardware)
    unit = throughput_unit(result.modality)
    if ok:
        best = max(ok, key=lambda r: rates[(r["policy"], r["xla"])])
        rate = rates[(best["policy"], best["xla"])]
        why = (f"autotune: fastest of {len(ok)} measured candidates at {rate:.1f} {unit.rate}"
               + (f", {best['ratio_vs_float32']:.2f}x float32 without XLA" if baseline else "")
               + f" (the rule would pick {rule_policy}, xla={rule_jit})")
        keras.mixed_precision.set_global_policy(best["policy"])
        setup = PrecisionSetup(best["policy"], why, best["xla"], why, hardware.describe(),
                               formats)
    else:
        setup = configure_precision("auto", None, hardware)
        cause = (f"within its budget ({config.autotune_budget_s:g} s)"
                 if result.stopped_at_budget else "(each one failed: see autotune.candidates)")
        why = (f"autotune measured no candidate to the end {cause}: the rule's choice, "
               f"{setup.policy}, xla={setup.jit_compile}")
        setup = PrecisionSetup(setup.policy, why, setup.jit_compile, setup.jit_reason,
                               setup.hardware, formats)
    log.info("autotune chose %s, xla=%s: %s", setup.policy, setup.jit_compile, why)
    report = {
        "choice": {"policy": setup.policy, "xla": setup.jit_compile},
        "reason": why,
        "rule_choice": {"policy": rule_policy, "xla": rule_jit},
        "candidates": result.rows,
        "modality": result.modality,
        "throughput_unit": unit.rate,  # of every rate here (the rows' images_per_sec included)
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": config.autotune_steps,
        "drop_rule": (f"after {DROP_AFTER_STEPS} timed steps, dropped if its fastest step > "
                      f"{DROP_MARGIN:g} × the best's median step"),
        "global_batch_size": result.global_batch_size,
        "conv_layers": result.conv_layers,
        "budget_s": result.budget_s,
        "elapsed_s": result.elapsed_s,
        "cpu_s": result.cpu_s,
        "stopped_at_budget": result.stopped_at_budget,
        "restarts": result.restarts,
        "hardware": hardware.describe(),
        "native_formats": formats.as_metadata(),
    }
    return setup, report


def _agreed_rates(rows: list[dict[str, Any]], runtime) -> dict[tuple[str, bool], float]:
    """{pair: examples/s} of the pairs every worker measured, the mean over the workers.

    Every worker agrees on every possible pair in a fixed order, so the collectives match
    even where the workers' candidate lists differ.
    """
    by_pair = {(r["policy"], r["xla"]): r for r in rows if r["status"] == "measured"}
    if runtime is None or runtime.num_workers == 1:
        return {p: r["images_per_sec"] for p, r in by_pair.items()}
    rates = {}
    for pair in ALL_PAIRS:
        row = by_pair.get(pair)
        everyone = runtime.agree(1.0 if row else 0.0)
        rate = runtime.agree(row["images_per_sec"] if row else 0.0)
        if everyone >= 1.0 - 1e-9:
            rates[pair] = rate
    return rates
