"""What a text request costs in tokens, known from its bytes before the model runs (issue 50).

A text model's signatures tokenize in the graph and pad the request to its longest text's
length bucket (16, 32, 64, ... the cap), so a request costs rows x that bucket, whatever its
bytes: 1,024 strings of 4 bytes ran 16,384 tokens. The server cannot run the tokenizer before
the model (it is the model's graph), so it bounds the tokens from the bytes instead, an upper
bound that is safe for either tokenizer ampflow exports (docs/explanation/serving-path.md):
- `split: whitespace` (Keras TextVectorization): a word is >= 1 byte and words are apart by >=
  1 byte of whitespace, so a text of b bytes holds at most ceil(b / 2) words; standardizing
  only removes characters and lowercases one to one;
- WordPiece: every piece is >= 1 character of the normalized text, no character normalizes to
  more characters than its UTF-8 bytes (checked over the table), plus [CLS] and [SEP]: b + 2;
- any other tokenizer: the cap, always.
Each row is cut at the cap. The buckets are the ones the export wrote in ampflow_export.json
(`input.length_buckets`); without them, the cap (a model of a fixed length).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TOKENIZER_ASSET = Path("assets") / "tokenizer.json"  # what the text export ships beside vocab
EXPORT_METADATA = "ampflow_export.json"  # the export's record, in the version dir


@dataclasses.dataclass(frozen=True)
class TokenCost:
    """A text model's cost rule: its cap, its buckets and how many bytes a token needs at least.

    `bytes_per_token` 0: no bound from bytes (an unknown tokenizer): every row costs the cap.
    """

    cap: int
    buckets: tuple[int, ...]
    bytes_per_token: int = 0
    added_tokens: int = 0  # tokens a tokenizer adds to every text ([CLS] and [SEP])

    def row_tokens(self, nbytes: int) -> int:
        """At most how many tokens a text of `nbytes` bytes becomes (before padding)."""
        if not self.bytes_per_token:
            return self.cap
        return min(self.cap, -(-nbytes // self.bytes_per_token) + self.added_tokens)

    @property
    def smallest_bucket_bytes(self) -> int:
        """The bytes that may fill the smallest bucket: texts up to them all pad to it."""
        return self.buckets[0] * max(1, self.bytes_per_token)

    def padded_length(self, longest_bytes: int) -> int:
        """The bucket a request whose longest string has `longest_bytes` is padded to, at most."""
        return int(self.padded_lengths(np.asarray([longest_bytes]))[0])

    def padded_lengths(self, nbytes: np.ndarray) -> np.ndarray:
        """`padded_length` of each element of `nbytes` (int64)."""
        if not self.bytes_per_token:
            return np.full(np.shape(nbytes), self.cap, np.int64)
        tokens = np.minimum(self.cap, -(-np.asarray(nbytes, np.int64) // self.bytes_per_token)
                            + self.added_tokens)
        edges = np.asarray(self.buckets, np.int64)
        return edges[np.minimum(np.searchsorted(edges, tokens), len(edges) - 1)]

    def of_inputs(self, inputs: dict) -> RequestTokens | None:
        """The tokens `inputs` would run (strings: rows x bucket; ids: their elements).

        One string input of one text per row (`serving_default`, `classify`): each row at its
        own bucket, which the rows of one bucket then run at (`row_lengths`). Otherwise every
        row at the widest input's.
        """
        rows = {np.shape(v)[0] if np.ndim(v) else None for v in inputs.values()}
        if len(rows) != 1 or None in rows:
            return None
        (count,) = rows
        values = [np.asarray(v) for v in inputs.values()]
        if len(values) == 1 and values[0].ndim == 1 and values[0].dtype.kind in "OSU":
            nbytes = byte_lengths(values[0])
            lengths = self.padded_lengths(nbytes)
            return RequestTokens(count, int(lengths.sum()), int(lengths.max(initial=0)), lengths,
                                 byte_classes(nbytes, self.smallest_bucket_bytes))
        tokens, width = 0, 0
        for value in values:
            if value.dtype.kind in "OSU":
                length = self.padded_length(int(byte_lengths(value).max(initial=0)))
                width, tokens = max(width, length), tokens + value.size * length
            else:  # token ids as sent (the `token_ids` signature): each element is a token
                width = max(width, int(np.prod(value.shape[1:], dtype=np.int64)))
                tokens += value.size
        return RequestTokens(count, tokens, width)


@dataclasses.dataclass(frozen=True)
class RequestTokens:
    """What one request runs: its rows, its tokens after padding, its widest padded length.

    `row_lengths`: each row's bucket, when its rows can run by bucket (else None: all at once).
    `row_byte_classes`: with `row_lengths`, each row's `byte_classes`: the rows of one bucket
    run apart by them (core/tokens.py), as the bound puts most rows in the cap's bucket.
    """

    rows: int
    tokens: int
    padded_length: int
    row_lengths: np.ndarray | None = None
    row_byte_classes: np.ndarray | None = None

    @property
    def per_row(self) -> int:
        """Tokens one row costs (all inputs together), at least 1."""
        return max(1, -(-self.tokens // self.rows)) if self.rows else 1


def byte_lengths(strings: np.ndarray) -> np.ndarray:
    """Bytes of each element of a string array, flattened (a `str` counts its UTF-8 bytes)."""
    return np.fromiter((len(s.encode("utf-8")) if isinstance(s, str) else len(s)
                        for s in strings.ravel()), np.int64, count=strings.size)


def byte_classes(nbytes: np.ndarray, floor: int = 1) -> np.ndarray:
    """Each length's power-of-two class: n bytes in [2**k, 2**(k+1)) is class k.

    Every n up to `floor` (the smallest bucket's bytes: they pad to it whatever they hold) is
    in `floor`'s class.

    Which rows share a run is a matter of speed, never of answers (each run pads to its own
    longest text, and the mask hides the padding), so it may follow what the bytes suggest:
    texts of one kind hold tokens about in proportion to their bytes, and rows within a factor
    of 2 of each other pad each other by at most about that, as the doubling buckets do. The
    bound (`padded_lengths`) cannot tell a 150-byte review (~30 tokens) from a 1,000-byte one:
    both may hold the cap's tokens.
    """
    return np.frexp(np.maximum(np.asarray(nbytes, np.int64), max(1, floor))
                    .astype(np.float64))[1] - 1


def read_token_cost(version_dir: str | Path) -> TokenCost | None:
    """The cost rule of a text SavedModel (assets/tokenizer.json), None for any other model.

    A tokenizer file that does not read gives None with a warning: the byte, row and string
    limits still apply to the version, which serves as before.
    """
    path = Path(version_dir) / TOKENIZER_ASSET
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
        cap = settings["max_sequence_length"]
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_sequence_length must be an integer >= 1, not {cap!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s does not give a text model's length (%s): no token limit for it",
                    path, e)
        return None
    per_token, added = _bytes_per_token(settings)
    return TokenCost(cap, _buckets(version_dir, cap), per_token, added)


def _bytes_per_token(settings: dict) -> tuple[int, int]:
    """(bytes a token needs at least, tokens added per text) of the tokenizer `settings` name."""
    if settings.get("kind") == "wordpiece":
        return 1, 2
    if settings.get("split") == "whitespace" and "kind" not in settings:
        return 2, 0
    return 0, 0


def _buckets(version_dir: str | Path, cap: int) -> tuple[int, ...]:
    """The export's `input.length_buckets` when they are sorted lengths ending at the cap."""
    try:
        meta = json.loads((Path(version_dir) / EXPORT_METADATA).read_text(encoding="utf-8"))
        buckets = meta["input"]["length_buckets"]
    except (OSError, ValueError, KeyError, TypeError):
        return (cap,)
    if (not isinstance(buckets, list) or not buckets or buckets[-1] != cap
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets)
            or buckets != sorted(set(buckets))):
        return (cap,)
    return tuple(buckets)
