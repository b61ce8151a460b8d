"""The fuzz half of benchmarks/serving_soak.py: hostile requests, each must get a status code.

Hand-made bad requests (the 52-byte huge-shape request and others) and byte-mutated
Predict/Classify/metadata/status requests go to a fresh `ampflow serve` process; the server must
stay alive and answer a good request afterwards. Run through serving_soak.py (`--fuzz N`).
"""

from __future__ import annotations

import random
from pathlib import Path

MODEL = "ampflow"


def hand_made_requests() -> list[tuple[str, str, bytes]]:
    """(name, method, serialized request): bad requests a hostile client could send."""
    import numpy as np
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
    )

    from ampflow.serving.testing import raw_tensor_proto

    def predict(dims=(1, 8, 8, 1), dtype=types_pb2.DT_FLOAT, key="images", name=MODEL,
                signature="", **values):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = name
        if signature:
            request.model_spec.signature_name = signature
        request.inputs[key].CopyFrom(raw_tensor_proto(dims, dtype, **values))
        return request

    one_image = np.zeros((1, 8, 8, 1), np.float32).tobytes()
    cases: list[tuple[str, str, object]] = [
        ("52-byte request declaring [4000000,8,8,1], one float_val", "Predict",
         predict((4_000_000, 8, 8, 1), float_val=[1.0])),
        ("wrong rank, huge shape [50000000,1]", "Predict", predict((50_000_000, 1),
                                                                   float_val=[1.0])),
        ("dims whose product overflows int64 to 64", "Predict",
         predict((2 ** 62 + 1, 8, 8, 1), float_val=[1.0])),
        ("dims over 2**63 elements", "Predict", predict((2 ** 62, 2 ** 62, 8, 1),
                                                        float_val=[1.0])),
        ("negative dimension", "Predict", predict((-1, 8, 8, 1), float_val=[1.0])),
        ("rank 300", "Predict", predict((1,) * 300, float_val=[1.0])),
        ("batch 100000 within the byte limit (one value)", "Predict",
         predict((100_000, 8, 8, 1), float_val=[1.0])),
        ("batch over the cap with full data", "Predict",
         predict((2000, 8, 8, 1), tensor_content=b"\0" * (2000 * 256))),
        ("tensor_content shorter than the shape", "Predict",
         predict((10, 8, 8, 1), tensor_content=b"\0" * 4)),
        ("string tensor declared [3000000] with one value", "Predict",
         predict((3_000_000,), types_pb2.DT_STRING, "inputs", signature="classify",
                 string_val=[b"x"])),
        ("wrong dtype (int32)", "Predict", predict(dtype=types_pb2.DT_INT32, int_val=[1])),
        ("unsupported dtype (complex64)", "Predict", predict(dtype=types_pb2.DT_COMPLEX64)),
        ("too many values", "Predict", predict((1, 1, 1, 1), float_val=[1.0, 2.0])),
        ("batch 0", "Predict", predict((0, 8, 8, 1))),
        ("unknown input name", "Predict", predict(key="pixels", tensor_content=one_image)),
        ("empty model name", "Predict", predict(name="", tensor_content=one_image)),
        ("100 KB model name", "Predict", predict(name="m" * 100_000, tensor_content=one_image)),
        ("unknown signature", "Predict", predict(signature="nope", tensor_content=one_image)),
        ("no model_spec", "Predict", predict_pb2.PredictRequest()),
    ]
    many = predict_pb2.PredictRequest()
    many.model_spec.name = MODEL
    for i in range(2001):
        many.inputs[f"input_{i:05d}_" + "x" * 40].dtype = types_pb2.DT_FLOAT
    cases.append(("2001 input names", "Predict", many))
    label = predict(tensor_content=one_image)
    label.model_spec.version_label = "l" * 50_000
    cases.append(("50 KB version label", "Predict", label))
    version = predict(tensor_content=one_image)
    version.model_spec.version.value = 2 ** 63 - 1
    cases.append(("version 2**63-1", "Predict", version))
    flood = classification_pb2.ClassificationRequest()
    flood.model_spec.name = MODEL
    flood.model_spec.signature_name = "classify"
    ctx = flood.input.example_list_with_context.context
    ctx.features.feature["pad"].float_list.value.extend([0.5] * 250_000)
    for _ in range(100):
        flood.input.example_list_with_context.examples.add()
    cases.append(("Classify: 1 MB context x 100 examples", "Classify", flood))
    empty = classification_pb2.ClassificationRequest()
    empty.model_spec.name = MODEL
    empty.model_spec.signature_name = "classify"
    cases.append(("Classify: no examples", "Classify", empty))
    wrong_sig = classification_pb2.ClassificationRequest()
    wrong_sig.model_spec.name = MODEL
    wrong_sig.input.example_list.examples.add()
    cases.append(("Classify on the predict signature", "Classify", wrong_sig))
    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = MODEL
    meta.metadata_field.append("x" * 10_000)
    cases.append(("metadata field 10 KB", "GetModelMetadata", meta))
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "nope"
    cases.append(("status of an unknown model", "GetModelStatus", status))
    raw = [(name, method, request.SerializeToString()) for name, method, request in cases]
    raw.append(("6 bytes that do not parse", "Predict", b"\x0a\xc8\x01\x00\x01\x02"))
    raw.append(("random bytes", "Predict", random.Random(0).randbytes(512)))
    return raw


