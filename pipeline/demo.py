"""`ampflow demo`: the whole mission on this machine, in a few minutes on 2 CPU cores.

1. Run the KFP pipeline with the local runner (data → AMP training and float32 training →
   FP32-parity gate: numerics against the float32 twin, accuracy against the float32-trained
   model → SavedModel export → TFLite variants → deploy into a local TF Serving model base
   path). The results table shows the AMP-vs-float32 trained accuracy and the AMP speedup.
2. Serve that base path with `ampflow serve` (a separate process speaking TF Serving's gRPC API;
   the real `tensorflow_model_server` is used instead when it is on PATH).
3. Query it over gRPC with the tensorflow-serving-api client, print predictions and a results
   table, and stop the server it started.
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

from ampflow.errors import ServingError
from ampflow.pipeline.run_local import LocalRunConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig(LocalRunConfig):
    """A local run plus how to serve and query it."""

    workdir: Path = field(default=Path("runs/demo"), metadata={
        "help": "Holds the run's pipeline_root/, serving/ and the server log."})
    port: int = field(default=0, metadata={"help": "gRPC port for the server (0: a free one)."})
    num_queries: int = field(default=8, metadata={"help": "Test images to show predictions for."})


def run_demo(config: DemoConfig) -> dict:
    """Run, serve, query; return the numbers printed in the results table."""
    from ampflow.pipeline.report import results_table, summarize_run
    from ampflow.pipeline.run_local import run_local

    _say_policy(config.precision)
    result = run_local(config)
    print(summarize_run(result))
    port = config.port or _free_port()
    log_path = Path(config.workdir) / "server.log"
    with _server(config.serving_model_name, result.serving_base, port, log_path):
        served = _query(f"127.0.0.1:{port}", config, result)
    print(results_table(result, served))
    return served


def _say_policy(requested: str) -> None:
    from ampflow.components.train.precision import choose_policy, detect_hardware

    auto, reason = choose_policy("auto", detect_hardware())
    if requested != auto:
        print(f"\nampflow demo: training under {requested}"
              + (" so that dynamic loss scaling and its telemetry run even here"
                 if requested == "mixed_float16" else "")
              + f"; --precision auto would pick {auto} on this machine: {reason}.\n")


@contextlib.contextmanager
def _server(model_name: str, base: Path, port: int, log_path: Path) -> Iterator[None]:
    """Start `ampflow serve` as its own process; SIGTERM it (drain, exit 0) on the way out."""
    cmd = [sys.executable, "-m", "ampflow.cli", "serve", "--model-name", model_name,
           "--model-base-path", str(base), "--port", str(port)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        print(f"ampflow demo: serving {base} on 127.0.0.1:{port} (pid {proc.pid}, "
              f"log {log_path})")
        try:
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"ampflow demo: server stopped (exit code {proc.returncode})")


def _query(address: str, config: DemoConfig, result) -> dict:
    from ampflow.components.prepare_data import load_arrays
    from ampflow.serving.client import PredictionClient

    data_dir = result.artifacts["prepare-data"]["data"]
    images, labels = load_arrays(data_dir, "test")
    with PredictionClient(address, timeout_s=10.0) as client:
        try:
            version = client.wait_until_available(config.serving_model_name, timeout=120)
        except ServingError as e:
            raise ServingError(f"{e}; see the server log in {config.workdir}/server.log") from e
        sig = client.metadata(config.serving_model_name)["serving_default"]
        print(f"ampflow demo: version {version} AVAILABLE; serving_default inputs "
              f"{sorted(sig.inputs)} → outputs {sorted(sig.outputs)}")
        latencies = []
        shown = images[: config.num_queries].astype("float32")
        for image in shown:
            start = time.perf_counter()
            client.predict(config.serving_model_name, image[np.newaxis])
            latencies.append(1000 * (time.perf_counter() - start))
        batch = client.predict(config.serving_model_name, images.astype("float32")).outputs
    probabilities = batch["probabilities"]
    predicted = probabilities.argmax(axis=1)
    print("\nampflow demo: gRPC Predict on test images (label → predicted, probability)")
    for i in range(len(shown)):
        print(f"  image {i}: {labels[i]} → {predicted[i]}  ({probabilities[i].max():.3f})"
              f"{'' if labels[i] == predicted[i] else '   ✗'}")
    return {"version": version, "address": address,
            "served_accuracy": float(np.mean(predicted == labels)),
            "served_examples": int(len(labels)),
            "grpc_p50_ms": float(np.median(latencies))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
