"""`ampflow train --autotune`: pick the (policy, XLA) pair by measuring it, not by rule.

The rule-based `auto` (precision.py) is right on the hardware it was measured on, but not
everywhere: XLA slowed every CPU policy here and usually helps on GPUs, and a bf16-capable CPU
gains only on compute-bound models. So, before training, each candidate that the hardware
supports runs a few warm-up steps (tracing and XLA compilation, excluded from the timing) and
then `autotune_steps` timed steps of the real training step (`TrainLoop`, the same model,
global batch and input pipeline the run uses), and the fastest wins. float32 without XLA is
always measured first, so the choice is never slower than it on that machine; the rule's own
choice is measured second, so a tight budget still compares the two that matter most.

The budget is checked between candidates, on the workers' agreed elapsed time (a worker that
skipped a candidate alone would leave the others waiting in a collective).
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from ampflow.components.train.precision import (
    _CPU_BF16_FLAGS,
    HardwareInfo,
    PrecisionSetup,
    choose_jit,
    choose_policy,
    detect_hardware,
)
from ampflow.errors import ConfigError
from ampflow.progress import Progress

log = logging.getLogger(__name__)

WARMUP_STEPS = 3
_CPU_FP16_FLAGS = frozenset({"avx512_fp16", "amx_fp16"})
_TUNABLE = ("float32", "mixed_bfloat16", "mixed_float16")


def native_support(hardware: HardwareInfo) -> dict[str, str | None]:
    """{policy: None if the hardware computes it natively, else why it is not a candidate}."""
    nvidia = [g for g in hardware.gpus if g.vendor == "nvidia"]
    cc = tuple(nvidia[0].compute_capability or (0, 0)) if nvidia else None
    support: dict[str, str | None] = {"float32": None}
    if hardware.tpu or (cc and cc >= (8, 0)) or hardware.cpu_flags & _CPU_BF16_FLAGS:
        support["mixed_bfloat16"] = None
    else:
        support["mixed_bfloat16"] = (
            "no native bfloat16 math (needs a TPU, an NVIDIA GPU of compute capability >= 8.0 "
            "or a CPU with AVX512_BF16/AMX): emulated, it runs slower than float32")
    if (cc and cc >= (7, 0)) or hardware.cpu_flags & _CPU_FP16_FLAGS:
        support["mixed_float16"] = None
    else:
        support["mixed_float16"] = (
            "no native float16 math (needs an NVIDIA GPU of compute capability >= 7.0 or a CPU "
            "with AVX512_FP16/AMX-FP16): it runs at float32 speed at best, and ~80x slower "
            "without XLA on a CPU (docs/DESIGN.md, \"Precision policy\")")
    return support


def candidates(hardware: HardwareInfo,
               policies: tuple[str, ...] | None = None) -> tuple[list[tuple[str, bool]],
                                                                 list[dict[str, Any]]]:
    """(ordered (policy, xla) pairs to measure, rows for the ones skipped and why)."""
    support = native_support(hardware)
    requested = policies or _TUNABLE
    unknown = [p for p in requested if p not in _TUNABLE]
    if unknown:
        raise ConfigError(f"autotune_policies must be among {_TUNABLE}. Received: {unknown}")
    jit_options = (True,) if hardware.tpu else (False, True)
    pairs, skipped = [], []
    for policy in _TUNABLE:
        if policy not in requested:
            continue
        if support[policy] and policies is None:  # an explicit list measures it anyway
            skipped += [{"policy": policy, "xla": jit, "status": "skipped",
                         "reason": support[policy]} for jit in jit_options]
            continue
        pairs += [(policy, jit) for jit in jit_options]
    rule_policy, _ = choose_policy("auto", hardware)
    rule_jit, _ = choose_jit(None, hardware, rule_policy)
    first = [p for p in ((("float32", False)), (rule_policy, rule_jit)) if p in pairs]
    ordered = list(dict.fromkeys(first + pairs))
    return ordered, skipped


def autotune(config, info: dict, runtime, hardware: HardwareInfo | None = None):
    """Measure the candidates; set and return the fastest as a `PrecisionSetup`, and a report."""
    import keras

    from ampflow.components.train.build import training_data

    hardware = hardware or detect_hardware()
    policies = tuple(p.strip() for p in config.autotune_policies.split(",") if p.strip()) \
        if config.autotune_policies else None
    pairs, rows = candidates(hardware, policies)
    global_batch = config.batch_size * runtime.num_replicas
    train_ds, _, _ = training_data(config, info, global_batch)
    from ampflow.components.train.loop import distribute_datasets

    dataset, _ = distribute_datasets(runtime, train_ds, None)
    started = time.monotonic()
    measured: list[dict[str, Any]] = []
    progress = Progress(len(pairs), "autotune", unit="candidate", enabled=runtime.is_chief)
    for policy, jit in pairs:
        elapsed = runtime.agree(time.monotonic() - started)
        if measured and elapsed > config.autotune_budget_s:
            rows.append({"policy": policy, "xla": jit, "status": "skipped",
                         "reason": f"time budget ({config.autotune_budget_s:g} s) spent"})
            progress.update()
            continue
        progress.update(0, values=_progress_values(measured, f"{policy} xla={jit}"))
        row = _measure(config, info, runtime, hardware, dataset, policy, jit, global_batch)
        log.info("autotune %s xla=%s: %s", policy, jit,
                 f"{row['images_per_sec']:.1f} img/s" if "images_per_sec" in row
                 else row["reason"])
        measured.append(row)
        progress.update(values=_progress_values(measured, None))
    progress.close()
    rows = measured + rows
    ok = [r for r in measured if r["status"] == "measured"]
    if not ok:
        raise ConfigError("autotune measured no candidate: " + "; ".join(
            f"{r['policy']} xla={r['xla']}: {r.get('reason')}" for r in rows))
    baseline = next((r for r in ok if r["policy"] == "float32" and not r["xla"]), None)
    for r in ok:
        r["ratio_vs_float32"] = (r["images_per_sec"] / baseline["images_per_sec"]
                                 if baseline else None)
    best = max(ok, key=lambda r: r["images_per_sec"])
    rule_policy, _ = choose_policy("auto", hardware)
    rule_jit, _ = choose_jit(None, hardware, rule_policy)
    why = (f"autotune: fastest of {len(ok)} measured candidates at "
           f"{best['images_per_sec']:.1f} img/s"
           + (f", {best['ratio_vs_float32']:.2f}x float32 without XLA" if baseline else "")
           + f" (the rule would pick {rule_policy}, xla={rule_jit})")
    keras.mixed_precision.set_global_policy(best["policy"])
    setup = PrecisionSetup(best["policy"], why, best["xla"], why, hardware.describe())
    log.info("autotune chose %s, xla=%s: %s", best["policy"], best["xla"], why)
    report = {
        "choice": {"policy": best["policy"], "xla": best["xla"]},
        "reason": why,
        "rule_choice": {"policy": rule_policy, "xla": rule_jit},
        "candidates": rows,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps": config.autotune_steps,
        "global_batch_size": global_batch,
        "budget_s": config.autotune_budget_s,
        "elapsed_s": time.monotonic() - started,
        "hardware": hardware.describe(),
    }
    return setup, report


def _progress_values(measured: list[dict[str, Any]], running: str | None) -> dict[str, Any]:
    """What the progress display shows: the candidate running and the fastest so far."""
    ok = [r for r in measured if r["status"] == "measured"]
    best = max(ok, key=lambda r: r["images_per_sec"]) if ok else None
    return {"running": running,
            "fastest": (f"{best['policy']} xla={best['xla']} {best['images_per_sec']:.1f} img/s"
                        if best else None)}


def _measure(config, info, runtime, hardware, dataset, policy: str, jit: bool,
             global_batch: int) -> dict[str, Any]:
    """Warm up (compile), then time `autotune_steps` steps of the real train step."""
    import keras

    from ampflow.components.train.build import build_compiled_model
    from ampflow.components.train.loop import LoopConfig, TrainLoop

    row: dict[str, Any] = {"policy": policy, "xla": jit}
    keras.mixed_precision.set_global_policy(policy)
    setup = PrecisionSetup(policy, "autotune candidate", jit, "autotune candidate",
                           hardware.describe())
    keras.utils.set_random_seed(config.seed)
    try:
        model = build_compiled_model(config, info, setup, runtime, config.learning_rate)
        loop = TrainLoop(runtime, model, LoopConfig(
            epochs=1, steps_per_epoch=config.autotune_steps, global_batch_size=global_batch,
            jit_compile=jit, loss_scaling=setup.loss_scaling, state_dir=""))
        iterator = iter(dataset)
        began = time.perf_counter()
        loop.run_steps(iterator, WARMUP_STEPS)
        row["warmup_s"] = time.perf_counter() - began
        began = time.perf_counter()
        loop.run_steps(iterator, config.autotune_steps)
        seconds = runtime.agree(time.perf_counter() - began)
    except Exception as e:  # a candidate that cannot run here (an XLA or kernel error)
        log.warning("autotune candidate %s xla=%s failed: %s", policy, jit, e)
        return {**row, "status": "failed", "reason": str(e).strip().splitlines()[0][:300]}
    finally:
        gc.collect()
    ips = config.autotune_steps * global_batch / seconds
    return {**row, "status": "measured", "images_per_sec": ips,
            "step_ms": 1000 * seconds / config.autotune_steps}
