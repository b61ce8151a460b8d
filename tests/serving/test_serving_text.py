"""Raw text served (issue 39 point 5): a text SavedModel over TF Serving's gRPC (`string_val`) and
REST (`instances`/`inputs` of JSON strings, `{"b64"}`), KServe V2's gRPC (`bytes_contents`, raw
length-prefixed BYTES) and REST (JSON strings, binary data) answer the class the model gives in
process; the operator's string limits (`--max-string-bytes`, `--max-strings-per-request`) refuse
10 MB of text and too many texts with each protocol's code before any tensor is built, and the
next request answers; text that is not UTF-8 is served as the bytes it is. `ampflow predict
--text/--text-file` and `ampflow-client predict --text` print the model's class names.

The model is a real text export: Keras TextVectorization fitted on keyword sentences, Embedding +
pooling + Dense softmax trained for a few seconds, written by the exporter's own
`save_text_servable` (serving_default takes `text` string [-1], classify a tf.Example `text`).
One in-process server for the module.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from serving_helpers import free_port, running_server
from v2_test_helpers import v2_stub

from ampflow.serving.client import PredictionClient, RpcError
from ampflow.serving.config import ModelConfig, ServerConfig
from ampflow.serving.protocols import grpc_predict_v2_pb2 as pb
from ampflow.serving.rest_client import RestClient

pytestmark = [pytest.mark.serving, pytest.mark.slow, pytest.mark.timeout(300)]

MODEL = "reviews"
IMAGE_MODEL = "digits"  # the contract image model beside it: a model that takes no text
SEQ = 12
CLASSES = ("gloomy", "happy", "weird")
KEYWORDS = {"gloomy": ("awful", "dreadful", "dull"), "happy": ("great", "superb", "wonderful"),
            "weird": ("odd", "strange", "surreal")}
FILLER = ("the", "film", "was", "a", "story", "about", "people", "in", "this", "city")
STRING_LIMIT = 4096  # --max-string-bytes of the module's server
STRINGS_LIMIT = 8  # --max-strings-per-request
SENTENCES = ["A great film about this city", "odd, strange people", "The story was dull.",
             "Un film \u00e9trange et surreal", "wonderful"]
BIG_TEXT = "word " * (2 * 1024 * 1024)  # 10 MB of text in one string
SERVE_HOW_TO = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "serve-and-query.md"
# The how-to's REST Classify of a text model: curl's body, run here as written.
DOCUMENTED_CLASSIFY = re.compile(rf"curl -s localhost:8501/v1/models/{MODEL}:classify -d '(.+)'")


def _training_texts() -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(0)
    texts, labels = [], []
    for label, name in enumerate(CLASSES):
        for _ in range(30):
            words = list(rng.choice(FILLER, 5))
            words.insert(int(rng.integers(0, 6)), str(rng.choice(KEYWORDS[name])))
            texts.append(" ".join(words))
            labels.append(label)
    return texts, labels


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """(base path, in-process probabilities of SENTENCES): a trained text model, exported."""
    import keras
    import tensorflow as tf

    from ampflow.components.export_savedmodel.text_signatures import save_text_servable
    from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

    texts, labels = _training_texts()
    tokenizer = fit_tokenizer(texts, TokenizerConfig(max_sequence_length=SEQ,
                                                     vocabulary_size=100))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((SEQ,), dtype="int32"),
        keras.layers.Embedding(tokenizer.vocabulary_size, 8),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(len(CLASSES), activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(tokenizer.tokenize(tf.constant(texts)).numpy(), np.array(labels), epochs=40,
              batch_size=16, verbose=0)
    base = tmp_path_factory.mktemp("text_model") / MODEL
    save_text_servable(model, tokenizer, list(CLASSES), base / "1")
    in_process = model(tokenizer.tokenize(tf.constant(SENTENCES)), training=False).numpy()
    return base, in_process


@pytest.fixture(scope="module")
def server(text_model):
    from ampflow.serving.testing import write_model_version

    base, _ = text_model
    images = base.parent / IMAGE_MODEL
    write_model_version(images, 1, model_name=IMAGE_MODEL, warmup=False)
    models = (ModelConfig(MODEL, base), ModelConfig(IMAGE_MODEL, images))
    config = ServerConfig(models=models, host="127.0.0.1", port=0,
                          rest_api_port=free_port(), max_message_bytes=32 * 1024 * 1024,
                          max_string_bytes=STRING_LIMIT, max_strings_per_request=STRINGS_LIMIT,
                          enable_warmup=False, grace_s=1.0)
    with running_server(config) as running:
        yield running


@pytest.fixture(scope="module")
def expected(text_model) -> np.ndarray:
    """The class ids of SENTENCES in process; the test needs more than one class to mean much."""
    classes = np.argmax(text_model[1], axis=-1)
    assert len(set(classes.tolist())) >= 2, classes
    return classes


@pytest.fixture(scope="module")
def grpc_client(server):
    with PredictionClient(server.address, timeout_s=30, retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def rest_url(server) -> str:
    return f"http://{server.rest_address}"


@pytest.fixture(scope="module")
def v2_call(server):
    with grpc.insecure_channel(server.address, options=[
            ("grpc.max_send_message_length", 32 * 1024 * 1024)]) as channel:
        stub = v2_stub(channel, "ModelInfer")
        yield lambda request: stub(request, timeout=30)


def _post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _v2_bytes_request(texts: list[bytes], raw: bool) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    if raw:
        request.raw_input_contents.append(
            b"".join(struct.pack("<I", len(t)) + t for t in texts))
    else:
        tensor.contents.bytes_contents.extend(texts)
    return request


def _v2_classes(response) -> np.ndarray:
    names = [o.name for o in response.outputs]
    raw = response.raw_output_contents[names.index("class_ids")]
    return np.frombuffer(raw, "<i8")


# ---- the same class over every protocol -------------------------------------------------------

def test_raw_text_over_grpc_and_rest_gives_the_in_process_class(grpc_client, rest_url,
                                                                 text_model, expected):
    over_grpc = grpc_client.predict(MODEL, SENTENCES)
    np.testing.assert_array_equal(over_grpc.outputs["class_ids"], expected)
    np.testing.assert_allclose(over_grpc.outputs["probabilities"], text_model[1], atol=1e-5)
    with RestClient(rest_url.removeprefix("http://"), timeout_s=30) as rest:
        np.testing.assert_array_equal(rest.predict(MODEL, SENTENCES).outputs["class_ids"],
                                      expected)
    url = f"{rest_url}/v1/models/{MODEL}:predict"
    status, rows = _post(url, {"instances": SENTENCES})
    assert status == 200, rows
    assert [row["class_ids"] for row in rows["predictions"]] == expected.tolist()
    status, columns = _post(url, {"inputs": {"text": SENTENCES}})
    assert status == 200, columns
    assert columns["outputs"]["class_ids"] == expected.tolist()
    b64 = [{"b64": base64.b64encode(s.encode()).decode()} for s in SENTENCES]
    assert _post(url, {"instances": b64})[1] == rows  # the bytes of a text: the same text


def test_raw_text_over_v2_grpc_and_rest_gives_the_in_process_class(v2_call, rest_url, expected):
    encoded = [s.encode() for s in SENTENCES]
    for raw in (False, True):
        np.testing.assert_array_equal(_v2_classes(v2_call(_v2_bytes_request(encoded, raw))),
                                      expected)
    status, body = _post(f"{rest_url}/v2/models/{MODEL}/infer", {"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [len(SENTENCES)], "data": SENTENCES}]})
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    assert outputs["class_ids"] == expected.tolist()


def test_text_that_is_not_utf8_is_served_as_its_bytes(grpc_client, rest_url, v2_call):
    """A TF string is bytes: an undecodable run is one word the vocabulary lacks ([UNK]).

    The rest of the text classifies as usual, the same over every protocol that can carry
    bytes (REST as `{"b64"}`, V2 as bytes_contents).
    """
    text = b"\xff\xfe\xc3 a wonderful film"
    clean = grpc_client.predict(MODEL, ["a wonderful film"]).outputs["class_ids"]
    over_grpc = grpc_client.predict(MODEL, [text]).outputs["class_ids"]
    np.testing.assert_array_equal(over_grpc, clean)
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:predict",
                         {"instances": [{"b64": base64.b64encode(text).decode()}]})
    assert status == 200, body
    assert [row["class_ids"] for row in body["predictions"]] == clean.tolist()
    np.testing.assert_array_equal(_v2_classes(v2_call(_v2_bytes_request([text], False))), clean)
    # JSON cannot carry such bytes as a string; a lone surrogate escape is refused in words
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:predict",
                         {"instances": ["\ud800 wonderful"]})
    assert status == 400 and "lone surrogate" in body["error"], body


# ---- limits: refused with the protocol's error before any tensor, the server unharmed --------

def _answers(grpc_client) -> None:
    result = grpc_client.predict(MODEL, ["a great film"])
    assert result.outputs["class_ids"].shape == (1,)


def test_ten_megabytes_of_text_is_refused_by_every_protocol_and_the_next_request_answers(
        grpc_client, rest_url, v2_call):
    with pytest.raises(RpcError) as refused:
        grpc_client.predict(MODEL, ["a great film", BIG_TEXT])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{len(BIG_TEXT)} bytes" in refused.value.details
    assert f"at most {STRING_LIMIT} bytes per string (--max-string-bytes)" in \
        refused.value.details
    _answers(grpc_client)
    for payload in ({"instances": [BIG_TEXT]}, {"inputs": {"text": ["ok", BIG_TEXT]}}):
        status, body = _post(f"{rest_url}/v1/models/{MODEL}:predict", payload)
        assert status == 400 and "--max-string-bytes" in body["error"], (status, body)
        _answers(grpc_client)
    for raw in (False, True):
        with pytest.raises(grpc.RpcError) as v2_refused:
            v2_call(_v2_bytes_request([b"ok", BIG_TEXT.encode()], raw))
        assert v2_refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--max-string-bytes" in v2_refused.value.details()
        _answers(grpc_client)
    status, body = _post(f"{rest_url}/v2/models/{MODEL}/infer", {"inputs": [
        {"name": "text", "datatype": "BYTES", "shape": [1], "data": [BIG_TEXT]}]})
    assert status == 400 and "--max-string-bytes" in body["error"], (status, body)
    _answers(grpc_client)


def test_classify_takes_text_examples_within_the_string_limits(grpc_client, rest_url, expected):
    """Classify's strings are its serialized tf.Examples: a text example is bounded the same."""
    result = grpc_client.classify(MODEL, [{"text": s} for s in SENTENCES])
    top = [max(row, key=lambda pair: pair[1])[0] for row in result.classes]
    assert top == [CLASSES[c] for c in expected]
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:classify",
                         {"signature_name": "classify", "examples": [{"text": SENTENCES[0]}]})
    assert status == 200 and max(body["results"][0], key=lambda p: p[1])[0] == top[0], body
    with pytest.raises(RpcError) as refused:
        grpc_client.classify(MODEL, [{"text": BIG_TEXT}])
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-string-bytes" in refused.value.details
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:classify",
                         {"signature_name": "classify",
                          "examples": [{"text": "a great film"}] * (STRINGS_LIMIT + 1)})
    assert status == 400 and "--max-strings-per-request" in body["error"], body
    _answers(grpc_client)


