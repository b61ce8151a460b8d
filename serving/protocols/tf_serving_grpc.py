"""TF Serving's gRPC services, PredictionService and ModelService, over `TFServingProtocol`.

Each call goes to the API (tf_serving.py) with the deadline the client set; its error becomes
a status through the gRPC transport's one envelope (transport/grpc.py).
"""

from __future__ import annotations

from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

from ampflow.serving.core.inference import CallObserver, Observer
from ampflow.serving.protocols.tf_serving import (
    TFServingProtocol,
    answered_version,
    record_spec,
    request_spec,
)
from ampflow.serving.transport.grpc import abort_with, time_remaining


class _Handler:
    """One call: metrics recorded, the API called, any error turned into a status."""

    def __init__(self, api: TFServingProtocol, observe: Observer | None) -> None:
        self.api = api
        self.calls = CallObserver(api.core, observe)

    def call(self, method: str, request, context, fn):
        try:
            with self.calls.call(method) as record:
                record_spec(record, request_spec(request))
                response = fn(request, time_remaining(context))
                record.answered = answered_version(response)
                return response
        except Exception as e:  # noqa: BLE001 - every error becomes a status
            abort_with(context, method, e)


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """tensorflow.serving.PredictionService: all five calls (Regress, MultiInference included)."""

    def __init__(self, api: TFServingProtocol, observe: Observer | None = None) -> None:
        self._h = _Handler(api, observe)

    def Predict(self, request, context):  # noqa: D102 - gRPC method names are fixed
        return self._h.call("Predict", request, context, self._h.api.predict)

    def Classify(self, request, context):  # noqa: D102
        return self._h.call("Classify", request, context, self._h.api.classify)

    def GetModelMetadata(self, request, context):  # noqa: D102
        return self._h.call("GetModelMetadata", request, context,
                            lambda r, _t: self._h.api.metadata(r))

    def Regress(self, request, context):  # noqa: D102
        return self._h.call("Regress", request, context, self._h.api.regress)

    def MultiInference(self, request, context):  # noqa: D102
        return self._h.call("MultiInference", request, context, self._h.api.multi_inference)


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """tensorflow.serving.ModelService: GetModelStatus, HandleReloadConfigRequest."""

    def __init__(self, api: TFServingProtocol, observe: Observer | None = None) -> None:
        self._h = _Handler(api, observe)

    def GetModelStatus(self, request, context):  # noqa: D102
        return self._h.call("GetModelStatus", request, context,
                            lambda r, _t: self._h.api.status(r))

    def HandleReloadConfigRequest(self, request, context):  # noqa: D102
        return self._h.call("HandleReloadConfigRequest", request, context,
                            lambda r, _t: self._h.api.reload_config(r))
