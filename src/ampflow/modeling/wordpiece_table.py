"""BERT's BasicTokenizer as a per-codepoint table, built from Python's `unicodedata` once.

TensorFlow has no core op for Unicode normalization (NFD) or general-category tests; what
BERT's normalizer does is, character by character (Hugging Face's `tokenizers`:
`BertNormalizer` then `BertPreTokenizer`):
- clean: drop NUL, U+FFFD and every "other" character (categories Cc, Cf, Cs, Co, Cn; tab,
  newline and carriage return count as whitespace), whitespace (the Unicode White_Space
  property) becomes a space;
- Chinese characters (the CJK Unified Ideograph blocks BERT names: U+4E00–9FFF, 3400–4DBF,
  20000–2A6DF, 2A700–2B73F, 2B740–2B81F, 2B820–2CEAF, F900–FAFF, 2F800–2FA1F) get a space
  on each side;
- when lower-casing (uncased checkpoints; accents are stripped with it): NFD, drop the
  non-spacing marks (category Mn), lower-case;
- punctuation (ASCII punctuation or a Unicode P* category) becomes a word of its own.

So each codepoint maps to a string on its own, and the whole table covers U+0000–U+10FFFF.
It is kept in two parts the graph can hold: the class of every codepoint as runs
(`boundaries`, `classes`: a codepoint's class is that of the last run starting at or before
it, found with a sorted search), and the few thousand codepoints whose output is another
string (`mapped`). Normalizing a character alone is what `tokenizers` does (it lower-cases per
character too); NFD's reordering of combining marks across characters is not reproduced, and
the Unicode version is Python's (`unicodedata.unidata_version`).
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
