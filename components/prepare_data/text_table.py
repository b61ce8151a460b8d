"""`--text-file`: a table of texts and labels, `.csv`, `.tsv` or `.jsonl`, as a TFDS dataset.

- `.csv`: RFC 4180 (Python's `csv`, excel dialect: quoted fields may hold commas and newlines),
  the first row names the columns.
- `.tsv`: tab-separated, the first row names the columns, no quoting (GLUE's and most tools'
  TSV: a `"` is an ordinary character).
- `.jsonl`: one JSON object per line; blank lines are ignored.

`--text-column` holds the text, `--label-column` the class (any string or integer; the class
names are the distinct labels, sorted, numerically when every label is an integer, so labels
0..N-1 keep their ids). The whole table is the training split; the test split is held out
(seeded, stratified: holdout.py). A row is left out, counted and listed with its line number
(the line the row starts on) when its text is not UTF-8, empty (whitespace only) or larger
than `max_text_bytes`, its label is empty or missing, or it is not a row of the table (a CSV
row without the column, a JSONL line that is not a JSON object). A column no row has is a
configuration error, and so is a label column with one class.

The file is decoded with `surrogateescape`, so one bad byte costs its row, not the file.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from ampflow.components.prepare_data.text_source import (
    SkipLog,
    TextExample,
    TextScan,
    TextSourceKey,
    fingerprint,
    make_builder,
    prepared_builder,
    require_two_classes,
)
from ampflow.data.modality import (
    SKIP_EMPTY,
    SKIP_MALFORMED,
    SKIP_NO_LABEL,
    SKIP_NOT_UTF8,
    SKIP_TOO_LARGE,
    TABLE_FORMATS,
)
from ampflow.errors import ConfigError, DatasetConfigError

log = logging.getLogger(__name__)

_INTEGER = re.compile(r"[+-]?\d+")
# A raw row: (line it starts on, {column: value} or a reason string when it is no row).
RawRow = tuple[int, "dict | tuple[str, str]"]


def open_text_table(path: str | os.PathLike, data_dir: Path, *, text_column: str,
                    label_column: str, max_text_bytes: int):
    """The TFDS builder of the table `path` in `data_dir`: the prepared one if unchanged."""
    path = Path(path).expanduser()
    fmt = table_format(path)
    if not path.is_file():
        raise ConfigError(
            "text_file must be an existing .csv, .tsv or .jsonl file. Received: "
            f"text_file={str(path)!r} ({'not a file' if path.exists() else 'missing'})")
    path = path.resolve()
    settings = {"format": fmt, "text_column": text_column, "label_column": label_column,
                "max_text_bytes": max_text_bytes}
    key = TextSourceKey("file", path, fingerprint("file", path, [path], settings))
    reused = prepared_builder(key, data_dir)
    if reused is not None:
        return reused
    skipped = SkipLog()
    rows = _kept_rows(path, fmt, text_column, label_column, max_text_bytes, skipped)
    class_names = _class_names({label for _, _, label in rows})
    if len(class_names) < 2:
        raise DatasetConfigError(
            "label_column must hold at least 2 classes (a classifier needs two). Received: "
            f"label_column={label_column!r} with {_classes_seen(class_names)} in {len(rows)} "
            f"kept rows of {path}")
    ids = {name: i for i, name in enumerate(class_names)}
    examples = tuple(TextExample(key=f"{path.name}:{line}", split="train", label=ids[label],
                                 text=text) for line, text, label in rows)
    require_two_classes("text_file", path, class_names, examples, skipped)
    scan = TextScan(key=key, class_names=class_names, examples=examples, skipped=skipped,
                    details={"format": fmt, "text_column": text_column,
                             "label_column": label_column})
    return make_builder(scan, data_dir)


def table_format(path: Path) -> str:
    """"csv", "tsv" or "jsonl" from the file's extension; anything else is refused."""
    fmt = TABLE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"text_file must end in {', '.join(TABLE_FORMATS)}. Received: "
            f"text_file={str(path)!r}")
    return fmt


def _kept_rows(path: Path, fmt: str, text_column: str, label_column: str,
               max_text_bytes: int, skipped: SkipLog) -> list[tuple[int, str, str]]:
    """[(line, text, label)] of every kept row; every other row counted in `skipped`."""
    reader = _jsonl_rows if fmt == "jsonl" else _delimited_rows
    rows, columns_seen = [], set()
    for line, row in reader(path, fmt, max_text_bytes):
        if isinstance(row, tuple):
            skipped.add(path.name, *row, line=line)
            continue
        columns_seen.update(row)
        kept = _kept(row, text_column, label_column, max_text_bytes)
        if isinstance(kept, LeftOut):
            skipped.add(path.name, kept.reason, kept.detail, line=line)
        else:
            rows.append((line, *kept))
    for role, column in (("text_column", text_column), ("label_column", label_column)):
        if columns_seen and column not in columns_seen:
            raise ConfigError(
                f"{role} must name a column of {path.name}. Received: {role}={column!r}; "
                f"the columns are {', '.join(sorted(columns_seen))}")
    return rows


