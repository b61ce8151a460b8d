"""`ampflow serve --workers N`: N server processes behind the same gRPC and REST ports.

One Python server process is held to about one core by its interpreter lock; with `--workers
N` the `serve` process becomes a supervisor that starts N whole servers (`spawn`), holds the
ports (SO_REUSEPORT: the kernel spreads connections), merges their Prometheus metrics, drains
them all on SIGTERM and restarts one that dies. It is not a load balancer: no request passes
through it. The details: docs/explanation/design-notes.md, "workers.py", and
docs/explanation/serving-path.md.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing import connection as mp_connection
from pathlib import Path

from ampflow.errors import AmpflowError, ServingError
from ampflow.serving.listening import announce, client_host

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
MAX_BOOT_FAILURES = 5  # a worker that dies before it is ready this often in a row stops serve
MAX_RESTART_DELAY_S = 30.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_MARGIN_S = 15.0  # past --grace-s: a worker's TensorFlow teardown before SIGKILL


# ---- the worker process --------------------------------------------------------------------

def _worker_main(config, index: int, conn, log_level: int) -> None:
    """One worker: a whole server on the shared ports, until SIGTERM (spawned: a new interpreter).

    Tells the supervisor ("ready", pid) once it listens, or ("error", class, message) and
    exits with the error's code when it cannot start.
    """
    _die_with_parent()
    # SIGTERM/SIGINT wait until the drain handler is in place: a worker listens (the kernel
    # may hand it connections) a moment before it is ready, and must drain, not die, then
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    logging.basicConfig(level=log_level, datefmt="%H:%M:%S",
                        format=f"%(asctime)s %(levelname)s %(name)s [worker {index}]: "
                               "%(message)s")
    from ampflow.fast_start import quiet_python_noise

    quiet_python_noise(log_level > logging.DEBUG)
    try:
        from ampflow.serving import server

        running = server.start_local_server(config, as_worker=True)
    except AmpflowError as e:
        conn.send(("error", type(e).__name__, str(e)))
        raise SystemExit(e.exit_code) from None
    except Exception as e:  # noqa: BLE001 - said to the supervisor, whatever it was
        log.exception("worker %d failed to start", index)
        conn.send(("error", "ServingError", f"worker {index} failed to start: "
                                            f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from None

    def ready() -> None:
        conn.send(("ready", os.getpid()))
        conn.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)

    server.run_until_signalled(running, ready)
    log.info("worker %d stopped cleanly", index)
    # drained: nothing is left to do, so skip the interpreter's teardown (TensorFlow's takes
    # seconds, measured 5-10 s on a busy 2-core host), which would only delay the pod's end
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _die_with_parent() -> None:
    """Linux: SIGTERM this worker when the supervisor dies, even by SIGKILL (a no-op elsewhere).

    So no orphaned worker keeps serving on the port.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# ---- one worker slot, as the supervisor sees it ---------------------------------------------

@dataclasses.dataclass
class _Slot:
    index: int
    process: multiprocessing.Process | None = None
    conn: object | None = None  # the pipe's read end, until the worker said ready or failed
    ready: bool = False
    was_ready: bool = False  # a worker of this slot served before (the next one restarts it)
    boot_failures: int = 0
    restart_at: float | None = None
    error: tuple[str, str] | None = None  # (class name, message) of its last failed start


