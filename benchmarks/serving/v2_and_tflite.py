"""V2 vs TF Serving's APIs, and SavedModel vs TFLite versions, side by side in one run.

One `ampflow serve` (in this process, on loopback) serves the digits demo model
(small_cnn, trained here for a few epochs, exported) as three versions of one model:
1 = the SavedModel, 2 = the converter's float32 .tflite, 3 = its full_int8 .tflite (int8 I/O).

- protocols: on version 1, the p50 latency of TF Serving's gRPC Predict, V2 gRPC ModelInfer
  (raw contents), TF Serving's REST predict, V2 REST JSON and V2 REST binary, for 1 and 32
  images per request, as ratios to gRPC Predict;
- formats: over gRPC Predict, p50 latency at 1 image and throughput at 32 images per request
  of versions 1, 2, 3, as ratios to the SavedModel, and each version's accuracy on the whole
  test split next to what the converter measured.
Every measurement round runs each row once, in turn (A/B/C/A/B/C...), so machine noise hits
all rows alike; the client runs in the server's process (the GIL is shared alike too). Writes
JSON + Markdown naming the CPU and its flags.

    .venv/bin/python benchmarks/serving/v2_and_tflite.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402

MODEL = "ampflow"
PATHS = ("grpc_predict", "v2_grpc", "rest_v1", "v2_rest_json", "v2_rest_binary")


def _cpu() -> dict:
    model, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = sorted(f for f in line.split(":", 1)[1].split()
                               if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
                break
    except OSError:
        pass
    return {"model": model, "flags": flags, "cores": os.cpu_count()}


def _prepare(work: Path, epochs: int):
    """Train, export and convert the demo model; lay out versions 1-3."""
    from ampflow.components.convert_tflite import ConvertConfig, run_convert
    from ampflow.components.export_savedmodel import ExportConfig, run_export
    from ampflow.components.prepare_data import PrepareDataConfig, run_prepare_data
    from ampflow.components.train import TrainConfig, run_train

    data = run_prepare_data(PrepareDataConfig(output_dir=work / "data")).output_dir
    model_dir = run_train(TrainConfig(data_dir=data, output_dir=work / "model",
                                      precision="mixed_float16", epochs=epochs)).output_dir
    export = run_export(ExportConfig(model_dir=model_dir, data_dir=data,
                                     export_base=work / "export", force=True,
                                     num_parity_images=64, num_warmup_records=1))
    converted = run_convert(ConvertConfig(saved_model_dir=export.version_dir, data_dir=data,
                                          output_dir=work / "tflite",
                                          variants=("float32", "full_int8"), int8_io=True,
                                          latency_runs=20, warmup_runs=2))
    base = work / "served"
    shutil.copytree(export.version_dir, base / "1")
    for version, variant in ((2, "float32"), (3, "full_int8")):
        (base / str(version)).mkdir()
        shutil.copy(converted.variants[variant].tflite_path, base / str(version))
    return data, base, converted


class Calls:
    """One callable per (row, images) on a running server."""

    def __init__(self, server) -> None:
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb

        self.pb = pb
        self.channel = grpc.insecure_channel(server.address)
        self.predict_stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.infer = self.channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString)
        self.rest = f"http://{server.rest_address}"

    def grpc_predict(self, images, version=1):
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.model_spec.version.value = version
        request.inputs["images"].CopyFrom(tf.make_tensor_proto(images))
        response = self.predict_stub.Predict(request, timeout=60)
        return tf.make_ndarray(response.outputs["class_ids"])

    def v2_grpc(self, images, version=1):
        request = self.pb.ModelInferRequest(model_name=MODEL, model_version=str(version))
        request.inputs.add(name="images", datatype="FP32", shape=list(images.shape))
        request.raw_input_contents.append(images.astype("<f4").tobytes())
        response = self.infer(request, timeout=60)
        names = [o.name for o in response.outputs]
        return np.frombuffer(response.raw_output_contents[names.index("class_ids")], "<i8")

    def _post(self, path, body: bytes, headers=None):
        request = urllib.request.Request(self.rest + path, data=body, method="POST",
                                         headers=headers or {})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read(), response.headers  # case-insensitive lookups

    def rest_v1(self, images, version=1):
        body, _ = self._post(f"/v1/models/{MODEL}/versions/{version}:predict",
                             json.dumps({"instances": images.tolist()}).encode())
        return np.array([row["class_ids"] for row in json.loads(body)["predictions"]])

    def v2_rest_json(self, images, version=1):
        body, _ = self._post(f"/v2/models/{MODEL}/versions/{version}/infer", json.dumps({
            "inputs": [{"name": "images", "datatype": "FP32", "shape": list(images.shape),
                        "data": images.ravel().tolist()}]}).encode())
        outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
        return np.array(outputs["class_ids"])

    def v2_rest_binary(self, images, version=1):
        head = json.dumps({"inputs": [{"name": "images", "datatype": "FP32",
                                       "shape": list(images.shape),
                                       "parameters": {"binary_data_size": images.nbytes}}],
                           "parameters": {"binary_data_output": True}}).encode()
        body, headers = self._post(f"/v2/models/{MODEL}/versions/{version}/infer",
                                   head + images.astype("<f4").tobytes(),
                                   {"Inference-Header-Content-Length": str(len(head))})
        length = int(headers["Inference-Header-Content-Length"])
        answer, offset = json.loads(body[:length]), length
        for output in answer["outputs"]:
            size = output["parameters"]["binary_data_size"]
            if output["name"] == "class_ids":
                return np.frombuffer(body[offset:offset + size], "<i8")
            offset += size
        raise AssertionError("no class_ids")


def _interleaved(rows: dict, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of each row's call, one call per row per round, rows in turn."""
    for fn in rows.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def _p50_ms(values) -> float:
    return statistics.median(values) * 1e3


