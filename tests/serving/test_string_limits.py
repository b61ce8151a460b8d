"""The operator's string limits (`--max-string-bytes`, `--max-strings-per-request`), in the
fast tier (issue 46 item 7: they were covered only by test_serving_text.py, which is slow).

Every decoding path declares a request's strings its own way (TF Serving's gRPC `string_val`,
its REST JSON strings and `{"b64"}`, V2's gRPC `bytes_contents` and raw length-prefixed BYTES,
V2's REST JSON `data` and binary data, Classify's serialized tf.Examples), so each is driven
here through its own adapter, over one `InferenceCore` with small limits: a request AT each
limit answers, and the model saw every byte of it (it returns each string's length); one byte
or one string more is refused with the protocol's INVALID_ARGUMENT (HTTP 400) naming the flag.
A limit checked with `>=` for `>`, or not at all, fails one of these.

The model is a real SavedModel of two tf.functions (string -> its length), saved in about a
second; no server is started, except in the one test that checks `ServerConfig`'s limits reach
the core of a running (in-process) server.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct

import grpc
import numpy as np
import pytest
from serving_helpers import running_server
from tensorflow_serving.apis import classification_pb2, predict_pb2

from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.core.inference import InferenceCore, ReloadPolicy, RequestLimits
from ampflow.serving.models.registry import ModelRegistry
from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb
from ampflow.serving.protocols.tf_serving import TFServingProtocol
from ampflow.serving.protocols.tf_serving_rest import TFServingRestHandler
from ampflow.serving.protocols.v2 import V2Protocol
from ampflow.serving.protocols.v2_grpc import V2Servicer
from ampflow.serving.protocols.v2_rest import HEADER_LENGTH, V2RestHandler
from ampflow.serving.status import ServingStatusError

MODEL = "lengths"
STRING_LIMIT = 64  # bytes per string (--max-string-bytes)
STRINGS_LIMIT = 4  # strings per request (--max-strings-per-request)
AT_LIMIT = ("\u00e9" * (STRING_LIMIT // 2)).encode()  # 64 bytes, 32 characters: bytes count
# JSON's sizes are read two ways: an ASCII string's length, else its UTF-8 (json_tensor, v2)
TEXTS_AT_LIMIT = {"utf8": AT_LIMIT, "ascii": b"x" * STRING_LIMIT}
BYTES_FLAG, STRINGS_FLAG = "(--max-string-bytes)", "(--max-strings-per-request)"


def _write_model(path) -> None:
    """`serving_default`: text [-1] -> lengths; `pair`: a, b -> lengths of each; `classify`."""
    import tensorflow as tf

    from ampflow.serving.model_format import (
        CLASSIFY_METHOD,
        CLASSIFY_SIGNATURE,
        DEFAULT_SIGNATURE,
        set_method_name,
    )

    def lengths(text):
        return tf.strings.length(text, unit="BYTE")

    serve = tf.function(lambda text: {"lengths": lengths(text)},
                        input_signature=[tf.TensorSpec([None], tf.string, "text")])
    pair = tf.function(lambda a, b: {"a": lengths(a), "b": lengths(b)},
                       input_signature=[tf.TensorSpec([None], tf.string, "a"),
                                        tf.TensorSpec([None], tf.string, "b")])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, "inputs")])
    def classify(inputs):
        text = tf.io.parse_example(inputs, {"text": tf.io.FixedLenFeature([], tf.string)})["text"]
        scores = tf.cast(lengths(text), tf.float32)[:, None]
        return {"scores": scores, "classes": tf.fill(tf.shape(scores), "bytes")}

    tf.saved_model.save(tf.Module(), str(path), signatures={
        DEFAULT_SIGNATURE: serve, "pair": pair, CLASSIFY_SIGNATURE: classify})
    set_method_name(path, CLASSIFY_SIGNATURE, CLASSIFY_METHOD)


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    base = tmp_path_factory.mktemp("string_limits") / MODEL
    _write_model(base / "1")
    return base


@pytest.fixture(scope="module")
def core(base_path):
    """The data plane with the limits, as `start_local_server` builds it (no batching)."""
    registry = ModelRegistry((ModelConfig(MODEL, base_path),), settle_s=0.0)
    registry.start(0)
    yield InferenceCore(registry, limits=RequestLimits(max_string_bytes=STRING_LIMIT,
                                                       max_strings=STRINGS_LIMIT))
    registry.stop()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a request got: "OK" and the lengths the model saw, or the refusal's code and text.

    `code`: "OK", a gRPC status code's name, or "HTTP <status>" for REST.
    """

    code: str
    lengths: tuple[int, ...] = ()
    error: str = ""