class _Pool:
    """N worker slots: start, watch (restart what dies), drain."""

    def __init__(self, config, log_level: int) -> None:
        self.config = config
        self.log_level = log_level
        self.context = multiprocessing.get_context("spawn")
        self.slots = [_Slot(i) for i in range(config.workers)]

    def start(self, slot: _Slot) -> None:
        read_end, write_end = self.context.Pipe(duplex=False)
        slot.process = self.context.Process(
            target=_worker_main, args=(self.config, slot.index, write_end, self.log_level),
            name=f"ampflow-serve-worker-{slot.index}")
        slot.process.start()
        write_end.close()
        slot.conn, slot.ready, slot.restart_at, slot.error = read_end, False, None, None

    def start_all(self, stop: threading.Event) -> None:
        """Start every worker, return once all are ready; a worker's start error is raised."""
        for slot in self.slots:
            self.start(slot)
        while not stop.is_set() and not all(s.ready for s in self.slots):
            self._wait(0.5)
            for slot in self.slots:
                self._read(slot)
                if slot.error is not None or (not slot.ready and not slot.process.is_alive()):
                    raise _start_error(slot)

    def watch(self, stop: threading.Event) -> None:
        """Until `stop`: read ready messages, restart workers that died (said in the log)."""
        while not stop.is_set():
            self._wait(0.5)
            now = time.monotonic()
            for slot in self.slots:
                self._read(slot)
                if slot.restart_at is not None:
                    if now >= slot.restart_at and not stop.is_set():
                        self.start(slot)
                elif not slot.process.is_alive():
                    self._schedule_restart(slot, now)

    def _schedule_restart(self, slot: _Slot, now: float) -> None:
        process = slot.process
        process.join()
        if not slot.ready:
            slot.boot_failures += 1
            if slot.boot_failures >= MAX_BOOT_FAILURES:
                raise _start_error(slot, f" ({slot.boot_failures} starts in a row failed)")
        delay = 0.0 if slot.ready else min(MAX_RESTART_DELAY_S, 2.0 ** slot.boot_failures)
        log.warning("worker %d (pid %d) %s%s; restarting it%s", slot.index, process.pid,
                    _how_it_ended(process.exitcode),
                    f" ({slot.error[1]})" if slot.error else "",
                    f" in {delay:.0f}s" if delay else "")
        _mark_dead(process.pid)
        if slot.conn is not None:
            slot.conn.close()
        slot.conn, slot.ready, slot.restart_at = None, False, now + delay

    def _wait(self, timeout: float) -> None:
        handles = [s.conn for s in self.slots if s.conn is not None]
        handles += [s.process.sentinel for s in self.slots
                    if s.process is not None and s.restart_at is None]
        mp_connection.wait(handles, timeout)

    def _read(self, slot: _Slot) -> None:
        """Take the worker's message, if it sent one: ready (with its pid) or its start error."""
        if slot.conn is None or not slot.conn.poll():
            return
        try:
            message = slot.conn.recv()
        except (EOFError, OSError):  # it died before saying anything
            message = None
        slot.conn.close()
        slot.conn = None
        if message and message[0] == "ready":
            log.info("worker %d %s (pid %d)", slot.index,
                     "restarted and ready" if slot.was_ready else "ready", message[1])
            slot.ready, slot.was_ready, slot.boot_failures = True, True, 0
        elif message and message[0] == "error":
            slot.error = (message[1], message[2])

    def pids(self) -> list[int]:
        return [s.process.pid for s in self.slots if s.process is not None]

    def drain(self, grace_s: float) -> int:
        """SIGTERM every worker (each drains its in-flight calls), wait, SIGKILL what is left."""
        alive = [s.process for s in self.slots
                 if s.process is not None and s.restart_at is None and s.process.is_alive()]
        for process in alive:
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s + STOP_MARGIN_S
        clean = True
        for process in alive:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.error("worker pid %d did not stop within %.0fs; killing it", process.pid,
                          grace_s + STOP_MARGIN_S)
                process.kill()
                process.join(5)
                clean = False
            elif process.exitcode not in (0, -signal.SIGTERM):
                log.error("worker pid %d %s while draining", process.pid,
                          _how_it_ended(process.exitcode))
                clean = False
        for slot in self.slots:
            if slot.conn is not None:
                slot.conn.close()
        return 0 if clean else 1


def _signal(process, signum: int) -> None:
    try:
        os.kill(process.pid, signum)
    except ProcessLookupError:
        pass


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def _start_error(slot: _Slot, suffix: str = "") -> AmpflowError:
    """The error a worker could not start with, as its own class (its exit code with it)."""
    from ampflow import errors

    if slot.error is None:
        return ServingError(f"worker {slot.index} (pid {slot.process.pid}) "
                            f"{_how_it_ended(slot.process.exitcode)} before it was ready"
                            f"{suffix}; see its log above")
    name, message = slot.error
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, AmpflowError)):
        cls = ServingError
    try:
        return cls(message + suffix)
    except TypeError:  # a subclass with its own constructor
        return ServingError(message + suffix)