def _accuracy(calls: Calls, version: int, images, labels) -> float:
    ids = [calls.grpc_predict(images[i:i + 64], version) for i in range(0, len(images), 64)]
    return float(np.mean(np.concatenate(ids) == labels))


def run(rounds: int, epochs: int) -> dict:
    """Prepare, serve, measure; the result as a dict."""
    from ampflow.data import load_arrays
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    work = Path(tempfile.mkdtemp(prefix="ampflow-v2-tflite-"))
    try:
        data, base, converted = _prepare(work, epochs)
        images, labels = load_arrays(data, "test")
        images = images.astype(np.float32)
        server = start_local_server(ServerConfig(
            models=(ModelConfig(MODEL, base, version_policy="all"),), host="127.0.0.1",
            port=0, rest_api_port=_free_port(), grace_s=1.0))
        try:
            calls = Calls(server)
            protocols, formats = {}, {}
            for n in (1, 32):
                batch = images[:n]
                rows = {name: functools.partial(getattr(calls, name), batch) for name in PATHS}
                for fn in rows.values():  # every path answers the same classes
                    np.testing.assert_array_equal(fn(), calls.grpc_predict(batch))
                samples = _interleaved(rows, rounds, warmup=10)
                base_ms = _p50_ms(samples["grpc_predict"])
                protocols[n] = {name: {"p50_ms": _p50_ms(s), "ratio": _p50_ms(s) / base_ms}
                                for name, s in samples.items()}
            one, many = images[:1], images[:32]
            names = {1: "SavedModel", 2: "TFLite float32", 3: "TFLite full_int8"}
            lat = _interleaved({v: (lambda v=v: calls.grpc_predict(one, v)) for v in names},
                               rounds, warmup=10)
            thr = _interleaved({v: (lambda v=v: calls.grpc_predict(many, v)) for v in names},
                               max(rounds // 4, 20), warmup=3)
            measured = {1: converted.reference["accuracy"],
                        2: converted.variants["float32"].metrics["accuracy"],
                        3: converted.variants["full_int8"].metrics["accuracy"]}
            for v, name in names.items():
                formats[name] = {
                    "version": v, "p50_ms_1_image": _p50_ms(lat[v]),
                    "images_per_s_32": 32 / statistics.median(thr[v]),
                    "served_accuracy": _accuracy(calls, v, images, labels),
                    "converter_accuracy": measured[v]}
            reference = formats["SavedModel"]
            for entry in formats.values():
                entry["latency_ratio"] = entry["p50_ms_1_image"] / reference["p50_ms_1_image"]
                entry["throughput_ratio"] = entry["images_per_s_32"] / \
                    reference["images_per_s_32"]
            calls.channel.close()
        finally:
            server.stop(0.5)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"host": {**_cpu(), "python": platform.python_version(),
                     "load_average": os.getloadavg()},
            "model": f"small_cnn mixed_float16 on the digits, {epochs} epochs; "
                     f"{len(images)} test images",
            "rounds": rounds, "protocols": protocols, "formats": formats}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def markdown(result: dict) -> str:
    """The result as the Markdown page of benchmarks/results."""
    host = result["host"]
    lines = ["# V2 vs TF Serving APIs; SavedModel vs TFLite versions", "",
             f"Host: {host['model']}, {host['cores']} cores, flags "
             f"{' '.join(host['flags'])}; load average {host['load_average'][0]:.2f} "
             "(a shared machine: compare ratios within this run only).",
             f"Model: {result['model']}. {result['rounds']} interleaved rounds.", "",
             "## Protocols (version 1, the SavedModel; p50 ms, ratio to gRPC Predict)", "",
             "| path | 1 image | ratio | 32 images | ratio |", "|---|---:|---:|---:|---:|"]
    one, many = result["protocols"][1], result["protocols"][32]
    for name in one:
        lines.append(f"| {name} | {one[name]['p50_ms']:.2f} | {one[name]['ratio']:.2f} | "
                     f"{many[name]['p50_ms']:.2f} | {many[name]['ratio']:.2f} |")
    lines += ["", "## Formats (gRPC Predict)", "",
              "| version | p50 ms, 1 image | ratio | images/s, 32 per request | ratio | "
              "served accuracy | converter's accuracy |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, f in result["formats"].items():
        lines.append(f"| {f['version']}: {name} | {f['p50_ms_1_image']:.2f} | "
                     f"{f['latency_ratio']:.2f} | {f['images_per_s_32']:.0f} | "
                     f"{f['throughput_ratio']:.2f} | {f['served_accuracy']:.4f} | "
                     f"{f['converter_accuracy']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    result = run(args.rounds, args.epochs)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "serving_v2_tflite"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
