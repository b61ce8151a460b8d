"""gRPC's side of every protocol on the gRPC port: one error envelope, the caller's deadline.

TF Serving's services and KServe V2's answer a `ServingStatusError` with its code and a bounded
message, and any other exception with INTERNAL and no details (they are logged): one bad
request never escapes, whichever protocol it spoke.
"""

from __future__ import annotations

import logging

import grpc

from ampflow.serving.status import ServingStatusError, clip

log = logging.getLogger(__name__)

MAX_ERROR_MESSAGE = 1024  # well under gRPC's 8 KiB metadata limit, whatever the client sent


def abort_with(context: grpc.ServicerContext, method: str, error: Exception):
    """End the call with the status an error stands for (never returns)."""
    if isinstance(error, ServingStatusError):
        context.abort(error.code, clip(error.message, MAX_ERROR_MESSAGE))
    log.error("%s failed", method, exc_info=error)  # a server bug must not kill the process
    context.abort(grpc.StatusCode.INTERNAL,
                  f"internal error ({type(error).__name__}); see the server log")


def time_remaining(context: grpc.ServicerContext) -> float | None:
    """Seconds left of the client's deadline (None: it set none)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e6 else None
