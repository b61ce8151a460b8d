"""Google-style `Args:` for a KFP component or pipeline, written from help that has a home.

KFP compiles a function's docstring `Args:` into the IR's input descriptions, the help the
KFP UI shows beside each parameter. A config field's `help` is already the one home of a
flag's help, so a component's Args are generated from its config's fields (and a pipeline's
from the components it feeds), never copied by hand.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from ampflow.cliutil import sentence

_ENTRY = re.compile(r"^    (\w+): (.*)$")


def described(source: Any) -> dict[str, str]:
    """`{name: help}` of a config dataclass's fields, or of a documented function's Args."""
    if dataclasses.is_dataclass(source):
        return {f.name: _field_help(f) for f in dataclasses.fields(source)
                if f.metadata.get("help")}
    return docstring_args(source.__doc__ or "")


def _field_help(field: dataclasses.Field) -> str:
    """A field's help as `--help` shows it, with its choices when the text does not list them."""
    text = sentence(field.metadata["help"].replace("%%", "%"))  # argparse's escape
    choices = [str(c) for c in field.metadata.get("choices", ())]
    if choices and not all(c in text for c in choices):
        text += f" One of: {', '.join(choices)}."
    return text


def docstring_args(doc: str) -> dict[str, str]:
    """The entries of a docstring's `Args:` section as `{name: text}` (one line each)."""
    lines = inspect.cleandoc(doc).splitlines()
    if "Args:" not in lines:
        return {}
    found = {}
    for line in lines[lines.index("Args:") + 1:]:
        entry = _ENTRY.match(line)
        if not entry:
            break
        found[entry.group(1)] = entry.group(2)
    return found


def _is_output(annotation: Any) -> bool:
    """Whether a parameter is a KFP `Output[...]`: KFP describes outputs from `Returns:`."""
    return any(getattr(mark, "__name__", "") == "OutputAnnotation"
               for mark in getattr(annotation, "__metadata__", ()))


def document_args(func: Callable, *sources: Any, renamed: Mapping[str, str] | None = None,
                  notes: Mapping[str, str] | None = None,
                  own: Mapping[str, str] | None = None) -> Callable:
    """Append an `Args:` section to `func`'s docstring, one line per input; return `func`.

    A parameter's text is `own[name]` (one that no source describes), else the first of
    `sources` (config dataclasses or documented functions) that describes
    `renamed.get(name, name)`, then `notes[name]` (what differs here, e.g. "0 means unset"
    where KFP has no None). A parameter none of them describes gets no entry: the tests that
    compile the pipeline name it. A key that is not a parameter is a mistake, refused here.
    """
    renamed, notes, own = dict(renamed or {}), dict(notes or {}), dict(own or {})
    doc = inspect.cleandoc(func.__doc__ or "")
    if not doc:  # docstring_parser takes a leading "Args:" for the summary
        raise ValueError(f"document_args({func.__name__}) needs a docstring with a summary "
                         "line: KFP reads no Args section without one. Received: no docstring")
    names = [name for name, parameter in inspect.signature(func).parameters.items()
             if not _is_output(parameter.annotation)]
    strays = sorted((set(renamed) | set(notes) | set(own)) - set(names))
    if strays:
        raise ValueError(f"document_args({func.__name__}) got texts for names that are not "
                         f"its parameters. Received: {', '.join(strays)}")
    helps = [described(source) for source in sources]
    entries = [f"    {name}: {text}" for name in names
               if (text := _text(name, helps, renamed, notes, own))]
    if entries:
        func.__doc__ = "\n".join([doc, "", "Args:", *entries])
    return func


def _text(name: str, helps: list[dict[str, str]], renamed: Mapping[str, str],
          notes: Mapping[str, str], own: Mapping[str, str]) -> str:
    """One parameter's text: its own, or its source's help; then its note ("" for none)."""
    key = renamed.get(name, name)
    text = own.get(name) or next((h[key] for h in helps if key in h), "")
    note = notes.get(name, "")
    return " ".join(part for part in (text, note and note.rstrip(".") + ".") if part)
