"""Turn a step's frozen dataclass config into CLI flags, so `--help` always lists every option.

Field metadata used: `help` (text), `choices`, `flag` (override the flag name). A `bool | None`
field becomes `--x/--no-x` with "auto" meaning None; a `tuple[...]` field takes several values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

_AUTO = "auto"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show each flag's default once, and only where it says something.

    A help text that already names its default ("(default: the model's own)") keeps its own
    words, and a None or empty default is left out rather than printed as "None" or "[]".
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if "(default" in help_text or action.default in (None, [], ()):
            return action.help
        return super()._get_help_string(action)


class HelpFormatterKeepingEpilog(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`HelpFormatter` that prints the description and epilog as written (a table stays one)."""


def add_config_arguments(
    parser: argparse.ArgumentParser, config_cls: type, *, exclude: tuple[str, ...] = ()
) -> None:
    """Add one flag per field of `config_cls` (a dataclass) to `parser`."""
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        if field.name in exclude or not field.init:
            continue
        _add_field(parser, field, hints[field.name])


def config_from_args(config_cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build `config_cls` from parsed flags; its `__post_init__` validates the values."""
    hints = typing.get_type_hints(config_cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        if not field.init or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if isinstance(value, list):
            value = tuple(value)
        if value is not None and _base_type(hints[field.name]) is Path:
            value = Path(value)
        kwargs[field.name] = value
    kwargs.update(overrides)
    return config_cls(**kwargs)


def print_summary(title: str, rows: dict[str, Any], stream=None) -> None:
    """Print a short aligned key/value summary, the last thing every step command shows."""
    stream = stream or sys.stdout  # looked up per call: pytest swaps sys.stdout per test
    width = max((len(k) for k in rows), default=0)
    print(f"\n{title}", file=stream)
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, (dict, list)):
            value = json.dumps(value)
        print(f"  {key.ljust(width)}  {value}", file=stream)


def add_step_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    *,
    config_cls: type,
    run: Callable[[Any], Any],
    summarize: Callable[[Any], dict[str, Any]],
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """Register `ampflow <name>`: flags from `config_cls`, then `run(config)`, then a summary."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description or help,
        formatter_class=HelpFormatter,
    )
    add_config_arguments(parser, config_cls)

    def _handler(args: argparse.Namespace) -> int:
        config = config_from_args(config_cls, args)
        result = run(config)
        print_summary(f"ampflow {name}: done", summarize(result))
        return 0

    parser.set_defaults(func=_handler)
    return parser


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, hint: Any) -> None:
    meta = field.metadata
    flag = meta.get("flag") or "--" + field.name.replace("_", "-")
    has_default = field.default is not dataclasses.MISSING or (
        field.default_factory is not dataclasses.MISSING  # type: ignore[misc]
    )
    default = (
        field.default
        if field.default is not dataclasses.MISSING
        else (field.default_factory() if has_default else None)  # type: ignore[misc]
    )
    help_text = meta.get("help", "")
    base = _base_type(hint)
    kwargs: dict[str, Any] = {"dest": field.name, "help": help_text}
    if base is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        kwargs["default"] = default
        if default is None:
            kwargs["help"] = f"{help_text} (default: {_AUTO})"
    elif typing.get_origin(base) is tuple:
        (item, *_rest) = typing.get_args(base) or (str,)
        kwargs["nargs"] = "+"
        kwargs["type"] = item if item in (int, float, str) else str
        kwargs["default"] = list(default) if default is not None else None
    else:
        kwargs["type"] = base if base in (int, float, str) else str
        kwargs["default"] = default
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    if not has_default:
        kwargs["required"] = True
        kwargs["default"] = argparse.SUPPRESS  # no misleading "(default: None)" in --help
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    parser.add_argument(flag, **kwargs)


def _base_type(hint: Any) -> Any:
    """Strip `X | None` to `X`."""
    args = typing.get_args(hint)
    if args and type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return hint
