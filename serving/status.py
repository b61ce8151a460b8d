"""TF Serving's status vocabulary, and what a client may see of an error.

- `ServingStatusError`: a request-level failure with the gRPC code TF Serving gives it
  (`invalid_argument`, `not_found`: the common two);
- `VersionState` / `VersionStatus`: what GetModelStatus reports for a version;
- `load_error_code`: the code TF Serving reports for a version that failed to load;
- `clip` and `scrub_paths`: client-sent text is echoed at a bounded length, and no server
  file-system path ever reaches a client.
"""

from __future__ import annotations

import dataclasses
import enum
import re

import grpc


class ServingStatusError(Exception):
    """A request-level failure with the gRPC status code TF Serving uses for it."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid_argument(message: str) -> ServingStatusError:
    """INVALID_ARGUMENT: what TF Serving answers to most malformed requests."""
    return ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingStatusError:
    """NOT_FOUND: an unknown model or version."""
    return ServingStatusError(grpc.StatusCode.NOT_FOUND, message)


class VersionState(enum.IntEnum):
    """`ModelVersionStatus.State` values of tensorflow_serving/apis/get_model_status.proto."""

    START = 10
    LOADING = 20
    AVAILABLE = 30
    UNLOADING = 40
    END = 50


@dataclasses.dataclass
class VersionStatus:
    """What GetModelStatus reports for one version."""

    state: VersionState
    error: str = ""
    error_code: grpc.StatusCode = grpc.StatusCode.OK


def load_error_code(error: BaseException) -> grpc.StatusCode:
    """The code TF Serving would report for a failed load.

    TensorFlow's own error code when there is one, NOT_FOUND for a missing file, DATA_LOSS for
    a file that does not parse; an error raised `from` one of those gets its code.
    """
    from google.protobuf.message import DecodeError

    if isinstance(error, ServingStatusError):
        return error.code
    code = getattr(error, "error_code", None)  # tf.errors.OpError
    if isinstance(code, int):
        return next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    if isinstance(error, FileNotFoundError) or (
            isinstance(error, OSError) and "does not exist" in str(error)):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(error, DecodeError):
        return grpc.StatusCode.DATA_LOSS
    if error.__cause__ is not None:
        return load_error_code(error.__cause__)
    return grpc.StatusCode.UNKNOWN


def clip(text: object, limit: int = 128) -> str:
    """Client-sent text as echoed in an error message: at most `limit` characters."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text) - limit} more chars)"


# An absolute path: a '/' not inside a word, a dotted name or a `<placeholder>`, then segments.
_PATH = re.compile(r"(?<![\w.<])/(?:[\w.+@-]+/)+[\w.+@-]*")


def scrub_paths(text: str) -> str:
    """Replace absolute file-system paths with `<path>`."""
    return _PATH.sub("<path>", text)
