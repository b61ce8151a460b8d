"""A text request held to its tokens, and a large one run in slices of rows (issue 50).

`--max-request-tokens` refuses a request whose tokens after padding (rows x its longest text's
bucket, bounded from its bytes: models/token_cost.py) are more than the server takes, before
the model runs, with INVALID_ARGUMENT as for too many rows: the request itself must change.
`--max-execution-tokens` runs a larger one in slices of rows of at most that many tokens, one
after the other, and joins the answers: each slice is padded to its own longest text, and a
row's answer does not depend on the rows beside it (the mask), so the joined answer is the one
a single run gives, while one run's memory stays that of one slice.
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
            f"this request would run {cost.tokens} tokens ({cost.rows} rows padded to "
            f"{cost.padded_length}, its longest text's length bucket as its bytes bound it); "
            f"this server takes at most {max_tokens} tokens per request "
            "(--max-request-tokens): send fewer or shorter texts")


def run_in_slices(run_slice: RunSlice, inputs: dict, cost: RequestTokens, slice_tokens: int,
                  timeout_s: float | None, signature_def) -> dict:
    """Run `inputs` in slices of at most `slice_tokens` tokens (>= 1 row) and join the outputs.

    The slices share the caller's deadline. A signature with an output that has no batch
    dimension cannot be joined: INVALID_ARGUMENT naming how many rows would run at once.
    """
    rows_per_slice = max(1, slice_tokens // cost.per_row)
    unbatched = [name for name, info in signature_def.outputs.items() if not _batched(info)]
    if unbatched:
        raise ServingStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"this request of {cost.tokens} tokens runs in slices above --max-execution-tokens, "
            f"and output '{clip(unbatched[0])}' has no batch dimension to join them on: send "
            f"at most {rows_per_slice} rows")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    parts = []
    for start in range(0, cost.rows, rows_per_slice):
        part = {name: value[start:start + rows_per_slice] for name, value in inputs.items()}
        parts.append(_joinable(run_slice(part, _left(deadline)), len(next(iter(part.values())))))
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


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
