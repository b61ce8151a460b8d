"""TF Serving's gRPC services, PredictionService and ModelService, over `InferenceCore`.

Each call goes to the core (inference.py) with the deadline the client set; a
`ServingStatusError` becomes that status with a bounded message, and any other exception
becomes INTERNAL without its details (they are logged): one bad request never escapes.
"""

from __future__ import annotations

import logging

import grpc
from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from ampflow.serving.inference import CallObserver, InferenceCore, Observer, answered_version
from ampflow.serving.status import ServingStatusError, clip

log = logging.getLogger(__name__)

MAX_ERROR_MESSAGE = 1024  # well under gRPC's 8 KiB metadata limit, whatever the client sent


class _Handler:
    """Turns `ServingStatusError` into the right status; one bad request never escapes."""

    def __init__(self, core: InferenceCore, observe: Observer | None) -> None:
        self.core = core
        self.calls = CallObserver(core, observe)

    def call(self, method: str, request, context, fn):
        try:
            with self.calls.call(method) as record:
                record.request = request
                response = fn(request, _remaining(context))
                record.answered = answered_version(response)
                return response
        except ServingStatusError as e:
            context.abort(e.code, clip(e.message, MAX_ERROR_MESSAGE))
        except Exception as e:  # a server bug must not kill the process: report INTERNAL
            log.exception("%s failed", method)
            context.abort(grpc.StatusCode.INTERNAL,
                          f"internal error ({type(e).__name__}); see the server log")


def _remaining(context) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e6 else None


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService: Predict, Classify, GetModelMetadata."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self._h = _Handler(core, observe)

    def Predict(self, request, context):  # noqa: D102 - gRPC method names are fixed
        return self._h.call("Predict", request, context, self._h.core.predict)

    def Classify(self, request, context):  # noqa: D102
        return self._h.call("Classify", request, context, self._h.core.classify)

    def GetModelMetadata(self, request, context):  # noqa: D102
        return self._h.call("GetModelMetadata", request, context,
                            lambda r, _t: self._h.core.metadata(r))

    def Regress(self, request, context):  # noqa: D102
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Regress is not supported by ampflow serve")

    def MultiInference(self, request, context):  # noqa: D102
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "MultiInference is not supported by ampflow serve")


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService: GetModelStatus, HandleReloadConfigRequest."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None) -> None:
        self._h = _Handler(core, observe)

    def GetModelStatus(self, request, context):  # noqa: D102
        return self._h.call("GetModelStatus", request, context,
                            lambda r, _t: self._h.core.status(r))

    def HandleReloadConfigRequest(self, request, context):  # noqa: D102
        return self._h.call("HandleReloadConfigRequest", request, context,
                            lambda r, _t: self._h.core.reload_config(r))