def test_rest_classify_as_documented_answers_every_class_name_with_its_probability(rest_url):
    """REST :predict answers class ids; the documented :classify answers the names (issue 46)."""
    bodies = [json.loads(body) for body in DOCUMENTED_CLASSIFY.findall(SERVE_HOW_TO.read_text())]
    assert bodies, f"no `curl ... {MODEL}:classify -d '...'` in {SERVE_HOW_TO.name}"
    for body in bodies:
        status, answer = _post(f"{rest_url}/v1/models/{MODEL}:classify", body)
        assert status == 200, answer
        texts = [example["text"] for example in body["examples"]]
        status, predicted = _post(f"{rest_url}/v1/models/{MODEL}:predict", {"instances": texts})
        assert status == 200, predicted
        assert len(answer["results"]) == len(texts)
        for row, prediction in zip(answer["results"], predicted["predictions"], strict=True):
            assert [name for name, _ in row] == list(CLASSES)  # every name, in class-id order
            np.testing.assert_allclose([score for _, score in row],
                                       prediction["probabilities"], atol=1e-6)
            assert CLASSES[prediction["class_ids"]] == max(row, key=lambda pair: pair[1])[0]


def test_classify_on_the_default_signature_names_the_signature_that_classifies(grpc_client,
                                                                               rest_url):
    """As TF Serving, :classify without a signature name runs serving_default, a Predict one:
    refused, and the one line says which signature to name and how."""
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:classify",
                         {"examples": [{"text": "a great film"}]})
    assert status == 400, body
    assert "tensorflow/serving/classify" in body["error"]
    assert '"signature_name": "classify"' in body["error"], body
    with pytest.raises(RpcError) as refused:
        grpc_client.classify(MODEL, [{"text": "a great film"}], signature="serving_default")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "signature 'classify'" in refused.value.details, refused.value.details
    status, body = _post(f"{rest_url}/v1/models/{IMAGE_MODEL}:classify",
                         {"examples": [{"text": "a great film"}]})
    assert status == 400 and "tensorflow/serving/classify" in body["error"], body