_PATHS = {"Predict": "/tensorflow.serving.PredictionService/Predict",
          "Classify": "/tensorflow.serving.PredictionService/Classify",
          "GetModelMetadata": "/tensorflow.serving.PredictionService/GetModelMetadata",
          "GetModelStatus": "/tensorflow.serving.ModelService/GetModelStatus"}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four random byte edits: flip, overwrite, insert, delete, truncate, duplicate."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        i = rng.randrange(len(data)) if data else 0
        if kind == 0 and data:
            data[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            data[i] = rng.randrange(256)
        elif kind == 2:
            data[i:i] = bytes([rng.randrange(256)])
        elif kind == 3 and data:
            del data[i]
        elif kind == 4:
            data = data[:i]
        else:
            j = rng.randrange(len(data) + 1)
            data[j:j] = data[i:i + rng.randint(1, 16)]
    return bytes(data)


def seed_requests() -> list[tuple[str, bytes]]:
    """Valid requests of each method, the starting points of the mutations."""
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        predict_pb2,
    )

    from ampflow.serving.model_format import image_example

    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = MODEL
    predict.inputs["images"].CopyFrom(tf.make_tensor_proto(np.ones((2, 8, 8, 1), np.float32)))
    typed = predict_pb2.PredictRequest()
    typed.model_spec.name = MODEL
    typed.inputs["images"].float_val.extend([1.0, 2.0])
    typed.inputs["images"].dtype = 1
    for d in (2, 8, 8, 1):
        typed.inputs["images"].tensor_shape.dim.add().size = d
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = MODEL
    classify.model_spec.signature_name = "classify"
    classify.input.example_list.examples.append(image_example(np.ones((8, 8, 1))))
    meta = get_model_metadata_pb2.GetModelMetadataRequest()
    meta.model_spec.name = MODEL
    meta.metadata_field.append("signature_def")
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = MODEL
    return [("Predict", predict.SerializeToString()), ("Predict", typed.SerializeToString()),
            ("Classify", classify.SerializeToString()),
            ("GetModelMetadata", meta.SerializeToString()),
            ("GetModelStatus", status.SerializeToString())]


def fuzz(address: str, mutated: int, seed: int = 0, server=None,
         desc: str | None = "fuzz") -> dict:
    """Send the hand-made requests and `mutated` byte-mutated ones; every answer is a code.

    With `desc`, the requests sent are shown as progress (`ampflow.progress`).
    """
    import grpc

    from ampflow.progress import Progress

    rng = random.Random(seed)
    rss_before = server.rss_mb if server else None
    table, codes = [], {}
    with grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]) as channel:
        calls = {m: channel.unary_unary(p) for m, p in _PATHS.items()}

        def send(method: str, data: bytes) -> tuple[str, str]:
            try:
                calls[method](data, timeout=30)
                return "OK", ""
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""

        for name, method, data in hand_made_requests():
            code, message = send(method, data)
            table.append({"request": name, "bytes": len(data), "code": code,
                          "message": message[:160]})
        seeds = seed_requests()
        with Progress(mutated, desc or "", unit="request", enabled=bool(desc)) as progress:
            for _ in range(mutated):
                method, data = rng.choice(seeds)
                code, _message = send(method, mutate(data, rng))
                codes[code] = codes.get(code, 0) + 1
                progress.update(values=lambda: {"codes": _codes_text(codes)})
        good_method, good = seeds[0]
        alive_code, _ = send(good_method, good)
    return {"hand_made": table, "mutated": mutated, "mutated_codes": codes,
            "good_request_after": alive_code,
            "rss_mb_before": rss_before, "rss_mb_after": server.rss_mb if server else None,
            "server_alive": server.alive() if server else None}


def fuzz_with_server(workdir: Path, mutated: int, seed: int = 0) -> dict:
    """Fuzz a fresh `ampflow serve` process (warmed up first so RSS is comparable)."""
    from ampflow.serving.testing import ServeProcess, install_version, write_model_version

    store, base = workdir / "fuzz-store", workdir / "fuzz-serving" / MODEL
    write_model_version(store, 1, model_name=MODEL)
    install_version(store, base, 1)
    server = ServeProcess(MODEL, base, workdir / "fuzz-server.log", "--grace-s", "2",
                          stop_timeout_s=30)
    try:
        # warm-up: first-use allocations are not growth
        fuzz(server.address, 200, seed + 1, desc=None)
        return fuzz(server.address, mutated, seed, server)
    finally:
        server.stop()


def _codes_text(codes: dict[str, int]) -> str:
    return " ".join(f"{code} {n}" for code, n in sorted(codes.items(), key=lambda kv: -kv[1]))