class LeftOut(NamedTuple):
    """Why a row is left out (a text.SKIP_* reason) and the particulars."""

    reason: str
    detail: str = ""


def _kept(row: dict, text_column: str, label_column: str,
          max_text_bytes: int) -> tuple[str, str] | LeftOut:
    """(text, label) of a row, or why it is left out."""
    if text_column not in row or label_column not in row:
        missing = text_column if text_column not in row else label_column
        return LeftOut(SKIP_MALFORMED, f"no {missing!r} field")
    text, label = row[text_column], row[label_column]
    if not isinstance(text, str):
        return LeftOut(SKIP_MALFORMED, f"{text_column!r} is {type(text).__name__}, not a string")
    if label is None or isinstance(label, (bool, float, list, dict)):
        if label is None:
            return LeftOut(SKIP_NO_LABEL, "")
        return LeftOut(SKIP_MALFORMED,
                       f"{label_column!r} is {type(label).__name__}, not a class name")
    label = str(label).strip()
    for value in (text, label):
        if _has_undecodable_bytes(value):
            return LeftOut(SKIP_NOT_UTF8, "")
    size = len(text.encode("utf-8"))
    if size > max_text_bytes:
        return LeftOut(SKIP_TOO_LARGE, f"{size} bytes > {max_text_bytes}")
    if not text.strip():
        return LeftOut(SKIP_EMPTY, "")
    if not label:
        return LeftOut(SKIP_NO_LABEL, "")
    return text, label


def _has_undecodable_bytes(value: str) -> bool:
    """Whether `surrogateescape` put a byte that is not UTF-8 into `value`."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _delimited_rows(path: Path, fmt: str, max_text_bytes: int) -> Iterator[RawRow]:
    """CSV/TSV rows as {column: value}, the header from the first row."""
    options = ({"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {})
    previous_limit = csv.field_size_limit()
    # A longer field than this is a row to leave out, not a file to refuse (csv.Error below).
    csv.field_size_limit(max(previous_limit, max_text_bytes + 1))
    try:
        with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
            reader = csv.reader(f, **options)
            header = _header(reader, path)
            end = reader.line_num
            while True:
                start = end + 1
                try:
                    values = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:
                    end = reader.line_num
                    yield start, (SKIP_TOO_LARGE if "field limit" in str(e) else SKIP_MALFORMED,
                                  str(e))
                    continue
                end = reader.line_num
                if not values:  # a blank line is no row
                    continue
                if len(values) > len(header):
                    yield start, (SKIP_MALFORMED, f"{len(values)} fields, the header has "
                                                  f"{len(header)}")
                    continue
                yield start, dict(zip(header, values, strict=False))
    finally:
        csv.field_size_limit(previous_limit)


def _header(reader, path: Path) -> list[str]:
    try:
        header = next(reader)
    except StopIteration:
        header = []
    except csv.Error as e:
        raise DatasetConfigError(f"text_file's first row must name the columns. Received: "
                                 f"{path} ({e})") from e
    header = [h.strip() for h in header]
    if not any(header):
        raise DatasetConfigError(
            "text_file's first row must name the columns. Received: "
            f"{path} {'is empty' if not header else 'has an empty first row'}")
    return header


def _jsonl_rows(path: Path, fmt: str, max_text_bytes: int) -> Iterator[RawRow]:
    """JSONL lines as dicts; a line that is not UTF-8 or not a JSON object is no row."""
    del fmt, max_text_bytes  # a JSONL row is checked when its text is read
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                yield number, (SKIP_NOT_UTF8, f"byte 0x{raw[e.start]:02x} at offset {e.start}")
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                yield number, (SKIP_MALFORMED, f"not JSON: {e}")
                continue
            if not isinstance(row, dict):
                yield number, (SKIP_MALFORMED, f"a JSON {type(row).__name__}, not an object")
                continue
            yield number, row


def _class_names(labels: set[str]) -> tuple[str, ...]:
    """The labels sorted: numerically when all are integers (so 0..N-1 keep their ids)."""
    if labels and all(_INTEGER.fullmatch(label) for label in labels):
        return tuple(sorted(labels, key=int))
    return tuple(sorted(labels))


def _classes_seen(class_names: tuple[str, ...]) -> str:
    return f"only the class {class_names[0]!r}" if class_names else "no labelled row"
