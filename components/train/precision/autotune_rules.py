"""autotune's rules: which (policy, XLA) candidates to measure, when to drop or stop one, the ETA.

Plain Python, no process and no TensorFlow: autotune.py's search and its measuring process both
apply them, and the tests check them on injected step times. A candidate clearly slower than
the best so far is dropped, a stalled step stops it, and candidates the hardware rule knows to
be emulated or pathologically slow are skipped with the reason unless asked for. The rules'
measurements: docs/explanation/design-notes.md, "autotune_rules.py".
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from ampflow.components.train.precision.policy import (
    GpuInfo,
    HardwareInfo,
    choose_jit,
    choose_policy,
    native_formats,
)
from ampflow.errors import ConfigError

WARMUP_STEPS = 3
DROP_AFTER_STEPS = 3  # timed steps before a candidate may be dropped
DROP_MARGIN = 1.25  # dropped when its fastest step > this × the best's median step
STALL_MIN_S = 10.0  # a step is killed as a stall only past this (a restart costs a TF start-up)
LARGE_CONV_MODEL = 16  # convolutions from which XLA on a CPU is skipped unless asked for
XLA_MODES = ("auto", "both", "off", "on")
_TUNABLE = ("float32", "mixed_bfloat16", "mixed_float16")
ALL_PAIRS = tuple((p, x) for p in _TUNABLE for x in (False, True))


def candidates(hardware: HardwareInfo, policies: tuple[str, ...] | None = None,
               xla: str = "auto", conv_layers: int = 0
               ) -> tuple[list[tuple[str, bool]], list[dict[str, Any]]]:
    """(ordered (policy, xla) pairs to measure, rows for the ones skipped and why).

    Policies: the ones `native_formats` says the hardware computes natively (float32 always),
    or exactly `policies`. XLA: both settings, less those known pathological on a CPU
    (`xla="auto"`), or as `xla` says.
    """
    if xla not in XLA_MODES:
        raise ConfigError(f"autotune_xla must be one of {XLA_MODES}. Received: {xla!r}")
    unknown = [p for p in policies or () if p not in _TUNABLE]
    if unknown:
        raise ConfigError(f"autotune_policies must be among {_TUNABLE}. Received: {unknown}")
    formats = native_formats(hardware)
    pairs, skipped = [], []
    for policy in _TUNABLE:
        support = formats.of_policy(policy)
        if policies is not None and policy not in policies:
            continue
        for jit in _jit_options(hardware, xla):
            reason = (None if policies is not None or support.native else
                      f"not native here: {support.why} (measure it anyway with "
                      "--autotune-policies)")
            reason = reason or _xla_skip_reason(hardware, xla, policy, jit, conv_layers)
            if reason:
                skipped.append({"policy": policy, "xla": jit, "status": "skipped",
                                "reason": reason})
            else:
                pairs.append((policy, jit))
    rule_policy, _ = choose_policy("auto", hardware)
    rule_jit, _ = choose_jit(None, hardware, rule_policy)
    first = [p for p in (("float32", False), (rule_policy, rule_jit)) if p in pairs]
    return list(dict.fromkeys(first + pairs)), skipped


def _jit_options(hardware: HardwareInfo, xla: str) -> tuple[bool, ...]:
    if xla == "on" or (hardware.tpu and xla == "auto"):
        return (True,)
    return (False,) if xla == "off" else (False, True)


def _xla_skip_reason(hardware: HardwareInfo, xla: str, policy: str, jit: bool,
                     conv_layers: int) -> str | None:
    """Why XLA on/off is known pathological for this pair on a CPU (None: measure it)."""
    if xla != "auto" or hardware.gpus or hardware.tpu:
        return None
    if policy == "mixed_float16" and not jit:
        return ("float16 without XLA on a CPU: TF's float16 convolution gradients run "
                "0.02-0.03× float32 (benchmarks/results/native_formats.md); --autotune-xla both "
                "measures it")
    if jit and policy != "mixed_float16" and conv_layers >= LARGE_CONV_MODEL:
        return (f"XLA on a CPU for a model of {conv_layers} convolutions: its compile takes most "
                "of a minute and ResNet-50 ran at 0.16-0.2× the speed without XLA (no oneDNN "
                "convolutions); --autotune-xla both measures it")
    return None


def count_convolutions(model) -> int:
    """Convolution layers of `model`, nested models included (the XLA-on-CPU rule's size)."""
    import keras

    return sum(isinstance(layer, keras.layers.Conv1D | keras.layers.Conv2D | keras.layers.Conv3D
                          | keras.layers.DepthwiseConv2D | keras.layers.SeparableConv2D)
               for layer in model._flatten_layers(include_self=False))


def clearly_slower(step_seconds: list[float], best_median_s: float | None) -> bool:
    """Whether a candidate's timed steps so far show it cannot beat the best (module doc)."""
    return (best_median_s is not None and len(step_seconds) >= DROP_AFTER_STEPS
            and min(step_seconds) > DROP_MARGIN * best_median_s)


def stall_limit_s(best_median_s: float | None, stall_min_s: float = STALL_MIN_S) -> float | None:
    """How long one timed step may run before its candidate is killed (None: no best yet)."""
    if best_median_s is None:
        return None
    return max(stall_min_s, DROP_AFTER_STEPS * DROP_MARGIN * best_median_s)


def eta_s(pending: list[bool], running: dict[str, Any] | None, steps: int,
          measured: list[dict[str, Any]], budget_left_s: float) -> tuple[float, bool]:
    """(seconds left, whether they are an estimate from measured time rather than the budget).

    `pending`: the XLA setting of each candidate not started; `running`: {"xla", "phase_s"
    (seconds into its current phase), "steps" (its timed steps so far), "warm" (warmed up)}.
    From measured time only, per XLA setting (an XLA compile is another cost): a candidate
    costs the mean warm-up measured with its setting plus `steps` at their median step; the
    running one what is left of that. A setting not measured yet makes the time unknown: only
    the budget left is shown. Never more than the budget left.
    """
    def cost(xla: bool, what: str) -> float | None:
        key = "warmup_s" if what == "warm" else "step_ms_median"
        values = [r[key] for r in measured if r.get("xla") == xla and key in r]
        if not values:
            return None
        return statistics.mean(values) if what == "warm" else statistics.median(values) / 1000

    estimate = 0.0
    todo = [(x, "warm", 1.0) for x in pending] + [(x, "step", steps) for x in pending]
    if running:
        if running["steps"]:
            estimate += (steps - len(running["steps"])) * statistics.median(running["steps"])
        else:
            todo.append((running["xla"], "step", steps))
            if not running["warm"]:
                warm = cost(running["xla"], "warm")
                estimate += max((warm or 0.0) - running["phase_s"], 0.0)
                todo += [] if warm is not None else [(running["xla"], "warm", 1.0)]
    for xla, what, count in todo:
        each = cost(xla, what)
        if each is None:
            return max(budget_left_s, 0.0), False
        estimate += count * each
    return max(min(estimate, budget_left_s), 0.0), estimate < budget_left_s


def parse_policies(text: str | None) -> tuple[str, ...] | None:
    """`--autotune-policies`: None (the native ones) or the listed ones, checked."""
    if not text:
        return None
    policies = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in policies if p not in _TUNABLE]
    if unknown or not policies:
        raise ConfigError(f"autotune_policies must be among {', '.join(_TUNABLE)}. "
                          f"Received: autotune_policies={text!r}")
    return policies


