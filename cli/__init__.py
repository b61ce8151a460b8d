"""`ampflow`: the command line's top floor, the one module that knows every command.

It imports each step's CLI module directly, in pipeline order, and nothing imports it back:
the steps, serving and the pipeline know only `ampflow.cliutil` and `ampflow.command` (the root
package's CLI helpers), so the imports go one way and tests/test_architecture.py sees them all.
`ampflow.command` does the rest (the parser, the one-line error, the exit codes). The console
script is `console` (`main`, then the process ends without TensorFlow's teardown: task_exit.py);
`python -m ampflow.cli` runs it too (`__main__.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from types import ModuleType
from typing import NoReturn

from ampflow import command
from ampflow.command import CLOSED_PIPE_EXIT_CODE, write_whole_lines
from ampflow.components.convert_tflite import cli as convert_tflite_cli
from ampflow.components.deploy_serving import cli as deploy_serving_cli
from ampflow.components.evaluate_parity import cli as evaluate_parity_cli
from ampflow.components.export_savedmodel import cli as export_savedmodel_cli
from ampflow.components.prepare_data import cli as prepare_data_cli
from ampflow.components.pretrain import cli as pretrain_cli
from ampflow.components.train import cli as train_cli
from ampflow.pipeline import cli as pipeline_cli
from ampflow.serving import cli as serving_cli

__all__ = ["CLOSED_PIPE_EXIT_CODE", "COMMANDS", "build_parser", "main", "write_whole_lines"]

# The command modules in pipeline order: `ampflow --help` lists their commands in this order.
COMMANDS: tuple[ModuleType, ...] = (
    prepare_data_cli,
    pretrain_cli,
    train_cli,
    evaluate_parity_cli,
    export_savedmodel_cli,
    convert_tflite_cli,
    serving_cli,
    deploy_serving_cli,
    pipeline_cli,
)


def build_parser(modules: Iterable[ModuleType | str] = COMMANDS) -> argparse.ArgumentParser:
    """The `ampflow` parser with every command, or with those of `modules` (a test's subset)."""
    return command.build_parser(_command_modules(modules))


def main(argv: list[str] | None = None, modules: Iterable[ModuleType | str] = COMMANDS) -> int:
    """The `ampflow` console script, or a caller's own `argv` (ampflow.command: exit codes)."""
    return command.main(argv, _command_modules(modules))


def console() -> NoReturn:
    """The `ampflow` console script: `main`, then the end of a process that ran a command.

    Its process ends without TensorFlow's teardown once the command returned (task_exit.py):
    an in-process caller of `main` keeps its interpreter.
    """
    from ampflow.task_exit import exit_command

    exit_command(main())


def _command_modules(modules: Iterable[ModuleType | str]) -> list[ModuleType]:
    """`modules` as modules; a caller's subset may name one (`"ampflow.serving.cli"`).

    A name must be one of `COMMANDS`, so nothing reaches this floor that its imports do not show.
    """
    known = {module.__name__: module for module in COMMANDS}
    out = []
    for module in modules:
        if isinstance(module, str):
            if module not in known:
                raise ValueError(f"{module} is not an ampflow command module: {sorted(known)}")
            module = known[module]
        out.append(module)
    return out
