"""Query TF Serving (or `ampflow serve`) from any Python app, without TensorFlow.

    from ampflow_client import Client
    with Client("localhost:8500") as client:
        result = client.predict("ampflow", {"images": batch})

`Client` speaks TF Serving's gRPC API, `RestClient` its REST API; `make_tensor_proto` and
`make_ndarray` convert between numpy and TensorProto as TensorFlow does. Dependencies: grpcio,
protobuf and numpy only.
"""

from ampflow_client._common import (
    DEFAULT_SIGNATURE,
    ClassifyResult,
    PredictResult,
    RegressResult,
    TensorSpec,
    make_example,
)
from ampflow_client.errors import ClientError, ConfigError, ServingError
from ampflow_client.grpc_client import Client
from ampflow_client.rest import RestClient
from ampflow_client.tensors import make_ndarray, make_tensor_proto

__version__ = "0.1.0"

__all__ = ["DEFAULT_SIGNATURE", "ClassifyResult", "Client", "ClientError", "ConfigError",
           "PredictResult", "RegressResult", "RestClient", "ServingError", "TensorSpec",
           "make_example", "make_ndarray", "make_tensor_proto"]
