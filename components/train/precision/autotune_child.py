"""`--autotune`'s measuring process: set up the run's data and model once, time each candidate.

The parent's side (autotune.py: the budget, the stall rule, the choice) starts this module as
`python -m ampflow.components.train.precision.autotune_child REQUEST_FILE FD` and reads its
events (one JSON line per start, warm-up, timed step and result) from the pipe FD. Split from
autotune.py by role: this side imports TensorFlow, the parent must not before it has measured.

**Text models: the tokenizer is fitted once per process.** Fitting (TextVectorization `adapt`
on the training split) was done once for the input pipeline, once for the planning model and
once more for every candidate's model but the first (5 fits for bert_tiny's 4 candidates on
a bf16 CPU): seconds each on 2 cores, all out of the search's budget, and none changed
anything (the same split gives the same vocabulary). `_ChildRun` fits it once and hands it to
the pipeline and to every model.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ampflow.components.train.precision.autotune_rules import (
    DROP_MARGIN,
    WARMUP_STEPS,
    candidates,
    clearly_slower,
    count_convolutions,
    hardware_from_dict,
    parse_policies,
    step_rates,
)
from ampflow.components.train.precision.policy import PrecisionSetup
from ampflow.data.modality import MODALITY_IMAGE

# ---- the child: measures candidates, streams events ---------------------------------------

def run_candidates(pairs: list[tuple[str, bool]], steps: int, global_batch: int,
                   best_median_s: float | None, prepare: Callable, emit: Callable,
                   clock: Callable[[], float] = time.perf_counter) -> None:
    """Measure each pair: `prepare(policy, jit)` gives (warm_up(), one_step()); emit events.

    Shared by the real child and the tests' child (which injects its steps' durations through
    `clock`), so the drop rule the tests check is the one that runs.
    """
    for policy, jit in pairs:
        emit(event="start", policy=policy, xla=jit)
        row: dict[str, Any] = {"policy": policy, "xla": jit}
        try:
            warm_up, one_step = prepare(policy, jit)
            began = clock()
            warm_up()
            row["warmup_s"] = clock() - began
            emit(event="warm", warmup_s=row["warmup_s"])
            times: list[float] = []
            for _ in range(steps):
                began = clock()
                one_step()
                times.append(clock() - began)
                emit(event="step", seconds=times[-1])
                if clearly_slower(times, best_median_s):
                    break
        except Exception as e:  # a candidate that cannot run here (an XLA or kernel error)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            emit(event="done", row={**row, "status": "failed", "reason": reason})
            continue
        row.update(step_rates(times, global_batch))
        if len(times) < steps:
            row.update(status="dropped", reason=(
                f"clearly slower after {len(times)} of {steps} timed steps: its fastest step "
                f"{1000 * min(times):.0f} ms > {DROP_MARGIN:g} × the best's median step "
                f"{1000 * best_median_s:.0f} ms"))
        else:
            row["status"] = "measured"
            median_s = row["step_ms_median"] / 1000
            if best_median_s is None or median_s < best_median_s:
                best_median_s = median_s
        emit(event="done", row=row)


def _child_main(request_path: str, fd: int) -> int:
    """The child's body: set up the run's data and model once, then `run_candidates`."""
    out = os.fdopen(fd, "w", buffering=1)

    def emit(**event: Any) -> None:
        out.write(json.dumps(event) + "\n")

    try:
        request = json.loads(open(request_path).read())
        run = _ChildRun(request)
        pairs = ([tuple(p) for p in request["pairs"]] if request["pairs"] is not None
                 else run.plan(emit))
        run_candidates(pairs, run.config.autotune_steps, run.global_batch,
                       request["best_median_s"], run.prepare, emit)
    except Exception as e:
        emit(event="error", message=(str(e).strip().splitlines() or [type(e).__name__])[0])
        return 1
    emit(event="end")
    return 0


class _ChildRun:
    """The real child's data, runtime and candidate factory (one per search process)."""

    def __init__(self, request: dict) -> None:
        from ampflow.components.train.config import TrainConfig
        from ampflow.components.train.precision.policy import detect_hardware
        from ampflow.components.train.run.build import preprocessor_of, training_data
        from ampflow.components.train.run.strategy import distribute_datasets, make_runtime
        from ampflow.data import load_dataset_info

        self.config = TrainConfig(**request["config"])
        self.hardware = (hardware_from_dict(request["hardware"]) if request["hardware"]
                         else detect_hardware())
        self.info = load_dataset_info(self.config.data_dir)
        self.runtime = make_runtime(self.config)
        self.global_batch = self.config.batch_size * self.runtime.num_replicas
        self.tokenizer = preprocessor_of(self.config, self.info)  # once (doc above); None: images
        train_ds, _, _ = training_data(self.config, self.info, self.global_batch, self.tokenizer)
        self.dataset, _ = distribute_datasets(self.runtime, train_ds, None)
        self._loop = self._float32_model = None

    def plan(self, emit: Callable) -> list[tuple[str, bool]]:
        """Count the model's convolutions (the XLA rule), choose the candidates, emit them.

        The float32 model counted is kept for the float32 candidate (a ResNet-50 build less).
        """
        import keras

        from ampflow.components.train.run.build import build_uncompiled_model

        keras.mixed_precision.set_global_policy("float32")
        keras.utils.set_random_seed(self.config.seed)
        self._float32_model = build_uncompiled_model(self.config, self.info, self.runtime,
                                                     self.tokenizer)
        conv_layers = count_convolutions(self._float32_model)
        pairs, skipped = candidates(self.hardware, parse_policies(self.config.autotune_policies),
                                    self.config.autotune_xla, conv_layers)
        emit(event="plan", pairs=pairs, skipped=skipped, conv_layers=conv_layers,
             global_batch_size=self.global_batch, hardware=self.hardware.describe(),
             modality=self.info.get("modality") or MODALITY_IMAGE)  # the rates' unit
        return pairs

    def prepare(self, policy: str, jit: bool):
        """A fresh model and loop under the candidate's policy: (warm_up, one_step)."""
        import gc

        import keras

        from ampflow.components.train.run.build import build_compiled_model
        from ampflow.components.train.run.loop import LoopConfig, TrainLoop

        self._loop = None
        gc.collect()
        keras.mixed_precision.set_global_policy(policy)
        setup = PrecisionSetup(policy, "autotune candidate", jit, "autotune candidate",
                               self.hardware.describe())
        keras.utils.set_random_seed(self.config.seed)
        built, self._float32_model = self._float32_model, None  # plan()'s model, once
        if policy != "float32":
            built = None
        model = build_compiled_model(self.config, self.info, setup, self.runtime,
                                     self.config.learning_rate, model=built,
                                     tokenizer=self.tokenizer)
        loop = TrainLoop(self.runtime, model, LoopConfig(
            epochs=1, steps_per_epoch=self.config.autotune_steps,
            global_batch_size=self.global_batch, jit_compile=jit,
            loss_scaling=setup.loss_scaling, state_dir="", progress=False))
        self._loop, iterator = loop, iter(self.dataset)
        return (lambda: loop.run_steps(iterator, WARMUP_STEPS),
                lambda: loop.run_steps(iterator, 1))


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], int(sys.argv[2])))