# ---- ports and metrics the supervisor holds --------------------------------------------------

def _reserve(host: str, port: int) -> socket.socket:
    """Bind `port` (0: a free one) with SO_REUSEPORT, and never listen.

    The workers bind beside it, the kernel gives this socket no connection (it never listens),
    and no other program can take the port while a worker restarts.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        from ampflow.errors import ConfigError

        raise ConfigError(f"the ports must be free on {host}. Received: port {port} "
                          f"({e.strerror})") from e
    return sock


def _metrics_dir() -> tuple[Path, bool]:
    """The multiprocess files' dir, and whether it is ours to delete at the end.

    The environment's PROMETHEUS_MULTIPROC_DIR (created if missing, its old *.db files removed:
    the client library requires an empty dir per run), else a new temp dir.
    """
    named = os.environ.get(MULTIPROC_ENV)
    if named:
        path = Path(named)
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("*.db"):
            old.unlink()
        return path, False
    return Path(tempfile.mkdtemp(prefix="ampflow-metrics-")), True


def _restore_env(name: str, value: str | None) -> None:
    """Put an environment variable back as it was.

    An in-process caller of `supervise` (a test, a notebook) must not be left with the
    workers' multiprocess metrics dir.
    """
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _mark_dead(pid: int) -> None:
    """The client library's clean-up for a dead process (its live gauges; counters stay)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def _serve_metrics(config, directory: Path):
    """A separate --metrics-port: the supervisor serves every worker's metrics, merged."""
    import prometheus_client as prom
    from prometheus_client import multiprocess

    registry = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    try:
        http, _thread = prom.start_http_server(config.metrics_port, addr=config.host,
                                               registry=registry)
    except OSError as e:
        raise ServingError(f"cannot bind the metrics port. Received: metrics_port="
                           f"{config.metrics_port} ({e.strerror})") from e
    return http


# ---- the supervisor --------------------------------------------------------------------------

def supervise(config) -> int:
    """`ampflow serve --workers N`: start the workers, restart what dies, drain on SIGTERM."""
    held = [_reserve(config.host, config.port)]
    config = dataclasses.replace(config, port=held[0].getsockname()[1])
    if config.rest_api_port:
        held.append(_reserve(config.host, config.rest_api_port))
    metrics_dir, owned, metrics_http = None, False, None
    stop = threading.Event()

    def _on_signal(signum, _frame):
        log.info("received %s: draining every worker (grace %.1fs)",
                 signal.Signals(signum).name, config.grace_s)
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    pool = None
    environ_before = os.environ.get(MULTIPROC_ENV)
    try:
        if config.metrics_port:
            metrics_dir, owned = _metrics_dir()
            # The client library picks its value class once, at import, from the variable:
            # imported under it, this process's own metrics (an in-process caller's servers)
            # would be files in a dir gone after this returns; the supervisor records none.
            import prometheus_client  # noqa: F401
            os.environ[MULTIPROC_ENV] = str(metrics_dir)  # the spawned workers inherit it
            if config.metrics_port != config.rest_api_port:
                metrics_http = _serve_metrics(config, metrics_dir)
        pool = _Pool(config, logging.getLogger().getEffectiveLevel())
        pool.start_all(stop)
        if not stop.is_set():
            address = f"{client_host(config.host)}:{config.port}"
            rest = f"{client_host(config.host)}:{config.rest_api_port}" \
                if config.rest_api_port else None
            announce(config, address, rest)
            log.info("%d workers serving (pids %s)%s", config.workers, pool.pids(),
                     f", metrics of all of them on :{config.metrics_port}/metrics"
                     if config.metrics_port else "")
            pool.watch(stop)
        code = pool.drain(config.grace_s)
        pool = None
        log.info("server stopped %s", "cleanly" if code == 0 else "with errors")
        return code
    finally:
        if pool is not None:  # a start error: stop the workers that did start
            pool.drain(0.0)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for sock in held:
            sock.close()
        if metrics_http is not None:
            metrics_http.shutdown()
            metrics_http.server_close()
        if owned:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        _restore_env(MULTIPROC_ENV, environ_before)
