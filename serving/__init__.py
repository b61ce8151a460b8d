"""The serving side: TF Serving's and KServe V2's gRPC and REST APIs over SavedModels and TFLite.

One data plane, thin protocol adapters (the shape of KServe's model server). By role:
- `model_format`: what a served model is (TF Serving's model-name rule, method names, warm-up
  file, `MAX_VERSION`, the signature and output names), shared with export and deploy;
  `config`: typed configs and TF Serving's `ModelServerConfig` text proto; `preflight`: the
  base paths and ports `serve` refuses before it loads anything; `compute_precision`:
  `--compute-precision bfloat16` (TF's oneDNN bf16 rewrite, per model), over `cpu_features`
  (the CPU's bf16 flags, which training's precision rule reads too).
- `models/`: `servable` (the `Servable` interface and the SavedModel behind it), `tflite` (the
  TFLite one), `version_source` (version dirs, the version policy), `registry` (loading,
  warm-up, hot reload, labels; no format branch).
- `core/`: `inference` (`InferenceCore.infer`: model, version or label, signature, declared
  inputs -> checked once -> arrays -> outputs as arrays; metrics labels), `batching`
  (concurrent runs merged), `dtypes` (TensorFlow/numpy dtypes, the signature check), `status`
  (TF Serving's codes, what a client may see of an error).
- `protocols/`: `tf_serving` (Predict, Classify, Regress, MultiInference, metadata, status,
  reload, warm-up over the core, protos in and out) with its gRPC (`tf_serving_grpc`) and REST
  (`tf_serving_rest`, `json_tensor`) doors, its TensorProto codec (`tensors`) and its
  example-based APIs (`classification`, `regression`); `v2` (KServe
  V2 over the core) with `v2_grpc` (`grpc_predict_v2_pb2`) and `v2_rest`.
- `transport/`: `grpc` and `http`, one error envelope each for both protocols on that port;
  `connection_limits` (slow clients, floods) and `grpc_guard` (undecodable requests).
- `server`: assembles them (`start_local_server`, `serve_forever`): health, reflection, TLS,
  batching, Prometheus metrics, SIGTERM drain. `workers`: `serve --workers N`, a TF-free
  supervisor of N such servers on the same ports (SO_REUSEPORT), with one multiprocess
  Prometheus view, restarts and a drain of all; `listening`: the lines both print once they
  listen (below both, so neither imports the other). `tf_serving_binary`: the real
  `tensorflow_model_server`'s argv, used when on PATH.
- `client` (`PredictionClient`, gRPC) and `rest_client` (`RestClient`): ampflow's errors over
  the TensorFlow-free ampflow-client; `cli`: `ampflow serve | predict | model-metadata |
  model-status`; `testing`: a tiny real SavedModel that follows docs/ARTIFACTS.md.
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
