"""The encoded-image signature served: files over gRPC and REST (`{"b64"}`) answer as the
`images` signature does on the same decoded pixels; corrupt files, decode bombs and oversized
string tensors are refused cleanly and the server stays up; `ampflow predict FILE` uses it.

The model is a real export of the session's trained digits model (tests/serving/conftest.py).
"""

from __future__ import annotations

import base64
import functools
import io
import json
import struct
import threading
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
from serving_helpers import free_port, local_only, running_server

from ampflow.serving.client import PredictionClient, RpcError, as_array
from ampflow.serving.config import BatchingConfig, ModelConfig, ServerConfig
from ampflow.serving.model_format import IMAGE_BYTES_SIGNATURE, MAX_IMAGE_PIXELS
from ampflow.serving.rest_client import RestClient
from ampflow.serving.testing import ServeProcess, raw_tensor_proto

pytestmark = [pytest.mark.serving, pytest.mark.slow, local_only, pytest.mark.timeout(300)]

LIMIT = 1024 * 1024  # --max-message-bytes of the in-process server
BATCH = 16  # --max-batch-size: also the rows one request may carry
SHAPE = (8, 8, 1)


# ---- files ----------------------------------------------------------------------------------

def encode(image: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, fmt)
    return buffer.getvalue()


@functools.cache
def png_bomb(side: int) -> bytes:
    """A real, valid grayscale PNG of side x side zeros: ~1000x smaller than its pixels.

    Its zlib stream is one compressed MiB of zeros repeated: each copy ends in a full flush (no
    back-references across it), so the copies decode as one stream; the checksum of n zero
    bytes is ((n mod 65521) << 16) + 1. Compressing the 400 MB itself took 2.5 CPU-s.
    """
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    size, block = (side + 1) * side, 1 << 20  # a filter byte, then the row
    copies, rest = divmod(size, block)
    deflate = zlib.compressobj(9)
    first = deflate.compress(bytes(block)) + deflate.flush(zlib.Z_FULL_FLUSH)  # + zlib header
    again = deflate.compress(bytes(block)) + deflate.flush(zlib.Z_FULL_FLUSH)
    last = (deflate.compress(bytes(rest)) + deflate.flush())[:-4]  # without its checksum
    rows = (first + again * (copies - 1) + last if copies else zlib.compress(bytes(size), 9)[:-4])
    rows += struct.pack(">I", ((size % 65521) << 16) + 1)
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows)
            + chunk(b"IEND", b""))


def gif_bomb(frames: int, side: int) -> bytes:
    """An animated GIF of `frames` flat side x side frames: TensorFlow reads every frame.

    One frame encoded, its image block repeated (encoding all of them took 2.4 CPU-s).
    """
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (side, side), 37).save(buffer, "GIF")
    data = buffer.getvalue()
    start = _gif_block_after_tables(data)
    while data[start] == 0x21:  # extensions before the image (a graphic control one)
        start = _gif_sub_blocks_end(data, start + 2)
    assert data[start] == 0x2C, data[start]
    table = 3 << ((data[start + 9] & 7) + 1) if data[start + 9] & 0x80 else 0
    end = _gif_sub_blocks_end(data, start + 10 + table + 1)  # + the LZW code size
    assert data[end:] == b";", data[end:]
    return data[:end] + data[start:end] * (frames - 1) + b";"


def _gif_block_after_tables(data: bytes) -> int:
    """Where the first block after the header, screen descriptor and global table starts."""
    return 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)


def _gif_sub_blocks_end(data: bytes, pos: int) -> int:
    """Just past the data sub-blocks that start at `pos` (each a length byte, then data)."""
    while data[pos]:
        pos += data[pos] + 1
    return pos + 1


def model_input(encoded: bytes) -> np.ndarray:
    """The pixels training would make of `encoded`: the one home of that rule."""
    import tensorflow as tf

    from ampflow.data.images import decode_to_model_input

    return decode_to_model_input(tf.constant(encoded), SHAPE).numpy()