def test_too_many_texts_are_refused_by_every_protocol(grpc_client, rest_url, v2_call):
    texts = ["a great film"] * (STRINGS_LIMIT + 1)
    with pytest.raises(RpcError) as refused:
        grpc_client.predict(MODEL, texts)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {STRINGS_LIMIT} per request (--max-strings-per-request)" in \
        refused.value.details
    status, body = _post(f"{rest_url}/v1/models/{MODEL}:predict", {"instances": texts})
    assert status == 400 and "--max-strings-per-request" in body["error"], body
    with pytest.raises(grpc.RpcError) as v2_refused:
        v2_call(_v2_bytes_request([t.encode() for t in texts], True))
    assert v2_refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(grpc_client.predict(MODEL, texts[:STRINGS_LIMIT]).outputs["class_ids"]) == \
        STRINGS_LIMIT


# ---- the clients ------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", ["grpc", "rest"])
def test_ampflow_predict_text_prints_class_names(server, protocol, tmp_path, capsys, expected):
    from ampflow.cli import main

    lines = tmp_path / "texts.txt"
    lines.write_bytes(("\n".join(SENTENCES[1:]) + "\n\n").encode())
    port = server.rest_port if protocol == "rest" else server.port
    code = main(["predict", "--protocol", protocol, "--port", str(port), "--model-name", MODEL,
                 "--top-k", "1", "--text", SENTENCES[0], "--text-file", str(lines)])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert out[0] == f"model {MODEL} version 1 signature serving_default"
    assert len(out) == 1 + len(SENTENCES)
    assert out[1].startswith(repr(SENTENCES[0]) + ": ")
    assert [_class_name(line) for line in out[1:]] == [CLASSES[c] for c in expected]


