"""The serving side: TF Serving's gRPC API over SavedModels in TF Serving's layout.

- `config`: typed configs and TF Serving's `ModelServerConfig` text proto.
- `model_registry`: version discovery, loading, warm-up, hot reload, version labels.
- `tensors`, `service`, `batching`: request validation, TensorProto encoding, the servicers.
- `server`: the gRPC server (`start_local_server`, `serve_forever`): health, reflection, TLS,
  batching, Prometheus metrics, SIGTERM drain.
- `rest`: TF Serving's REST API (`--rest-api-port`) over the same core, served by uvicorn.
- `grpc_guard`: requests whose bytes do not parse get one status and one summary log line.
- `tf_serving_binary`: the argv for the real `tensorflow_model_server`, used when on PATH.
- `client`: `PredictionClient` (gRPC), `RestClient` (REST) and helpers for `ampflow predict`.
- `cli`: `ampflow serve | predict | model-metadata | model-status`.
- `testing`: a tiny real SavedModel that follows docs/ARTIFACTS.md.
"""
