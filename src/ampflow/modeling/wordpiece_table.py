"""BERT's BasicTokenizer as a per-codepoint table, built from Python's `unicodedata` once.

TensorFlow has no core op for Unicode normalization (NFD) or general-category tests, so what
BERT's normalizer does to each character (clean, CJK spacing, NFD + accent stripping +
lower-casing when uncased, punctuation split off) is tabulated over U+0000–U+10FFFF: the class
of every codepoint as sorted runs, and the few thousand codepoints whose output is another
string. The rules and what is not reproduced (NFD's reordering across characters):
docs/explanation/design-notes.md, "wordpiece_table.py".
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np

KEEP, REMOVE, SPACE, CJK, MAPPED = range(5)  # a codepoint's class: what it becomes
LAST_CODEPOINT = 0x10FFFF
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


@dataclass(frozen=True, eq=False)
class NormalizationTable:
    """Runs of codepoint classes, and the codepoints that become another string."""

    boundaries: np.ndarray  # int32, sorted: the first codepoint of each run
    classes: np.ndarray  # int32, the class of each run
    mapped: dict[int, str]  # codepoint -> what it becomes (class MAPPED)


@functools.cache
def normalization_table(lower_case: bool) -> NormalizationTable:
    """The table for a cased or an uncased checkpoint (built once per process, ~1 s)."""
    classes = np.full(LAST_CODEPOINT + 1, KEEP, np.int32)
    mapped = {}
    for codepoint in range(LAST_CODEPOINT + 1):
        output = normalized_character(chr(codepoint), lower_case)
        if output == chr(codepoint):
            continue
        if output == "":
            classes[codepoint] = REMOVE
        elif output == " ":
            classes[codepoint] = SPACE
        elif output == f" {chr(codepoint)} " and _is_cjk(codepoint):
            classes[codepoint] = CJK
        else:
            classes[codepoint], mapped[codepoint] = MAPPED, output
    starts = np.flatnonzero(np.diff(classes, prepend=-1))
    return NormalizationTable(starts.astype(np.int32), classes[starts], mapped)


def normalized_character(char: str, lower_case: bool) -> str:
    """What BERT's normalizer and pre-tokenizer make of one character (spaces split words)."""
    if char in ("\0", "\ufffd") or _is_other(char):
        return ""
    if char.isspace():
        return " "
    text = char
    if lower_case:
        text = "".join(c for c in unicodedata.normalize("NFD", text)
                       if unicodedata.category(c) != "Mn").lower()
    text = "".join(f" {c} " if is_punctuation(c) else c for c in text)
    return f" {text} " if _is_cjk(ord(char)) else text


def is_punctuation(char: str) -> bool:
    """ASCII punctuation (BERT counts `$`, `+`, `^`, ... though Unicode does not) or a P*."""
    code = ord(char)
    return (33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
            or unicodedata.category(char).startswith("P"))


def _is_other(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char).startswith("C")


def _is_cjk(codepoint: int) -> bool:
    return any(low <= codepoint <= high for low, high in CJK_RANGES)
