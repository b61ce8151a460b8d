"""A text request held to its tokens, and a large one run in slices of rows (issue 50).

`--max-request-tokens` refuses a request whose tokens after padding (rows x its longest text's
bucket, bounded from its bytes: models/token_cost.py) are more than the server takes, before
the model runs, with INVALID_ARGUMENT as for too many rows: the request itself must change.
A request's texts run by length bucket and, within one, by the power of two of their bytes
(one long text no longer pads 31 short ones to its length), and `--max-execution-tokens`
cuts each group's rows into slices of at most that many tokens, run one after the other;
the answers go back to their rows. Each run is padded to its
own longest text, and a row's answer does not depend on the rows beside it (the mask), so the
answer is the one a single run gives, while one run's memory stays that of one slice.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import numpy as np

from ampflow.serving.models.servable import Servable
from ampflow.serving.models.token_cost import RequestTokens
from ampflow.serving.status import ServingStatusError, clip

RunSlice = Callable[[dict, "float | None"], dict]  # (inputs of some rows, seconds left)


def request_tokens(servable: Servable, inputs: dict) -> RequestTokens | None:
    """What `inputs` cost on a text model, None for any other model or unbatched inputs."""
    rule = getattr(servable, "token_cost", None)  # a Servable of a caller's may not say
    return rule.of_inputs(inputs) if rule is not None else None


def check_tokens(cost: RequestTokens, max_tokens: int) -> None:
    """INVALID_ARGUMENT when `cost` is over `max_tokens` (0 = no cap)."""
    if max_tokens and cost.tokens > max_tokens:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this request would run {cost.tokens} tokens ({cost.rows} rows, each padded to "
            f"the length bucket its bytes allow, the widest to {cost.padded_length}); "
            f"this server takes at most {max_tokens} tokens per request "
            "(--max-request-tokens): send fewer or shorter texts")


def row_parts(cost: RequestTokens, slice_tokens: int) -> list[np.ndarray]:
    """The row indices of each run, at least one row each.

    The rows of one length bucket and one byte class together (when the request's rows are
    known one by one: a 1,000-byte text does not pad 31 reviews of 150 bytes, which its bucket,
    bounded from the bytes, also holds), in slices of at most `slice_tokens` tokens (0 = no
    slices), each row counted at its bucket: one run's memory is still bounded.
    """
    if cost.row_lengths is None:
        groups = [(np.arange(cost.rows), cost.per_row)]
    else:
        classes = (np.zeros_like(cost.row_lengths) if cost.row_byte_classes is None
                   else cost.row_byte_classes)
        keys = np.stack([cost.row_lengths, classes], axis=1)
        groups = [(rows, int(cost.row_lengths[rows].max()))
                  for rows in (np.flatnonzero((keys == key).all(axis=1))
                               for key in np.unique(keys, axis=0))]
    parts = []
    for rows, width in groups:
        step = max(1, slice_tokens // width) if slice_tokens else max(1, len(rows))
        parts.extend(rows[start:start + step] for start in range(0, len(rows), step))
    return parts


def run_in_parts(run_part: RunSlice, inputs: dict, parts: list[np.ndarray],
                 timeout_s: float | None, signature_def) -> dict:
    """Run each part's rows, one after the other, and put every answer back in its row.

    The parts share the caller's deadline. A signature with an output that has no batch
    dimension cannot be joined: INVALID_ARGUMENT naming how many rows would run at once.
    """
    unbatched = [name for name, info in signature_def.outputs.items() if not _batched(info)]
    if unbatched:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this request runs in {len(parts)} parts (its length buckets, slices above "
            f"--max-execution-tokens), and output '{clip(unbatched[0])}' has no batch dimension "
            f"to join them on: send at most {len(parts[0])} rows of texts of one length")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    rows = sum(len(p) for p in parts)
    joined: dict[str, np.ndarray] = {}
    for part in parts:
        outputs = _joinable(run_part({k: v[part] for k, v in inputs.items()}, _left(deadline)),
                            len(part))
        for name, value in outputs.items():
            if name not in joined:  # strings as objects: a later part's may be longer
                dtype = np.asarray(value).dtype
                joined[name] = np.empty((rows, *np.shape(value)[1:]),
                                        object if dtype.kind in "SU" else dtype)
            joined[name][part] = value
    return joined


def _batched(tensor_info) -> bool:
    shape = tensor_info.tensor_shape
    return not shape.unknown_rank and len(shape.dim) > 0 and shape.dim[0].size == -1


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ServingStatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                 "Deadline exceeded while running a request's slices")
    return left


def _joinable(outputs: dict, rows: int) -> dict:
    """A slice's outputs, each with the slice's rows first (else they cannot be joined)."""
    for name, value in outputs.items():
        if np.ndim(value) == 0 or np.shape(value)[0] != rows:
            raise ServingStatusError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"output '{clip(name)}' of a slice of {rows} rows has shape "
                f"{list(np.shape(value))}: the request's slices cannot be joined; send fewer "
                "tokens than --max-execution-tokens")
    return outputs