@pytest.fixture(scope="module")
def digits(prepared_digits) -> np.ndarray:
    from ampflow.data import load_arrays

    images, _ = load_arrays(prepared_digits, "test", limit=6)
    return images


# ---- the server -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(digits_export):
    config = ServerConfig(models=(ModelConfig(digits_export.model_name,
                                              digits_export.model_base),),
                          host="127.0.0.1", port=0, rest_api_port=free_port(),
                          max_message_bytes=LIMIT, grace_s=1.0,
                          batching=BatchingConfig(max_batch_size=BATCH, batch_timeout_ms=2.0))
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with PredictionClient(server.address, timeout_s=30, retries=0) as c:
        yield c


def rest_post(server, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://{server.rest_address}/v1/models/ampflow:predict",
        data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def b64(data: bytes) -> dict:
    return {"b64": base64.b64encode(data).decode()}


def assert_same_answer(got: dict, want: dict) -> None:
    np.testing.assert_allclose(np.asarray(got["probabilities"], np.float32),
                               np.asarray(want["probabilities"], np.float32), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(np.asarray(got["class_ids"]), np.asarray(want["class_ids"]))


# ---- answers --------------------------------------------------------------------------------

def test_image_bytes_grpc_png_equals_images_on_same_pixels(client, digits):
    pngs = [encode(image, "PNG") for image in digits]
    got = client.predict("ampflow", pngs, signature=IMAGE_BYTES_SIGNATURE)
    want = client.predict("ampflow", digits.astype(np.float32))
    assert got.signature == "image_bytes" and got.outputs["probabilities"].shape == (6, 10)
    assert_same_answer(got.outputs, want.outputs)


def test_image_bytes_grpc_jpeg_photo_equals_images_on_training_pixels(client):
    """A 40x30 RGB JPEG: made gray and resized on the server exactly as training does."""
    rng = np.random.default_rng(5)
    files = [encode(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8), fmt)
             for fmt in ("JPEG", "BMP", "GIF")]
    got = client.predict("ampflow", files, signature=IMAGE_BYTES_SIGNATURE)
    want = client.predict("ampflow", np.stack([model_input(f) for f in files]))
    assert_same_answer(got.outputs, want.outputs)


def test_image_bytes_rest_b64_row_and_columnar_equal_images(server, digits):
    pngs = [encode(image, "PNG") for image in digits[:3]]
    status, want = rest_post(server, {"inputs": digits[:3].astype(float).tolist()})
    assert status == 200, want
    want = want["outputs"]
    requests = [
        {"signature_name": "image_bytes", "instances": [b64(p) for p in pngs]},
        {"signature_name": "image_bytes", "instances": [{"image_bytes": b64(p)} for p in pngs]},
        {"signature_name": "image_bytes", "inputs": {"image_bytes": [b64(p) for p in pngs]}},
        {"signature_name": "image_bytes", "inputs": [b64(p) for p in pngs]},
    ]
    for payload in requests:
        status, answer = rest_post(server, payload)
        assert status == 200, (payload.keys(), answer)
        if "predictions" in answer:
            rows = answer["predictions"]
            answer = {k: [row[k] for row in rows] for k in ("probabilities", "class_ids")}
        else:
            answer = answer["outputs"]
        assert_same_answer(answer, want)


def test_image_bytes_rest_client_sends_b64(server, digits):
    pngs = [encode(image, "PNG") for image in digits[:2]]
    with RestClient(server.rest_address, timeout_s=30) as rest:
        got = rest.predict("ampflow", pngs, signature=IMAGE_BYTES_SIGNATURE)
        want = rest.predict("ampflow", digits[:2].astype(np.float32))
    assert_same_answer(got.outputs, want.outputs)


def test_as_array_keeps_trailing_nul_bytes():
    array = as_array([b"BM\0\0", b"x\0"])
    assert array.dtype == object and list(array) == [b"BM\0\0", b"x\0"]
    assert np.asarray([b"x\0"])[0] == b"x"  # what numpy alone would send: a byte lost


# ---- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [b"not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 30,
                                 b"\xff\xd8\xff\xe0 truncated", b""])
