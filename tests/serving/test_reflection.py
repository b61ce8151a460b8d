"""Server reflection lists and resolves every gRPC service of `ampflow serve`, KServe V2 included.

The V2 service's messages live in a private descriptor pool (grpc_predict_v2_pb2.py); a client
such as grpcurl or Postman only finds it if reflection serves that file. Checked with
grpc_reflection's own client-side descriptor database, which resolves symbols and files
through the ServerReflection RPC exactly as those tools do.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from serving_helpers import MODEL, install_version

V2 = "inference.GRPCInferenceService"
V2_METHODS = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
              "ModelInfer"}


@pytest.fixture
def server(model_store, tmp_path, start_server):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    return start_server(base)


def _listed(channel) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    return {s.name for s in answer.list_services_response.service}


def test_reflection_lists_v2_beside_tf_serving_health_and_itself(server):
    with grpc.insecure_channel(server.address) as channel:
        names = _listed(channel)
    assert names == {V2, "tensorflow.serving.PredictionService",
                     "tensorflow.serving.ModelService", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"}


def test_reflection_resolves_the_v2_service_its_messages_and_its_file(server):
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(V2)
        infer = service.methods_by_name["ModelInfer"]
        request_fields = set(infer.input_type.fields_by_name)
        by_file = database.FindFileByName(service.file.name)
        tf_serving = pool.FindServiceByName("tensorflow.serving.PredictionService")
        predict_input = tf_serving.methods_by_name["Predict"].input_type.full_name
    assert {m.name for m in service.methods} == V2_METHODS
    assert infer.input_type.full_name == "inference.ModelInferRequest"
    assert {"model_name", "inputs", "raw_input_contents"} <= request_fields
    assert by_file.name == service.file.name and by_file.package == "inference"
    assert predict_input == "tensorflow.serving.PredictRequest"  # the default pool's still


def test_reflection_of_an_unknown_symbol_is_not_found(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.Nope")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    assert answer.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_pool_holds_each_file_once_with_its_imports():
    from ampflow.serving.protocols.v2_grpc import SERVICE
    from ampflow.serving.server import PREDICTION_SERVICE, reflection_pool

    pool = reflection_pool((PREDICTION_SERVICE, SERVICE, PREDICTION_SERVICE))
    predict = pool.FindMessageTypeByName("tensorflow.serving.PredictRequest")
    tensor = predict.fields_by_name["inputs"].message_type.fields_by_name["value"].message_type
    assert tensor.full_name == "tensorflow.TensorProto"  # an import, copied along
    assert Path(pool.FindFileContainingSymbol(SERVICE.full_name).name).suffix == ".proto"
