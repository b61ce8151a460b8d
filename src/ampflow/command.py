"""Running one `ampflow` command: process set-up, the one-line error, the exit codes.

The root package's half of the command line, shared by every entry point: `ampflow.cli` (the
top floor, the one module that imports every step's CLI) and `python -m ampflow.serving.cli`
hand their command modules to `main` here; this module imports none of them, so nothing in the
root package points up. Each command module exposes `register(subparsers)`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterable
from types import ModuleType

from ampflow import __version__, progress, task_exit
from ampflow.cliutil import ArgumentParser
from ampflow.errors import AmpflowError
from ampflow.fast_start import python_noise_quieted, quiet_python_noise
from ampflow.requirements import check_installed_versions
from ampflow.tf_startup import filter_stderr_for_life

log = logging.getLogger("ampflow.cli")
CLOSED_PIPE_EXIT_CODE = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`
# What a command sets in its process, for itself and the processes it starts (the TF log
# level, --quiet, --progress-every-s): an in-process caller gets its own values back.
COMMAND_ENV = ("TF_CPP_MIN_LOG_LEVEL", progress.QUIET_ENV, progress.EVERY_S_ENV)


def build_parser(modules: Iterable[ModuleType]) -> argparse.ArgumentParser:
    """The top-level `ampflow` parser with the subcommands that `modules` register, in order."""
    parser = ArgumentParser(
        prog="ampflow",
        description="Mixed-precision TensorFlow training to a served endpoint, as a KFP pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"ampflow {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        metavar="DEBUG|INFO|WARNING|ERROR", help="Which log lines to show."
    )
    parser.add_argument("--quiet", action="store_true",
                        help="No progress display (bars on a terminal, periodic lines elsewhere).")
    parser.add_argument("--progress-every-s", type=float, default=None, metavar="S",
                        help="Seconds between progress lines when stderr is not a terminal "
                             f"(default: {progress.DEFAULT_EVERY_S:g} s).")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module in modules:
        module.register(subparsers)
    return parser


def write_whole_lines(*streams) -> None:
    """Make each `print` to `streams` one write of one whole line, as without PYTHONUNBUFFERED.

    Unbuffered (`PYTHONUNBUFFERED=1`, which containers and our worker launcher set), `print`
    writes its text and its newline in two calls, and another writer of the same pipe (the
    stderr filter process, a sibling worker) can land between them: a reader, or a test, then
    sees two lines glued together. Line buffering keeps a line whole and still flushes it at
    once.
    """
    for stream in streams:
        reconfigure = getattr(stream, "reconfigure", None)  # absent on a replaced stream
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


def main(argv: list[str] | None, modules: Iterable[ModuleType]) -> int:
    """Run the command in `argv` among the commands that `modules` register.

    Without `argv` (the console script, `python -m ampflow.cli`) the process is the command's:
    its stderr then goes through `ampflow.tf_startup`'s filter unless `--verbose` or
    `--log-level DEBUG` asks for everything. With `argv` (tests, a caller's own process) the
    process's file descriptors are left alone, and its settings put back after the command
    (`callers_settings_kept`).

    Exit codes (ampflow/errors.py has the rule): 0, 2 (usage or configuration), 1 (the run
    failed), 130 (Ctrl-C), 141 (stdout's reader went away: `ampflow ... | head -1`).
    """
    try:
        with contextlib.nullcontext() if argv is None else callers_settings_kept():
            code = _main(argv, modules)
    except BrokenPipeError:
        return closed_pipe()
    if argv is None and code == 0:  # a worker of a multi-worker run: no teardown (task_exit)
        task_exit.end_cluster_worker_at_exit()
    return code


@contextlib.contextmanager
def callers_settings_kept():
    """Put back what a command sets in its process: `COMMAND_ENV`, absl's noise filter.

    For a caller's own process: a test or a notebook that runs `main(argv)` is not left
    quiet, or logging every 5 s, for the rest of its life.
    """
    env = {name: os.environ.get(name) for name in COMMAND_ENV}
    quieted = python_noise_quieted()
    try:
        yield
    finally:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        quiet_python_noise(quieted)


def closed_pipe() -> int:
    """Stdout's reader is gone (`| head -1`): end quietly, as a shell's SIGPIPE would, with 141.

    Stdout is pointed at /dev/null so that Python's own flush at exit does not fail again and
    print a traceback after the command has ended.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a replaced stdout without a file descriptor
        pass
    return CLOSED_PIPE_EXIT_CODE


def _main(argv: list[str] | None, modules: Iterable[ModuleType]) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if argv is None:  # the process's own command line: this process is ours to set up
        argv = sys.argv[1:]
        write_whole_lines(sys.stdout, sys.stderr)
        progress.keep_terminal()  # the bar redraws in place; the filter forwards whole lines
        if not _shows_everything(argv):
            filter_stderr_for_life()  # TensorFlow's C++ lines a CPU-only machine reads as errors
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    quiet_python_noise(args.log_level != "DEBUG")  # absl's timing line; DEBUG shows all
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        progress.configure(quiet=args.quiet or None, every_s=args.progress_every_s)
        check_installed_versions()
        return int(args.func(args) or 0)
    except AmpflowError as e:
        print(f"ampflow {args.command}: error: {_in_flags(e, parser, args.command)}",
              file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:
        raise  # main's: not a file error of the command's
    except OSError as e:  # the file system said no where no step turned it into its own error
        log.debug("ampflow %s: %s", args.command, e, exc_info=True)
        print(f"ampflow {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ampflow {args.command}: interrupted", file=sys.stderr)
        return 130


def _in_flags(error: AmpflowError, parser, command: str) -> str:
    """The error's line with the settings it names said as the command's flags.

    Once, here, for every command and every error: a step's config field (`eval_dir`), a
    check deep in a step (`image_folder must hold ...`) and a command's own option all read
    as the flag the user typed (`--eval-dir`), from the command's parser (`name_flags` renames
    a one-word setting only where it is used as a name: `port=`, `epochs must`).
    """
    from ampflow.cliutil import flags_of_parser, name_flags

    command_parser = parser.command_parser(command)
    if command_parser is None:
        return str(error)
    return name_flags(str(error), flags_of_parser(command_parser))


def _shows_everything(argv: list[str]) -> bool:
    """`--verbose` or `--log-level DEBUG`: TensorFlow's C++ lines are shown unfiltered.

    Read from argv before parsing, since building the parser may import TensorFlow.
    """
    following = [*argv[1:], ""] if argv else []
    debug = any(a == "--log-level=DEBUG" or (a == "--log-level" and b == "DEBUG")
                for a, b in zip(argv, following, strict=True))
    return "--verbose" in argv or debug

