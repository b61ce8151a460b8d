"""`ampflow train --workers N`: start N local worker processes with TF_CONFIG, nothing more.

Each worker is `python -m ampflow.cli train <the same flags>` with the TF_CONFIG a TFJob would
give it (worker i of N on loopback ports), so what runs here is exactly what runs in a cluster;
tf.distribute does the rest. The launcher only starts, watches and stops processes: free ports
(or `--launcher-port`), one log prefix per worker, every worker stopped as soon as one fails,
and the chief's published model as the result. It schedules, restarts and reduces nothing.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from ampflow.components.train.clusters.tf_config import (
    PEER_LOST_EXIT_CODE,
    TF_CONFIG,
    read_tf_config,
)
from ampflow.errors import AmpflowError, ConfigError

log = logging.getLogger(__name__)

_LAUNCHER_ONLY = ("workers", "launcher_port", "cpus_per_worker")
_STOP_GRACE_S = 10.0
_POLL_S = 0.2
_HOST = "127.0.0.1"


class WorkerFailedError(AmpflowError):
    """A local worker exited with an error; the others were stopped."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code if exit_code > 0 else 1


def launch_local_workers(config) -> Path:
    """Run `config` (a TrainConfig) on `config.workers` local processes; the chief's output dir.

    Returns once every worker has exited 0; run_train then reads what the chief published.
    """
    from ampflow.files import ensure_writable_dir

    if read_tf_config() is not None:
        raise ConfigError(
            "--workers starts a local cluster and sets TF_CONFIG itself, but TF_CONFIG is "
            "already set (a TFJob pod is one worker): drop --workers or unset TF_CONFIG")
    output_dir = ensure_writable_dir(config.output_dir, "output_dir")
    ports = local_ports(config.workers, config.launcher_port)
    argv = [sys.executable, "-m", "ampflow.cli", "--log-level", _log_level(), "train",
            *config_to_argv(config)]
    run_workers(argv, tf_configs(ports), cpus_per_worker=config.cpus_per_worker)
    return output_dir


def tf_configs(ports: list[int]) -> list[dict]:
    """The TF_CONFIG of each worker of a loopback cluster on `ports` (worker 0 is the chief)."""
    cluster = {"worker": [f"{_HOST}:{p}" for p in ports]}
    return [{"cluster": cluster, "task": {"type": "worker", "index": i}}
            for i in range(len(ports))]


def local_ports(count: int, first: int | None = None) -> list[int]:
    """`count` loopback ports: `first`, `first`+1, ... if given (each checked), else free ones."""
    if first is None:
        with ExitStack() as stack:  # held together, so the OS gives `count` distinct ports
            sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
            for s in sockets:
                s.bind((_HOST, 0))
            return [s.getsockname()[1] for s in sockets]
    ports = list(range(first, first + count))
    if ports[-1] > 65535:
        raise ConfigError(f"launcher_port + workers - 1 must be <= 65535. Received: "
                          f"launcher_port={first}, workers={count}")
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                raise ConfigError(
                    f"port {port} is already in use (the local cluster needs ports "
                    f"{ports[0]}-{ports[-1]}): pick another --launcher-port or leave it unset "
                    "for free ports") from e
    return ports


def config_to_argv(config) -> list[str]:
    """The `ampflow train` flags that rebuild `config` in a worker (launcher flags dropped)."""
    argv: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in _LAUNCHER_ONLY or value is None:
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool) and f.metadata.get("tristate"):
            argv += [flag, "on" if value else "off"]  # --xla auto|on|off
        elif isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, os.fspath(value) if isinstance(value, Path) else str(value)]
    return argv


def run_workers(argv: list[str], configs: list[dict], cpus_per_worker: int | None = None,
                stream=None) -> None:
    """Start one process per TF_CONFIG, prefix their output, stop all if one fails."""
    stream = stream or sys.stderr
    procs: list[subprocess.Popen] = []
    last_error: dict[int, str] = {}
    pumps = []
    try:
        for index, tf_config in enumerate(configs):
            proc = _start(argv, tf_config, index, cpus_per_worker)
            procs.append(proc)
            log.info("started worker %d of %d (pid %d) on %s", index, len(configs), proc.pid,
                     tf_config["cluster"]["worker"][index])
            pump = threading.Thread(target=_pump, args=(proc, index, stream, last_error),
                                    daemon=True)
            pump.start()
            pumps.append(pump)
        failed = _wait(procs)
    except BaseException:
        _stop(procs)
        raise
    for pump in pumps:  # every worker has exited: its pipe closes once its stderr filter ends
        pump.join(timeout=60)  # (generous: a pump cut short loses a worker's last lines)
    if failed is not None:
        index, code = failed
        raise WorkerFailedError(
            f"worker {index} {_describe_exit(code)}"
            + (f": {last_error[index]}" if index in last_error else "")
            + "; stopped the other workers (a rerun with the same --checkpoint-dir resumes)",
            exit_code=code if code > 0 else 1)


def _start(argv, tf_config: dict, index: int, cpus_per_worker: int | None) -> subprocess.Popen:
    env = {**os.environ, TF_CONFIG: json.dumps(tf_config), "PYTHONUNBUFFERED": "1"}
    if cpus_per_worker:
        env.update(TF_NUM_INTRAOP_THREADS=str(cpus_per_worker), TF_NUM_INTEROP_THREADS="1",
                   OMP_NUM_THREADS=str(cpus_per_worker))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    if cpus_per_worker:
        # Set from here, not in a preexec_fn (unsafe with the log threads running): the child
        # is still importing Python, and the threads TF starts later inherit the mask.
        os.sched_setaffinity(proc.pid, _cores(index, cpus_per_worker))
    return proc


def _cores(index: int, per_worker: int) -> set[int]:
    available = sorted(os.sched_getaffinity(0))
    return {available[(index * per_worker + k) % len(available)] for k in range(per_worker)}


_OUTPUT_LOCK = threading.Lock()


def _pump(proc: subprocess.Popen, index: int, stream, last_error: dict[int, str]) -> None:
    """Copy one worker's output to `stream`, each line whole and prefixed with its worker.

    One write per line under a lock shared by every pump: `print` writes the text and the
    newline separately, so two workers logging at the same moment (they finish in lockstep)
    could leave `[worker 1] ...[worker 0] ...` on one line and an empty line after it.
    """
    for line in proc.stdout:
        line = line.rstrip("\n")
        if ": error: " in line:
            last_error[index] = line.split(": error: ", 1)[1]
        with _OUTPUT_LOCK:
            stream.write(f"[worker {index}] {line}\n")
            stream.flush()


def _wait(procs: list[subprocess.Popen]) -> tuple[int, int] | None:
    """Wait for all; on the first failure stop the rest and return (index, exit code).

    When several have failed by the same poll, the cause is named, not a peer that only
    lost it: a worker that exited PEER_LOST_EXIT_CODE is reported only if no other failed.
    """
    while True:
        codes = [p.poll() for p in procs]
        failed = [(code == PEER_LOST_EXIT_CODE, index, code)
                  for index, code in enumerate(codes) if code is not None and code != 0]
        if failed:
            _stop(procs)
            _, index, code = min(failed)
            return index, code
        if all(code == 0 for code in codes):
            return None
        time.sleep(_POLL_S)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live worker, then SIGKILL whoever is still there after a grace period."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _log_level() -> str:
    return logging.getLevelName(logging.getLogger().getEffectiveLevel())
