"""Run inside the V2 clients' venv (tritonclient[http,grpc] + kserve, no TensorFlow).

`python v2_clients_script.py GRPC_ADDR REST_ADDR MODEL IMAGES.npy triton|kserve` prints one
JSON object: each client's answers (outputs as lists) and each error case as
{"status", "message"}; the kserve run adds kserve's own descriptor of the `inference` proto.
tritonclient and kserve each register the `inference.*` messages in
protobuf's default pool, so one process can import only one of them: one run per SDK.
Only the clients' public APIs are used, except tritonclient's `_post` for the one request no
SDK can make (a body that is not JSON).
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np


def _error(fn) -> dict:
    try:
        fn()
    except Exception as e:  # each client's own exception type
        status = getattr(e, "status", None)
        status = status() if callable(status) else status
        if status is None and hasattr(e, "code"):
            status = str(e.code())
        if status is None and hasattr(e, "response"):
            status = str(e.response.status_code)
        message = getattr(e, "message", None)
        message = message() if callable(message) else message
        return {"status": str(status), "message": str(message or e)}
    return {"status": "OK", "message": ""}


def triton_http(address: str, model: str, images: np.ndarray) -> dict:
    import tritonclient.http as th

    client = th.InferenceServerClient(address)
    out = {"live": client.is_server_live(), "ready": client.is_server_ready(),
           "model_ready": client.is_model_ready(model),
           "unknown_ready": client.is_model_ready("nope"),
           "metadata": client.get_model_metadata(model)}

    def infer(x, binary=True, dtype="FP32", version="", name=model, outputs=None):
        tensor = th.InferInput("images", list(x.shape), dtype)
        tensor.set_data_from_numpy(x, binary_data=binary)
        return client.infer(name, [tensor], model_version=version, request_id="t-http",
                            outputs=outputs)

    result = infer(images)  # the client's defaults: binary inputs and outputs
    out["binary"] = {k: result.as_numpy(k).tolist() for k in ("probabilities", "class_ids")}
    out["binary_id"] = result.get_response()["id"]
    result = infer(images, binary=False,
                   outputs=[th.InferRequestedOutput("probabilities", binary_data=False)])
    out["json"] = {"probabilities": result.as_numpy("probabilities").tolist(),
                   "outputs": [o["name"] for o in result.get_response()["outputs"]]}
    out["v1"] = infer(images, version="1").as_numpy("probabilities").tolist()
    out["errors"] = {
        "unknown_model": _error(lambda: infer(images, name="nope")),
        "unknown_version": _error(lambda: infer(images, version="9")),
        "wrong_datatype": _error(lambda: infer(images.astype(np.float64), dtype="FP64")),
        "wrong_shape": _error(lambda: infer(images[:, :, :, 0])),
        "oversize": _error(lambda: infer(np.zeros((5000, 8, 8, 1), np.float32))),
        "bad_json": _error(lambda: _bad_json(client, model)),
    }
    client.close()
    return out


def _bad_json(client, model: str) -> None:
    from tritonclient.http._utils import _raise_if_error

    response = client._post(f"v2/models/{model}/infer", b"{not json", {}, None)
    _raise_if_error(response)


def triton_grpc(address: str, model: str, images: np.ndarray) -> dict:
    import tritonclient.grpc as tg

    client = tg.InferenceServerClient(address)
    meta = client.get_model_metadata(model, as_json=True)
    out = {"live": client.is_server_live(), "ready": client.is_server_ready(),
           "model_ready": client.is_model_ready(model),
           "unknown_ready": client.is_model_ready("nope"), "metadata": meta}

    def infer(x, dtype="FP32", version="", name=model):
        tensor = tg.InferInput("images", list(x.shape), dtype)
        tensor.set_data_from_numpy(x)
        return client.infer(name, [tensor], model_version=version, request_id="t-grpc")

    result = infer(images)
    out["raw"] = {k: result.as_numpy(k).tolist() for k in ("probabilities", "class_ids")}
    out["raw_id"] = result.get_response().id
    out["v1"] = infer(images, version="1").as_numpy("probabilities").tolist()
    out["errors"] = {
        "unknown_model": _error(lambda: infer(images, name="nope")),
        "unknown_version": _error(lambda: infer(images, version="9")),
        "wrong_datatype": _error(lambda: infer(images.astype(np.float64), dtype="FP64")),
        "wrong_shape": _error(lambda: infer(images[:, :, :, 0])),
        "oversize": _error(lambda: infer(np.zeros((5000, 8, 8, 1), np.float32))),
    }
    client.close()
    return out


async def kserve_clients(grpc_address: str, rest_address: str, model: str,
                         images: np.ndarray) -> dict:
    from kserve import (
        InferenceGRPCClient,
        InferenceRESTClient,
        InferInput,
        InferRequest,
        RESTConfig,
    )

    def request(x, binary, name=model, dtype="FP32"):
        tensor = InferInput("images", list(x.shape), dtype)
        tensor.set_data_from_numpy(x, binary_data=binary)
        return InferRequest(name, [tensor], request_id="k-1")

    async def error(coro) -> dict:
        try:
            await coro
        except Exception as e:
            response = getattr(e, "response", None)
            status = str(response.status_code) if response is not None else (
                str(e.code()) if hasattr(e, "code") else type(e).__name__)
            details = e.details() if hasattr(e, "details") else str(e)
            return {"status": status, "message": details}
        return {"status": "OK", "message": ""}

    def outputs(response) -> dict:
        return {o.name: o.as_numpy().tolist() for o in response.outputs}

    out: dict = {}
    base = f"http://{rest_address}"
    rest = InferenceRESTClient(RESTConfig(protocol="v2"))
    out["rest_live"] = await rest.is_server_live(base)
    out["rest_ready"] = await rest.is_server_ready(base)
    out["rest_model_ready"] = await rest.is_model_ready(base, model)
    for binary in (False, True):
        response = await rest.infer(base, request(images, binary), model_name=model)
        out[f"rest_{'binary' if binary else 'json'}"] = outputs(response)
        out[f"rest_{'binary' if binary else 'json'}_id"] = response.id
    out["rest_errors"] = {
        "unknown_model": await error(rest.infer(base, request(images, False, "nope"),
                                                model_name="nope")),
        "wrong_datatype": await error(rest.infer(
            base, request(images.astype(np.float64), False, dtype="FP64"), model_name=model)),
        "wrong_shape": await error(rest.infer(base, request(images[:, :, :, 0], False),
                                              model_name=model)),
    }
    await rest.close()
    grpc_client = InferenceGRPCClient(grpc_address)
    out["grpc_live"] = await grpc_client.is_server_live()
    out["grpc_model_ready"] = await grpc_client.is_model_ready(model)
    response = await grpc_client.infer(request(images, True))
    out["grpc"], out["grpc_id"] = outputs(response), response.id
    out["grpc_errors"] = {
        "unknown_model": await error(grpc_client.infer(request(images, True, "nope"))),
        "wrong_datatype": await error(grpc_client.infer(
            request(images.astype(np.float64), True, dtype="FP64"))),
    }
    await grpc_client.close()
    return out


def kserve_descriptor() -> str:
    """kserve's own `inference` FileDescriptorProto, base64 (the vendored proto's reference)."""
    import base64

    from google.protobuf import descriptor_pb2
    from kserve.protocol.grpc import grpc_predict_v2_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    grpc_predict_v2_pb2.DESCRIPTOR.CopyToProto(proto)
    return base64.b64encode(proto.SerializeToString()).decode("ascii")


def main() -> None:
    """Print every client's answers as one JSON object."""
    grpc_address, rest_address, model, images_path, sdk = sys.argv[1:6]
    images = np.load(images_path)
    if sdk == "triton":
        result = {"triton_http": triton_http(rest_address, model, images),
                  "triton_grpc": triton_grpc(grpc_address, model, images)}
    else:
        result = {"kserve": asyncio.run(kserve_clients(grpc_address, rest_address, model,
                                                       images)),
                  "kserve_descriptor": kserve_descriptor()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
