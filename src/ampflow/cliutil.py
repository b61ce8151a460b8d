"""Turn a step's frozen dataclass config into CLI flags, so `--help` always lists every option.

Also the one style every `ampflow` command shares (its parser class, help formatter and
subcommand action come from here): a command's summary is a capitalised sentence with a
period and is its own `--help` description when it has none; defaults are shown in the user's
units (`64 MiB`, `a b`, never `(default: )`); a bad flag is one error line, without the usage
dump, with the closest valid value for a choice list; a config error names the flag
(`--eval-dir`), not the field; usage and config errors exit 2, runtime errors 1.

Field metadata used: `help` (text), `choices`, `flag` (override the flag name), `tristate`
(a `bool | None` field taken as `auto|on|off`), `deprecated` (old spellings still accepted,
each with a one-line note: `((flag, {old value: new value} or None, new value), ...)`).
A `bool | None` field without `tristate` becomes `--x/--no-x` with "auto" meaning None; a
`tuple[...]` field takes several values.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ampflow.errors import ConfigError

_AUTO = "auto"
TRISTATE = {"auto": None, "on": True, "off": False}
_MIB = 1024 * 1024


def closest(value: str, choices: Iterable[str]) -> str | None:
    """The valid value nearest to a mistyped `value` (difflib), or None when none is close."""
    names = [str(c) for c in choices]
    by_lower = {n.lower(): n for n in names}
    found = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1, cutoff=0.3)
    return by_lower[found[0]] if found else None


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """`"; did you mean X?"` for the closest valid value, or "" (the end of an error line)."""
    near = closest(value, choices)
    return f"; did you mean {near}?" if near is not None else ""


def invalid_choice(what: str, value: Any, choices: Iterable[Any]) -> str:
    """One line: `what` must be one of `choices` (words, not a Python tuple); the closest."""
    names = [str(c) for c in choices]
    return (f"{what} must be one of {', '.join(names)}. Received: {what}={value!r}"
            f"{did_you_mean(str(value), names)}")


def human_bytes(n: int) -> str:
    """`67108864` -> `64 MiB`: a byte count in the unit a reader thinks in."""
    for unit, size in (("GiB", 1024 * _MIB), ("MiB", _MIB), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} bytes"


def format_default(dest: str, value: Any) -> str | None:
    """A default as the user types or reads it; None when there is nothing to show."""
    if value is None or value is argparse.SUPPRESS or value in ("", [], ()):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int) and dest.endswith("_bytes"):
        return human_bytes(value)
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def sentence(text: str | None) -> str | None:
    """Capitalised, ending with a period: the one style of every summary and flag help."""
    if not text or text is argparse.SUPPRESS:
        return text
    text = text.strip()
    first_word = text.split(" ", 1)[0]
    if not any(c.isupper() for c in first_word[1:]):  # gRPC, kubeconfig's own spelling kept
        text = text[0].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


class HelpFormatter(argparse.HelpFormatter):
    """Each flag's help as a sentence, and its default once, in the user's units.

    A help text that already names its default ("(default: the model's own)") keeps its own
    words; a None or empty default is left out rather than printed as "None" or "[]".
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        raw = (action.help or "").replace(" (default: %(default)s)", "")
        own_default = re.search(r"\s*\(default[^()]*(\([^()]*\)[^()]*)*\)$", raw)
        if own_default:  # "... (default: auto)": the sentence's period goes before it
            return f"{sentence(raw[:own_default.start()])} {own_default.group().strip()}"
        help_text = sentence(raw)
        if not help_text or help_text is argparse.SUPPRESS or "(default" in help_text \
                or "default:" in help_text.lower() or not action.option_strings:
            return help_text
        shown = format_default(action.dest, action.default)
        if shown is None:
            return help_text
        return f"{help_text} (default: {shown.replace('%', '%%')})"


    def _metavar_formatter(self, action: argparse.Action, default_metavar: str):
        if action.metavar is None and action.choices is not None \
                and not isinstance(action, argparse._SubParsersAction):
            action.metavar = "|".join(map(str, action.choices))  # a|b, not {'a','b'}
        return super()._metavar_formatter(action, default_metavar)