def config_to_dict(config) -> dict[str, Any]:
    """The TrainConfig for the child: JSON values; one local process (TF_CONFIG is dropped)."""
    from dataclasses import fields

    values = {f.name: getattr(config, f.name) for f in fields(config)}
    values.update(workers=1, strategy="auto")
    return {k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in values.items()}


def hardware_to_dict(hardware: HardwareInfo) -> dict[str, Any]:
    """An injected HardwareInfo (tests) for the child."""
    return {"gpus": [[g.name, g.vendor, g.compute_capability] for g in hardware.gpus],
            "tpu": hardware.tpu, "cpu_flags": sorted(hardware.cpu_flags)}


def hardware_from_dict(data: dict[str, Any]) -> HardwareInfo:
    """The inverse of `hardware_to_dict`."""
    return HardwareInfo(
        gpus=tuple(GpuInfo(n, v, tuple(cc) if cc else None) for n, v, cc in data["gpus"]),
        tpu=data["tpu"], cpu_flags=frozenset(data["cpu_flags"]))


def step_rates(times: list[float], global_batch: int) -> dict[str, float]:
    """A candidate's timed steps as rates: examples per second, mean and median step.

    `images_per_sec` counts examples of either kind (texts for a text model): the name is the
    one benchmarks/results hold; the report's `throughput_unit` says the unit (throughput.py).
    """
    return {"timed_steps": len(times),
            "images_per_sec": len(times) * global_batch / sum(times),
            "step_ms": 1000 * sum(times) / len(times),
            "step_ms_median": 1000 * statistics.median(times)}