def _class_name(line: str) -> str:
    """The top class of a `predict` line: `'text': name (id) probability`."""
    return line.rsplit(": ", 1)[1].split(" (")[0]


def test_ampflow_client_predict_text_prints_class_names(server, capsys, expected):
    from ampflow_client.cli import main

    for rest in ([], ["--rest"]):
        port = server.rest_port if rest else server.port
        code = main(["predict", *rest, "--port", str(port), "--model-name", MODEL,
                     "--top-k", "1", *[a for s in SENTENCES for a in ("--text", s)]])
        out = capsys.readouterr().out.splitlines()
        assert code == 0, out
        assert [_class_name(line) for line in out[1:]] == [CLASSES[c] for c in expected]


@pytest.fixture(scope="module")
def png_file(tmp_path_factory) -> str:
    from PIL import Image

    path = tmp_path_factory.mktemp("png") / "digit.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(path)
    return str(path)


@pytest.mark.parametrize("model, argv, message", [
    (MODEL, ["--text", "x", "some.png"], "give image files or texts, not both"),
    (MODEL, ["--text-file", "/nonexistent/texts.txt"], "text-file must be a readable file"),
    (MODEL, [], "give image files, --text or --text-file"),
    (MODEL, ["PNG"], "takes texts (input 'text'), not files"),
    (IMAGE_MODEL, ["--text", "a great film"], "has no signature taking text"),
])
def test_ampflow_predict_text_bad_input_is_one_line(server, model, argv, message, png_file,
                                                     capsys):
    from ampflow.cli import main

    argv = [png_file if a == "PNG" else a for a in argv]
    code = main(["predict", "--port", str(server.port), "--model-name", model, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("model, argv, message", [
    (MODEL, ["PNG"], "takes texts (input 'text'), not files"),
    (IMAGE_MODEL, ["--text", "a great film"], "has no signature taking text"),
])
def test_ampflow_client_predict_text_bad_input_is_one_line(server, model, argv, message,
                                                            png_file, capsys):
    from ampflow_client.cli import main

    argv = [png_file if a == "PNG" else a for a in argv]
    code = main(["predict", "--port", str(server.port), "--model-name", model, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err


def test_ampflow_predict_text_never_imports_tensorflow(server, tmp_path):
    """A text query reads the signatures from the client's own protos, as an image query does."""
    import subprocess
    import sys

    texts = tmp_path / "texts.txt"
    texts.write_text("a great film\n")
    commands = [["predict", "--port", str(server.port), "--model-name", MODEL, "--text", "odd"],
                ["predict", "--protocol", "rest", "--port", str(server.rest_port),
                 "--model-name", MODEL, "--text-file", str(texts)]]
    code = ("import sys; from ampflow.cli import main\n"
            f"for argv in {commands!r}:\n"
            "    assert main(argv) == 0, argv\n"
            "print('tensorflow imported:', 'tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tensorflow imported: False" in done.stdout, done.stdout


# ---- each protocol declares its longest string before building; the core refuses on it ------

def test_every_protocol_declares_its_longest_string_without_building_it():
    from tensorflow.core.framework import types_pb2

    from ampflow.serving.protocols import json_tensor, tensors, v2
    from ampflow.serving.protocols.tf_serving import ProtoInput

    string = types_pb2.DT_STRING
    proto = tensors.tensor_pb2.TensorProto(dtype=string, string_val=[b"ab", b"x" * 100])
    proto.tensor_shape.dim.add().size = 2
    assert ProtoInput("text", proto).declare(string).longest == 100
    info = {"text": type("Info", (), {"dtype": string})()}
    (parsed,), _ = json_tensor.json_inputs({"instances": ["ab", "\u00e9" * 50]}, info)
    assert parsed.declare(string).longest == 100  # UTF-8 bytes, not characters
    b64 = {"b64": base64.b64encode(b"y" * 101).decode()}
    (parsed,), _ = json_tensor.json_inputs({"inputs": {"text": ["ab", b64]}}, info)
    assert parsed.declare(string).longest == 101
    raw = b"".join(struct.pack("<I", len(t)) + t for t in (b"ab", b"z" * 102))
    built = []
    item = v2.V2Input("text", "BYTES", (2,), len(raw), lambda *a: built.append(a),
                      lambda: v2.longest_raw_element(raw, 2))
    assert item.declare(string).longest_string() == 102
    assert v2.string_sizes(["ab", "\u00e9" * 50, b"xyz"]) == [2, 100, 3]
    assert not built


def test_the_core_refuses_an_oversized_string_before_building_any_array(server):
    from tensorflow.core.framework import types_pb2

    from ampflow.serving.core.inference import (
        Declared,
        InferenceCore,
        InferRequest,
        LazyInput,
        RequestLimits,
    )
    from ampflow.serving.status import ServingStatusError

    built = []
    core = InferenceCore(server.registry, limits=RequestLimits(max_string_bytes=STRING_LIMIT,
                                                               max_strings=STRINGS_LIMIT))
    for declared in (Declared(types_pb2.DT_STRING, (1,), 8 + STRING_LIMIT + 1, STRING_LIMIT + 1),
                     Declared(types_pb2.DT_STRING, (STRINGS_LIMIT + 1,), 8 * 9 + 9, 1)):
        item = LazyInput("text", declared, lambda: built.append(1))
        with pytest.raises(ServingStatusError) as refused:
            core.infer(InferRequest(MODEL, inputs=[item]))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert not built


@pytest.mark.parametrize("flag, value, message", [
    ("--max-string-bytes", "0", "max-string-bytes must be >= 1"),
    ("--max-strings-per-request", "-1", "max-strings-per-request must be >= 0"),
])
def test_serve_refuses_a_string_limit_that_cannot_be(tmp_path, flag, value, message, capsys):
    from ampflow.cli import main

    code = main(["serve", "--model-base-path", str(tmp_path), flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
