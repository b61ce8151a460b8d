"""`ampflow demo`: the whole mission on this machine, in a few minutes on 2 CPU cores.

1. Run the KFP pipeline with the local runner (data → AMP training and float32 training →
   FP32-parity gate: numerics against the float32 twin, accuracy against the float32-trained
   model → SavedModel export → TFLite variants → deploy into a local TF Serving model base
   path). The results table shows the AMP-vs-float32 trained accuracy and the AMP speedup.
2. Serve that base path with `ampflow serve` (a separate process speaking TF Serving's gRPC API;
   `--server auto`: the real `tensorflow_model_server` only where it can honour every flag,
   which with the demo's flags it cannot).
3. Query it over gRPC with the tensorflow-serving-api client, print predictions and a results
   table (saved as `<workdir>/results.txt` and `results.json`), and stop the server it started.

It prints one line as each step starts and one as it ends (time and headline number); each
step's full output is in `<workdir>/logs/<step>.log` (`--verbose` streams it as well).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ampflow.errors import ConfigError, ServingError
from ampflow.pipeline.parameters import data_modality
from ampflow.pipeline.run_local import LocalRunConfig
from ampflow.serving.model_format import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig(LocalRunConfig):
    """A local run plus how to serve and query it."""

    workdir: Path = field(default=Path("runs/demo"), metadata={
        "help": "Holds the run's pipeline_root/, serving/, logs/ (one per step, the server's "
                "too) and results.txt/.json."})
    port: int = field(default=0, metadata={"help": "gRPC port for the server (0: a free one)."})
    num_queries: int = field(default=8, metadata={"help": "Test images to show predictions for."})

    def __post_init__(self) -> None:
        super().__post_init__()
        # The query step sends test images; on text it would fail after the whole run trained.
        # A TFDS name says its kind only once read: that case fails there, in one line too.
        if data_modality(self.arguments()) == "text":
            raise ConfigError(
                "the demo queries images: for text, run `ampflow run-local`, then `ampflow "
                "serve` and `ampflow predict --text` (docs/how-to/text-models.md#the-whole-"
                f"pipeline-on-text). Received: {_data_source(self)}")


def _data_source(config: DemoConfig) -> str:
    """The flag that made the data text, as `name='value'`."""
    for name in ("text_folder", "text_file", "text_feature"):
        if getattr(config, name):
            return f"{name}={getattr(config, name)!r}"
    return f"dataset={config.dataset!r}"


def run_demo(config: DemoConfig, *, verbose: bool = False) -> dict:
    """Run, serve, query; print and save the results table; return the serving numbers.

    Prints one line per step as it starts and ends; every step's full output is in
    `<workdir>/logs/<step>.log` (`verbose`: streamed as well).
    """
    from ampflow.pipeline.report import results, results_table, save_results
    from ampflow.pipeline.run_local import run_local

    _say_policy(config.precision)
    result = run_local(config, verbose=verbose)
    port = config.port or _free_port()
    log_path = config.log_dir / "serve.log"
    with _server(config.model_name, result.serving_base, port, log_path), \
            _library_info_hidden(unless=verbose):
        served = _query(f"127.0.0.1:{port}", config, result)
    rows = results(result, served)
    print(f"\n{results_table(rows)}\n")
    text = save_results(config.workdir, result, rows, {**result.logs, "serve": log_path}, served)
    print(f"Saved as {text} and {text.with_suffix('.json')}.\n"
          f"Full logs, one per step: {config.log_dir}/<step>.log "
          f"({', '.join(p.stem for p in [*result.logs.values(), log_path])}).\n"
          f"Artifacts: {result.run_dir}/<step>/<output>; served from {result.serving_base}.")
    return served


def _say_policy(requested: str) -> None:
    from ampflow.components.train.precision.policy import choose_policy, detect_hardware

    auto, reason = choose_policy("auto", detect_hardware())
    if requested != auto:
        print(f"ampflow demo: training under {requested}"
              + (" so that dynamic loss scaling and its telemetry run even here"
                 if requested == "mixed_float16" else "")
              + f"; --precision auto would pick {auto} on this machine: {reason}.")


@contextlib.contextmanager
def _server(model_name: str, base: Path, port: int, log_path: Path) -> Iterator[None]:
    """Start `ampflow serve` as its own process; SIGTERM it (drain, exit 0) on the way out.

    Not `serving.testing.ServeProcess`: that one always runs `--server local` on a free port,
    while the demo's server is `--server auto` on the demo's port.
    """
    cmd = [sys.executable, "-m", "ampflow.cli", "serve", "--model-name", model_name,
           "--model-base-path", str(base), "--port", str(port)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        _step("serve", f"started: `ampflow serve` on 127.0.0.1:{port} (pid {proc.pid})")
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _step("serve", f"stopped (exit code {proc.returncode})")


def _query(address: str, config: DemoConfig, result) -> dict:
    from ampflow.data import load_arrays
    from ampflow.serving.client import PredictionClient

    data_dir = result.artifacts["prepare-data"]["data"]
    images, labels = load_arrays(data_dir, "test")
    started = time.monotonic()
    with PredictionClient(address, timeout_s=10.0) as client:
        try:
            version = client.wait_until_available(config.model_name, timeout=120)
        except ServingError as e:
            raise ServingError(f"{e}; see the server log in {config.log_dir}/serve.log") from e
        sig = client.signature_defs(config.model_name)[DEFAULT_SIGNATURE]
        _step("serve", f"done in {time.monotonic() - started:5.1f} s  version {version} "
                       f"AVAILABLE: serving_default {', '.join(sorted(sig.inputs))} → "
                       f"{', '.join(sorted(sig.outputs))}")
        started = time.monotonic()
        latencies = []
        shown = images[: config.num_queries].astype("float32")
        for image in shown:
            start = time.perf_counter()
            client.predict(config.model_name, image[np.newaxis])
            latencies.append(1000 * (time.perf_counter() - start))
        batch = client.predict(config.model_name, images.astype("float32")).outputs
    predicted = batch["probabilities"].argmax(axis=1)
    pairs = " ".join(f"{labels[i]}→{predicted[i]}" for i in range(len(shown)))
    right = int(np.sum(predicted[: len(shown)] == labels[: len(shown)]))
    served = {"version": version, "address": address,
              "served_accuracy": float(np.mean(predicted == labels)),
              "served_examples": int(len(labels)),
              "grpc_p50_ms": float(np.median(latencies))}
    _step("gRPC Predict", f"done in {time.monotonic() - started:5.1f} s  label→predicted "
                          f"{pairs} ({right} of {len(shown)} right); all "
                          f"{len(labels)} test images: accuracy {served['served_accuracy']:.4f}")
    return served


@contextlib.contextmanager
def _library_info_hidden(*, unless: bool) -> Iterator[None]:
    """TFDS's info lines (through absl) stay out of the progress lines, unless `unless`."""
    absl = logging.getLogger("absl")
    saved = absl.level
    if not unless:
        absl.setLevel(max(saved, logging.WARNING))
    try:
        yield
    finally:
        absl.setLevel(saved)


def _step(name: str, text: str) -> None:
    """A progress line in the same columns as the pipeline's steps."""
    print(f"  {name:<18} {text}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
