"""Run `ampflow` commands in this process as a user types them, and serve while a client asks.

The walks over the documented commands (tests/test_cli_step_by_step.py, the README's
tests/test_readme_step_by_step.py, the pipeline walks under tests/pipeline/ and the pretrained
checkpoint's) share these: `run_cli` is `ampflow ARGV` with what the terminal would show;
`serve_while` runs `ampflow serve` as typed (until SIGTERM) with a client beside it, so a walk
pays no second TensorFlow start-up for its server.
"""

from __future__ import annotations

import contextlib
import io
import signal
import threading
import traceback
from dataclasses import dataclass

from ports import free_port


@dataclass(frozen=True)
class Step:
    """One command as a user ran it: its exit code and everything it printed."""

    argv: tuple[str, ...]
    code: int
    out: str

    def assert_ok(self) -> None:
        assert self.code == 0 and "Traceback" not in self.out, (self.argv, self.out[-3000:])


def run_cli(*argv) -> Step:
    """`ampflow ARGV` in this process; an exception is what the console script shows: a
    traceback and exit 1 (so the walk goes on, and the step's test says what went wrong)."""
    from ampflow.cli import main

    argv = tuple(str(a) for a in argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(list(argv))
        except Exception:  # noqa: BLE001 (what a user would see, kept for the step's test)
            traceback.print_exc()
            code = 1
    return Step(argv, code, out.getvalue())


def loopback_port() -> int:
    """A loopback port for a server, below the ephemeral range (tests/ports.py says why)."""
    return free_port()


def serve_and_predict(serve_argv: list, predict_argv: list) -> tuple[Step, Step]:
    """`ampflow serve` in this thread as typed (it serves until SIGTERM, like `& SERVER=$!`
    then `kill $SERVER`), and `ampflow predict` from another thread once the server answers.
    Both print into serve's capture (stdout is one per process)."""
    from ampflow.cli import main

    serve, asked = serve_while(serve_argv, lambda: main([str(a) for a in predict_argv]))
    return serve, Step(tuple(map(str, predict_argv)), asked if asked is not None else 1,
                       serve.out)


def serve_while(serve_argv: list, client):
    """(serve's Step, what `client()` returned: None if it raised, its traceback printed):
    `ampflow serve` in this thread as typed, `client` in another thread meanwhile (it waits
    for the server itself). The pipeline walks query their `run-local`'s deployment this way:
    a server process would only pay another TensorFlow start-up.

    After the client the client thread sends SIGTERM to this thread until serve has returned,
    so a signal sent before serve's handler was in place is sent again; until then and after,
    a SIGTERM is ignored here rather than ending the test process.
    """
    serving_thread, served = threading.get_ident(), threading.Event()
    answer: dict[str, object] = {}

    def run_client() -> None:
        try:
            answer["value"] = client()
        except Exception:  # noqa: BLE001 (printed for the test; None says it failed)
            traceback.print_exc()
        finally:
            while not served.wait(0.5):
                signal.pthread_kill(serving_thread, signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    thread = threading.Thread(target=run_client, name="ampflow-client", daemon=True)
    try:
        thread.start()
        serve = run_cli(*serve_argv)
    finally:
        served.set()
        thread.join(60)
        signal.signal(signal.SIGTERM, previous)
    return serve, answer.get("value")
