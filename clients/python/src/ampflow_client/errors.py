"""The client's errors: one base class, TF Serving's status code and message on each."""

from __future__ import annotations

import grpc


class ClientError(Exception):
    """Base class of everything this package raises on purpose."""


class ConfigError(ClientError, ValueError):
    """A bad argument: the message says what was expected and what was received."""


class ServingError(ClientError):
    """A call failed: `code` is TF Serving's status (a `grpc.StatusCode`), `message` its text.

    Over REST, `code` is the gRPC code of the HTTP status TF Serving answered with
    (http_rest_api_handler.cc maps them one to one), and `message` its `{"error": ...}`.
    """

    def __init__(self, method: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{method} failed with {code.name}: {message}")
        self.method = method
        self.code = code
        self.message = message


# TF Serving's HTTP status of each gRPC code (ToHTTPStatusCode in http_rest_api_handler.cc),
# read back the other way.
GRPC_OF_HTTP = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
                403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
                409: grpc.StatusCode.ABORTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
                499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL,
                501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
                504: grpc.StatusCode.DEADLINE_EXCEEDED}


def code_of_number(number: int) -> grpc.StatusCode:
    """The `grpc.StatusCode` of a numeric code (TF Serving's StatusProto.error_code)."""
    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)


def code_of_name(name: str) -> grpc.StatusCode:
    """The `grpc.StatusCode` of a code name as TF Serving's REST API writes it ("OK")."""
    return next((c for c in grpc.StatusCode if c.name == name), grpc.StatusCode.UNKNOWN)
