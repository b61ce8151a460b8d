"""The serving side: TF Serving's gRPC and REST APIs over SavedModels in TF Serving's layout.

- `model_format`: what a served model is (TF Serving's model-name rule, method names, warm-up
  file, `set_method_name`; the classify input `image_example`), shared with the export and
  deploy steps.
- `config`: typed configs and TF Serving's `ModelServerConfig` text proto.
- `version_source`: the version dirs of a base path and the version policy.
- `servable`: one loaded version; `model_registry`: loading, warm-up, hot reload, labels.
- `status`: TF Serving's status codes and what a client may see of an error.
- `inference` (with `tensors`, `classification`): the request logic; `service` (gRPC) and
  `rest` (REST, with `json_tensor`) are the transports; `batching` merges concurrent Predicts.
- `server`: the gRPC server (`start_local_server`, `serve_forever`): health, reflection, TLS,
  batching, Prometheus metrics, SIGTERM drain.
- `grpc_guard`: requests whose bytes do not parse get one status and one summary log line.
- `tf_serving_binary`: the argv for the real `tensorflow_model_server`, used when on PATH.
- `client`: `PredictionClient` (gRPC) and helpers for `ampflow predict`; `rest_client`:
  `RestClient` (REST).
- `cli`: `ampflow serve | predict | model-metadata | model-status`.
- `testing`: a tiny real SavedModel that follows docs/ARTIFACTS.md.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ imports them
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.rest_client import RestClient

# The Python clients, importable as `from ampflow.serving import PredictionClient` (README),
# loaded on first use so that importing `ampflow.serving` (the CLI does) pulls in no gRPC/TF.
_EXPORTS = {"PredictionClient": "client", "RestClient": "rest_client"}

__all__ = ["PredictionClient", "RestClient"]


def __getattr__(name: str):
    """Import the submodule that defines `name` when it is first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