class _NoDeadline:
    """A gRPC call's context as the servicer reads it, for a client that set no deadline."""

    @staticmethod
    def time_remaining() -> None:
        return None


def _grpc(call) -> Outcome:
    try:
        return Outcome("OK", tuple(int(n) for n in call()))
    except ServingStatusError as e:
        return Outcome(e.code.name, error=e.message)


def _rest(status: int, body: bytes, read) -> Outcome:
    doc = json.loads(body)
    if status != 200:
        return Outcome(f"HTTP {status}", error=doc["error"])
    return Outcome("OK", tuple(read(doc)))


# ---- one sender per decoding path: texts (bytes) in, Outcome out ------------------------------

def _tf_grpc(core, texts: list[bytes]) -> Outcome:
    import tensorflow as tf

    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts, tf.string, [len(texts)]))
    return _grpc(lambda: tf.make_ndarray(
        TFServingProtocol(core).predict(request).outputs["lengths"]))


def _tf_rest(core, payload: dict) -> Outcome:
    status, body, _ = TFServingRestHandler(TFServingProtocol(core)).handle(
        "POST", f"/v1/models/{MODEL}:predict", {}, json.dumps(payload).encode())
    return _rest(status, body, lambda doc: doc.get("predictions", doc.get("outputs")))


def _tf_rest_instances(core, texts: list[bytes]) -> Outcome:
    """JSON strings: the limit counts their UTF-8 bytes, not their characters."""
    return _tf_rest(core, {"instances": [t.decode() for t in texts]})


def _tf_rest_b64(core, texts: list[bytes]) -> Outcome:
    """Columnar `inputs` of `{"b64"}`: the limit counts the decoded bytes."""
    return _tf_rest(core, {"inputs": {"text": [
        {"b64": base64.b64encode(t).decode()} for t in texts]}})


def _v2_grpc(core, texts: list[bytes], raw: bool) -> Outcome:
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    if raw:
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    else:
        tensor.contents.bytes_contents.extend(texts)
    servicer = V2Servicer(V2Protocol(core))

    def lengths():
        response = servicer.model_infer(request, _NoDeadline())
        (output,) = response.raw_output_contents
        return np.frombuffer(output, "<i4")

    return _grpc(lengths)


def _v2_rest(core, texts: list[bytes], binary: bool) -> Outcome:
    item = {"name": "text", "datatype": "BYTES", "shape": [len(texts)]}
    tail = b"".join(struct.pack("<I", len(t)) + t for t in texts) if binary else b""
    if binary:
        item["parameters"] = {"binary_data_size": len(tail)}
    else:
        item["data"] = [t.decode() for t in texts]
    head = json.dumps({"inputs": [item]}).encode()
    status, body, _ = V2RestHandler(V2Protocol(core)).handle(
        "POST", f"/v2/models/{MODEL}/infer", {HEADER_LENGTH: str(len(head))}, head + tail)
    return _rest(status, body, lambda doc: doc["outputs"][0]["data"])


SENDERS = {
    "tf-grpc-string_val": _tf_grpc,
    "tf-rest-instances-utf8": _tf_rest_instances,
    "tf-rest-inputs-b64": _tf_rest_b64,
    "v2-grpc-bytes_contents": lambda core, texts: _v2_grpc(core, texts, raw=False),
    "v2-grpc-raw": lambda core, texts: _v2_grpc(core, texts, raw=True),
    "v2-rest-data": lambda core, texts: _v2_rest(core, texts, binary=False),
    "v2-rest-binary": lambda core, texts: _v2_rest(core, texts, binary=True),
}