def test_image_bytes_corrupt_file_invalid_argument_400_server_stays_up(client, server, digits,
                                                                      bad):
    good = encode(digits[0], "PNG")
    with pytest.raises(RpcError) as excinfo:
        client.predict("ampflow", [good, bad], signature=IMAGE_BYTES_SIGNATURE)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
    details = excinfo.value.details
    assert details.startswith("InvalidArgumentError: ") and "/" + "tmp" not in details
    assert "Detected at node" not in details and "stack traces" not in details  # no TF trace
    status, answer = rest_post(server, {"signature_name": "image_bytes",
                                        "instances": [b64(good), b64(bad)]})
    assert status == 400 and answer["error"], answer
    alive = client.predict("ampflow", [good], signature=IMAGE_BYTES_SIGNATURE)
    assert alive.outputs["class_ids"].shape == (1,)


def test_image_bytes_invalid_base64_is_400(server):
    status, answer = rest_post(server, {"signature_name": "image_bytes",
                                        "instances": [{"b64": "@@not base64@@"}]})
    assert status == 400 and "base64" in answer["error"]


def test_image_bytes_header_bomb_refused_naming_the_bound(client):
    with pytest.raises(RpcError) as excinfo:
        client.predict("ampflow", [png_bomb(20_000)], signature=IMAGE_BYTES_SIGNATURE)
    assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_IMAGE_PIXELS} pixels" in excinfo.value.details
    assert "[20000] [x] [20000]" in excinfo.value.details