class HelpFormatterKeepingEpilog(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`HelpFormatter` that prints the description and epilog as written (a table stays one)."""


class ArgumentParser(argparse.ArgumentParser):
    """ampflow's parser: one error line (no usage dump), exit 2, the closest valid choice.

    An unknown flag is answered by the command it was given to, with the closest flag
    (`ampflow train: error: unrecognized argument --precison; did you mean --precision?`),
    before a missing required flag is (a misspelled required flag is both).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # `--lr 0.1` was taken as --lr-schedule 0.1
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", SubcommandsAction)

    def error(self, message: str) -> typing.NoReturn:
        """Print `prog: error: message` and where help is, then exit 2 (a usage error)."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):  # noqa: D102
        args = list(sys.argv[1:] if args is None else args)
        self.refuse_unknown_flags(args)
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.command_parser(getattr(namespace, "command", None)) or self
            command.error(f"unrecognized argument{'s' if len(extras) > 1 else ''} "
                          f"{' '.join(extras)}")
        return namespace

    def command_parser(self, name: str | None) -> argparse.ArgumentParser | None:
        """The parser of subcommand `name`, or None."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action.choices.get(name)
        return None

    def refuse_unknown_flags(self, args: list[str]) -> None:
        """A usage error for the first `--flag` in `args` that its command does not take."""
        parser: argparse.ArgumentParser = self
        for token in args:
            if token == "--":
                return
            if parser is self and not token.startswith("-") and self.command_parser(token):
                parser = self.command_parser(token)
                continue
            if not token.startswith("--") or token == "--":
                continue
            flag = token.split("=", 1)[0]
            if _takes_flag(parser, flag):
                continue
            if parser is not self and _takes_flag(self, flag):
                parser.error(f"{flag} is an option of `{self.prog}` itself: put it before the "
                             f"command (`{self.prog} {flag} {parser.prog.split()[-1]} ...`)")
            parser.error(f"unrecognized argument {flag}{_closest_flag(parser, flag)}")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            flag = "/".join(action.option_strings) or action.dest
            raise argparse.ArgumentError(None, invalid_choice(flag, value, action.choices))


def _closest_flag(parser: argparse.ArgumentParser, flag: str) -> str:
    """`"; did you mean --x?"` for the visible flag nearest to `flag`, or "" when none is near.

    Compared without the leading dashes, which every flag shares, and stricter than a mistyped
    choice: a flag unlike any other gets no guess.
    """
    names = {f[2:]: f for f in flags_of_parser(parser).values() if f.startswith("--")}
    near = difflib.get_close_matches(flag.lstrip("-").lower(), list(names), n=1, cutoff=0.6)
    return f"; did you mean {names[near[0]]}?" if near else ""


def _takes_flag(parser: argparse.ArgumentParser, flag: str) -> bool:
    """Whether `parser` takes `flag`, or an abbreviation argparse would expand (or refuse)."""
    if flag in parser._option_string_actions:
        return True
    return parser.allow_abbrev and any(o.startswith(flag) for o in parser._option_string_actions)


class SubcommandsAction(argparse._SubParsersAction):
    """Each subcommand: a sentence summary, also its description if it has none; our formatter."""

    def add_parser(self, name: str, **kwargs):  # noqa: D102
        if "help" in kwargs:
            kwargs["help"] = sentence(kwargs["help"])
        kwargs["description"] = sentence(kwargs.get("description") or kwargs.get("help"))
        kwargs.setdefault("formatter_class", HelpFormatter)
        return super().add_parser(name, **kwargs)


class _TriState(argparse.Action):
    """`--xla auto|on|off` into a `bool | None` field (auto: None)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, TRISTATE[values])


class _Deprecated(argparse.Action):
    """An old spelling of a flag: still works, says once on stderr what to write instead."""

    def __init__(self, option_strings, dest, *, new_flag: str, mapping: dict | None,
                 new_value: str | None, convert: Callable[[str], Any], **kwargs) -> None:
        kwargs["nargs"] = None if mapping else 0
        if mapping:
            kwargs["choices"] = tuple(mapping)
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new_flag, self.mapping, self.new_value, self.convert = (
            new_flag, mapping, new_value, convert)

    def __call__(self, parser, namespace, values, option_string=None):
        new = self.mapping[values] if self.mapping else self.new_value
        old = f"{option_string} {values}" if self.mapping else option_string
        print(f"{parser.prog}: note: {old} is deprecated; use {self.new_flag} {new}",
              file=sys.stderr)
        setattr(namespace, self.dest, self.convert(new))


def flag_of(config_cls: type, name: str) -> str:
    """The CLI flag of `config_cls`'s field `name` (`eval_dir` -> `--eval-dir`)."""
    field = config_cls.__dataclass_fields__[name]
    return field.metadata.get("flag") or "--" + name.replace("_", "-")


def name_flags(message: str, fields: type | dict[str, str] | None) -> str:
    """Say `--eval-dir` where a config error says `eval_dir`: the user typed flags, not fields.

    `fields` is a config dataclass, or a `{field: flag}` map (`flags_of_parser`). A field name
    with an underscore is an identifier wherever it appears; a one-word name (`model`,
    `epochs`) only where the message uses it as a name (`epochs must`, `epochs=`).
    """
    if dataclasses.is_dataclass(fields):
        fields = {f.name: flag_of(fields, f.name) for f in dataclasses.fields(fields) if f.init}
    if not isinstance(fields, dict):
        return message
    for name in sorted(fields, key=lambda n: -len(n)):
        if "_" in name:
            pattern = rf"(?<![\w./-]){re.escape(name)}(?![\w/])"
        else:
            pattern = rf"(?<![\w./-]){re.escape(name)}(?=( must| should|=))"
        message = re.sub(pattern, fields[name], message)
    return message


def flags_of_parser(parser: argparse.ArgumentParser) -> dict[str, str]:
    """`{dest: its flag}` of every option of `parser` (`eval_dir` -> `--eval-dir`).

    The flag a user reads in `--help`: the first long spelling of the first, visible action of
    each dest (an old spelling kept for compatibility is hidden, and never named).
    """
    found: dict[str, str] = {}
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or not action.option_strings:
            continue
        long = [o for o in action.option_strings if o.startswith("--")]
        found.setdefault(action.dest, (long or action.option_strings)[0])
    return found


def config_error_with_flags(error: ConfigError, config_cls: type | None) -> ConfigError:
    """`error` with its field names said as flags (same class, same exit code)."""
    text = name_flags(str(error), config_cls)
    if text == str(error):
        return error
    try:
        renamed = type(error)(text)
    except TypeError:  # a subclass with its own constructor
        renamed = ConfigError(text)
    renamed.__cause__ = error
    return renamed


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
    """Build `config_cls` from parsed flags; its `__post_init__` validates the values.

    A `ConfigError` it raises names the flags, not the fields.
    """
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
    try:
        return config_cls(**kwargs)
    except ConfigError as e:
        raise config_error_with_flags(e, config_cls) from e


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
        try:
            result = run(config)
        except ConfigError as e:  # a check the step makes itself: still about a flag
            raise config_error_with_flags(e, config_cls) from e
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
    convert: Callable[[str], Any] = lambda value: value  # noqa: E731
    if meta.get("tristate"):
        kwargs.update(action=_TriState, choices=tuple(TRISTATE), metavar="auto|on|off",
                      default=default, help=f"{help_text} (default: "
                      f"{next(k for k, v in TRISTATE.items() if v is default)})")
        convert = TRISTATE.__getitem__
    elif base is bool:
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
        if base in (int, float):
            kwargs["metavar"] = "N" if base is int else "X"
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
        kwargs.setdefault("metavar", "|".join(map(str, meta["choices"])))
    if not has_default:
        kwargs["required"] = True
        kwargs["default"] = argparse.SUPPRESS  # no misleading "(default: None)" in --help
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    parser.add_argument(flag, **kwargs)
    for old_flag, mapping, new_value in meta.get("deprecated", ()):
        parser.add_argument(old_flag, action=_Deprecated, dest=field.name, new_flag=flag,
                            mapping=mapping, new_value=new_value, convert=convert,
                            default=argparse.SUPPRESS)


def _base_type(hint: Any) -> Any:
    """Strip `X | None` to `X`."""
    args = typing.get_args(hint)
    if args and type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return hint