def _refused(outcome: Outcome, path: str, flag: str) -> None:
    """INVALID_ARGUMENT over gRPC, 400 over REST, in a message naming the operator's flag."""
    assert outcome.code == ("HTTP 400" if "-rest-" in path else "INVALID_ARGUMENT"), outcome
    assert flag in outcome.error, outcome


@pytest.mark.parametrize("text", TEXTS_AT_LIMIT)
@pytest.mark.parametrize("path", SENDERS)
def test_a_string_at_the_byte_limit_answers_and_one_byte_more_is_refused(core, path, text):
    send, at_limit = SENDERS[path], TEXTS_AT_LIMIT[text]
    assert send(core, [b"ok", at_limit]) == Outcome("OK", (2, STRING_LIMIT))
    over = send(core, [b"ok", at_limit + b"!"])
    _refused(over, path, BYTES_FLAG)
    assert f"at most {STRING_LIMIT} bytes per string" in over.error
    assert f"{STRING_LIMIT + 1} bytes" in over.error  # what was received
    assert send(core, [b"after"]) == Outcome("OK", (5,))  # nothing left behind


@pytest.mark.parametrize("path", SENDERS)
def test_the_string_count_limit_answers_and_one_string_more_is_refused(core, path):
    send = SENDERS[path]
    texts = [b"x" * n for n in range(1, STRINGS_LIMIT + 2)]
    assert send(core, texts[:STRINGS_LIMIT]) == Outcome("OK", tuple(range(1, STRINGS_LIMIT + 1)))
    over = send(core, texts)
    _refused(over, path, STRINGS_FLAG)
    assert f"at most {STRINGS_LIMIT} per request" in over.error


def test_the_string_count_adds_up_every_string_input_of_a_request(core):
    """Two inputs of a signature: 3 + 1 strings answer, 2 + 3 are refused (3 alone pass)."""
    import tensorflow as tf

    def send(a: int, b: int) -> Outcome:
        request = predict_pb2.PredictRequest()
        request.model_spec.name, request.model_spec.signature_name = MODEL, "pair"
        for name, count in (("a", a), ("b", b)):
            request.inputs[name].CopyFrom(tf.make_tensor_proto([b"s"] * count, tf.string))
        return _grpc(lambda: [len(tf.make_ndarray(TFServingProtocol(core).predict(request)
                                                  .outputs[name])) for name in ("a", "b")])

    assert send(STRINGS_LIMIT - 1, 1) == Outcome("OK", (STRINGS_LIMIT - 1, 1))
    _refused(send(2, STRINGS_LIMIT - 1), "tf-grpc", STRINGS_FLAG)


# ---- Classify: each serialized tf.Example is one string ---------------------------------------

def _example_text(size: int) -> str:
    """The ASCII text whose tf.Example (one bytes feature, `text`) serializes to `size` bytes."""
    from tensorflow.core.example import example_pb2

    for n in range(size, 0, -1):
        example = example_pb2.Example()
        example.features.feature["text"].bytes_list.value.append(b"x" * n)
        if example.ByteSize() == size:
            return "x" * n
    raise AssertionError(f"no text makes a {size}-byte example")


def _classify(core, texts: list[str], context: dict | None = None, rest: bool = False) -> Outcome:
    if rest:
        doc: dict = {"signature_name": "classify", "examples": [{"text": t} for t in texts]}
        if context is not None:
            doc["context"] = context
        status, body, _ = TFServingRestHandler(TFServingProtocol(core)).handle(
            "POST", f"/v1/models/{MODEL}:classify", {}, json.dumps(doc).encode())
        return _rest(status, body, lambda d: [int(row[0][1]) for row in d["results"]])
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = MODEL, "classify"
    if context is None:
        examples = request.input.example_list.examples
    else:
        examples = request.input.example_list_with_context.examples
        for key, value in context.items():
            request.input.example_list_with_context.context.features.feature[
                key].bytes_list.value.append(value.encode())
    for text in texts:
        examples.add().features.feature["text"].bytes_list.value.append(text.encode())
    return _grpc(lambda: [int(c.classes[0].score) for c in
                          TFServingProtocol(core).classify(request).result.classifications])