def test_image_bytes_string_payload_counts_against_the_byte_limit(client):
    """One 100 KB string repeated over 16 rows (TF fills a short string_val with the last
    value) would be 1.6 MB inside the model: refused before decoding, the message is tiny."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ampflow"
    request.model_spec.signature_name = IMAGE_BYTES_SIGNATURE
    request.inputs["image_bytes"].CopyFrom(
        raw_tensor_proto([BATCH], types_pb2.DT_STRING, string_val=[b"\x89PNG" + b"\0" * 100_000]))
    assert request.ByteSize() < LIMIT / 10
    with pytest.raises(grpc.RpcError) as excinfo:
        client._predict.Predict(request, timeout=30)
    assert excinfo.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-message-bytes" in excinfo.value.details()


def test_image_bytes_corrupt_file_fails_alone_in_a_merged_batch(digits_export, digits):
    """Server-side batching merges two requests; the corrupt one must not fail the good one."""
    from ampflow.serving.core.batching import Batcher
    from ampflow.serving.models.servable import SavedModelServable

    servable = SavedModelServable("ampflow", digits_export.version, digits_export.version_dir)
    merged = []
    # full at the two requests' two rows: the batch runs when both are in, however late the
    # second thread starts on a loaded host (a 1 s window before), and no sooner
    batcher = Batcher(BatchingConfig(max_batch_size=2, batch_timeout_ms=10_000),  # the most
                      observe=lambda requests, rows: merged.append(requests))
    good = {"image_bytes": as_array([encode(digits[0], "PNG")])}
    bad = {"image_bytes": as_array([b"garbage"])}
    results = {}

    def send(name, inputs):
        try:
            results[name] = batcher.run(servable, IMAGE_BYTES_SIGNATURE, inputs, 30)
        except Exception as e:  # noqa: BLE001 - the test inspects what each request got
            results[name] = e

    threads = [threading.Thread(target=send, args=item) for item in
               (("good", good), ("bad", bad))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    batcher.close()
    assert merged[0] == 2, merged  # the two did run as one batch first
    assert results["good"]["class_ids"].shape == (1,)
    assert "InvalidArgument" in type(results["bad"]).__name__


# ---- a decode bomb against a server process: refused without the memory ---------------------

def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_image_bytes_decode_bombs_refused_without_memory_blowup(digits_export, digits,
                                                                tmp_path):
    # What the bombs would cost decoded: 400 MB each (TensorFlow's own limits allow it).
    png, gif = png_bomb(20_000), gif_bomb(100, 2000)
    assert len(png) < 1 << 20 and len(gif) < 1 << 20
    with ServeProcess("ampflow", digits_export.model_base, tmp_path / "serve.log") as serve, \
            PredictionClient(serve.address, timeout_s=60, retries=0) as grpc_client:
        grpc_client.wait_until_available("ampflow", timeout=120)
        good = [encode(digits[0], "PNG")]
        grpc_client.predict("ampflow", good, signature=IMAGE_BYTES_SIGNATURE)  # warm
        before = _peak_rss_mb(serve.proc.pid)
        for bomb in (png, gif, png):
            with pytest.raises(RpcError) as excinfo:
                grpc_client.predict("ampflow", [bomb], signature=IMAGE_BYTES_SIGNATURE)
            assert excinfo.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert f"at most {MAX_IMAGE_PIXELS} pixels" in excinfo.value.details
        grown = _peak_rss_mb(serve.proc.pid) - before
        assert grown < 100, f"peak RSS grew by {grown:.0f} MB"
        assert serve.alive()
        answer = grpc_client.predict("ampflow", good, signature=IMAGE_BYTES_SIGNATURE)
        assert answer.outputs["class_ids"].shape == (1,)


# ---- ampflow predict FILE -------------------------------------------------------------------

def test_cli_predict_image_file_uses_image_bytes_over_grpc_and_rest(server, digits, tmp_path,
                                                                    capsys):
    from ampflow.serving.cli import main as serving_main

    png = tmp_path / "digit.png"
    png.write_bytes(encode(digits[0], "PNG"))
    grpc_port, rest_port = str(server.port), server.rest_address.rsplit(":", 1)[1]
    outputs = []
    for flags in (["--port", grpc_port], ["--rest", "--port", rest_port],
                  ["--port", grpc_port, "--signature", "serving_default"]):
        assert serving_main(["predict", *flags, "--top-k", "3", str(png)]) == 0
        outputs.append(capsys.readouterr().out.splitlines())
    (grpc_out, rest_out, pixels_out) = outputs
    assert grpc_out[0] == "model ampflow version 1 signature image_bytes"
    assert rest_out[0] == "model ampflow version 1 signature image_bytes"
    assert pixels_out[0] == "model ampflow version 1 signature serving_default"
    assert grpc_out[1].startswith(f"{png}: ")
    assert grpc_out[1] == rest_out[1] == pixels_out[1]  # same pixels, same answer


def test_cli_predict_npy_still_sends_pixels_and_image_bytes_refuses_it(server, digits,
                                                                       tmp_path, capsys):
    from ampflow.serving.cli import main as serving_main

    npy = tmp_path / "digit.npy"
    np.save(npy, digits[0].astype(np.float32))
    assert serving_main(["predict", "--port", str(server.port), str(npy)]) == 0
    assert "signature serving_default" in capsys.readouterr().out
    assert serving_main(["predict", "--port", str(server.port), "--signature", "image_bytes",
                         str(npy)]) == 2
    assert "must be an image file" in capsys.readouterr().err


def test_cli_predict_image_file_without_image_bytes_sends_pixels(model_store, tmp_path,
                                                                 start_server, capsys):
    """A model with no image_bytes signature (the serving tests' tiny contract model): the file
    is decoded here and sent to serving_default, as before."""
    from ampflow.serving.cli import main as serving_main
    from ampflow.serving.testing import install_version, sample_images

    base = tmp_path / "ampflow"
    install_version(model_store, base, 1)
    server = start_server(base)
    png = tmp_path / "digit.png"
    png.write_bytes(encode(sample_images(1, seed=4)[0].astype(np.uint8), "PNG"))
    assert serving_main(["predict", "--port", str(server.port), str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "model ampflow version 1 signature serving_default"
    assert out[1].startswith(f"{png}: ")


def test_client_pixels_to_image_bytes_is_config_error_naming_the_fix(client, digits):
    from ampflow.errors import ConfigError

    with pytest.raises(ConfigError, match=r"takes object.*read_encoded_images"):
        client.predict("ampflow", digits.astype(np.float32), signature=IMAGE_BYTES_SIGNATURE)