@pytest.mark.parametrize("rest", [False, True], ids=["grpc", "rest"])
def test_classify_takes_an_example_at_the_byte_limit_and_refuses_one_byte_more(core, rest):
    at_limit = _example_text(STRING_LIMIT)
    assert _classify(core, ["ok", at_limit], rest=rest) == Outcome("OK", (2, len(at_limit)))
    over = _classify(core, ["ok", at_limit + "x"], rest=rest)
    _refused(over, "-rest-" if rest else "grpc", BYTES_FLAG)
    assert f"is {STRING_LIMIT + 1} bytes" in over.error


@pytest.mark.parametrize("rest", [False, True], ids=["grpc", "rest"])
def test_classify_counts_the_context_merged_into_each_example(core, rest):
    """The context is copied into every example: its bytes count against each example's."""
    context = {"lang": "en"}
    from tensorflow.core.example import example_pb2

    merged_in = example_pb2.Example()
    merged_in.features.feature["lang"].bytes_list.value.append(b"en")
    room = STRING_LIMIT - merged_in.ByteSize()
    fits = _classify(core, [_example_text(room)], context, rest)
    assert fits == Outcome("OK", (len(_example_text(room)),))
    _refused(_classify(core, [_example_text(room + 1)], context, rest),
             "-rest-" if rest else "grpc", BYTES_FLAG)


@pytest.mark.parametrize("rest", [False, True], ids=["grpc", "rest"])
def test_classify_takes_the_limits_number_of_examples_and_refuses_one_more(core, rest):
    texts = ["x" * n for n in range(1, STRINGS_LIMIT + 2)]
    assert _classify(core, texts[:STRINGS_LIMIT], rest=rest) == Outcome(
        "OK", tuple(range(1, STRINGS_LIMIT + 1)))
    _refused(_classify(core, texts, rest=rest), "-rest-" if rest else "grpc", STRINGS_FLAG)


# ---- the server's flags reach its core -------------------------------------------------------

def test_request_limits_and_reload_policy_are_built_by_keyword_only():
    # four ints in a row (bytes, rows, string bytes, strings) are one swap away from a wrong
    # limit that no type checker sees: the limits take each by its name
    with pytest.raises(TypeError):
        RequestLimits(64, 0, 0, 0)
    with pytest.raises(TypeError):
        ReloadPolicy(True, ())
    assert RequestLimits(max_rows=3).max_rows == 3



def test_a_running_servers_flags_are_the_limits_its_core_checks(base_path):
    """`ServerConfig` -> `RequestLimits` in start_local_server (in process, gRPC on loopback)."""
    from ampflow.serving.client import PredictionClient, RpcError

    config = ServerConfig(models=(ModelConfig(MODEL, base_path),), host="127.0.0.1", port=0,
                          max_string_bytes=STRING_LIMIT, max_strings_per_request=STRINGS_LIMIT,
                          enable_warmup=False, grace_s=0.5)
    with running_server(config) as server, PredictionClient(server.address, timeout_s=30,
                                                            retries=0) as client:
        assert client.predict(MODEL, [AT_LIMIT] * STRINGS_LIMIT).outputs["lengths"].tolist() \
            == [STRING_LIMIT] * STRINGS_LIMIT
        for texts, flag in (([AT_LIMIT + b"!"], BYTES_FLAG), ([b"x"] * (STRINGS_LIMIT + 1),
                                                               STRINGS_FLAG)):
            with pytest.raises(RpcError) as refused:
                client.predict(MODEL, texts)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert flag in refused.value.details
