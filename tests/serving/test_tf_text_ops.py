"""SavedModels with TF Text ops (issue 49): served with the tf-text extra, refused in one line
without it.

The model is written by a fresh process that imported tensorflow_text (tf_serving_models.py);
`ampflow serve` runs in another process, which has not, so its load must register TF Text's
ops itself (serving/models/op_libraries.py). The refusal is the same server in a process where
`import tensorflow_text` fails. The messages and the op check run in this process, on
hand-written saved_model.pb files (no model built).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import free_port
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tf_serving_models import write_tf_text_regression

from ampflow.errors import ModelLoadError
from ampflow.serving.models.op_libraries import missing_ops_message, unregistered
from ampflow.serving.models.servable import load_servable

TEXTS = ["I like pie.", "I also  like cake!", ""]
MODEL = "tf_text"
TOKENIZE_OP = "TFText>WhitespaceTokenizeWithOffsetsV2"
BLOCKED = ("import sys; sys.modules['tensorflow_text'] = None; from ampflow.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


@pytest.fixture(scope="module")
def tf_text_model(tmp_path_factory):
    """(base path, what the model's `tokens` signature answers for TEXTS in its own process)."""
    base = tmp_path_factory.mktemp("tf_text") / MODEL
    expected = write_tf_text_regression(base / "1", TEXTS)
    return base, expected


def _serve(base, *, python_c: str | None = None, port: int = 0, rest_port: int = 0):
    start = ["-c", python_c] if python_c else ["-m", "ampflow.cli"]
    argv = [sys.executable, *start, "serve", "--server", "local", f"--port={port}",
            f"--model_name={MODEL}", f"--model_base_path={base}"]
    if rest_port:
        argv.append(f"--rest_api_port={rest_port}")
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _listening(proc: subprocess.Popen, timeout_s: float) -> tuple[str, list[str]]:
    """The address `ampflow serve` reports, and every line it printed until then."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"ampflow serve: listening on \S+:\d+", line):
                found.set()
        found.set()  # it exited: nothing more to wait for

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout_s)
    match = next((re.match(r"ampflow serve: listening on (\S+:\d+)", line) for line in lines
                  if line.startswith("ampflow serve: listening")), None)
    assert match, f"ampflow serve did not start (exit {proc.poll()}): {''.join(lines)[-3000:]}"
    return match.group(1), lines


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(400)
def test_serve_answers_a_tf_text_model_over_grpc_and_rest_as_the_model_does(tf_text_model):
    base, expected = tf_text_model
    rest_port = free_port()
    proc = _serve(base, port=free_port(), rest_port=rest_port)
    try:
        address, _ = _listening(proc, 240)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.model_spec.signature_name = "tokens"
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array(TEXTS, dtype=object)))
        with grpc.insecure_channel(address) as channel:
            reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                request, timeout=60)
        by_grpc = {name: tf.make_ndarray(reply.outputs[name]) for name in reply.outputs}
        body = json.dumps({"signature_name": "tokens", "inputs": {"text": TEXTS}}).encode()
        url = f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}:predict"
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=60) as r:
            by_rest = json.loads(r.read())["outputs"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert by_grpc["num_tokens"].tolist() == expected["num_tokens"] == [3, 4, 0]
    assert [[t.decode() for t in row] for row in by_grpc["tokens"]] == expected["tokens"]
    assert by_rest == expected


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(300)
def test_serve_without_tensorflow_text_refuses_the_version_in_one_line(tf_text_model):
    base, _ = tf_text_model
    proc = _serve(base, python_c=BLOCKED)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    # the log names the failed version as it fails; the exit line is serve's one error line
    refusals = [line for line in out.splitlines() if line.startswith("ampflow serve: error:")]
    assert len(refusals) == 1, out[-3000:]
    assert "did not become available" in refusals[0]
    assert f"Received: ['{TOKENIZE_OP}']; TF Text's ops need the tf-text extra: pip install " \
           "'ampflow[tf-text]'" in refusals[0]
    assert "did not import (ModuleNotFoundError: import of tensorflow_text halted" in refusals[0]


# ---- the op check and its line, in this process ---------------------------------------------

def _saved_model_using(folder, op_names) -> None:
    """A saved_model.pb whose `serve` graph lists `op_names` (and holds nothing else)."""
    saved_model = saved_model_pb2.SavedModel()
    meta_graph = saved_model.meta_graphs.add()
    meta_graph.meta_info_def.tags.append("serve")
    for name in op_names:
        meta_graph.meta_info_def.stripped_op_list.op.add().name = name
    folder.mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(saved_model.SerializeToString())


def test_unregistered_names_only_the_ops_this_tensorflow_lacks():
    assert unregistered(["MatMul", "NoSuch>Op", "Placeholder", "AlsoMissing"]) == [
        "AlsoMissing", "NoSuch>Op"]


def test_a_version_whose_ops_are_not_registered_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_text", None)  # whether installed or not
    _saved_model_using(tmp_path / "1", ["Placeholder", "NoSuch>Op"])
    with pytest.raises(ModelLoadError) as refused:
        load_servable(MODEL, 1, tmp_path / "1")
    message = str(refused.value)
    assert "\n" not in message
    assert "Received: ['NoSuch>Op']; this TensorFlow lacks them" in message


@pytest.mark.parametrize("installed, failure, says", [
    (None, None, "tensorflow-text is not installed"),
    ("2.20.0", None, "tensorflow-text 2.20.0 is installed, built for another TensorFlow than "
                     "2.21.0"),
    ("2.21.1", "ImportError: undefined symbol", "tensorflow-text 2.21.1 did not import "
                                                "(ImportError: undefined symbol)"),
])
def test_tf_text_ops_name_the_extra_and_what_is_installed(installed, failure, says):
    message = missing_ops_message("models/m/1", [TOKENIZE_OP], failure, "2.21.0", installed)
    assert message == (
        f"models/m/1 uses ops that TensorFlow 2.21.0 has not registered. Received: "
        f"['{TOKENIZE_OP}']; TF Text's ops need the tf-text extra: pip install "
        f"'ampflow[tf-text]' (tensorflow-text 2.21.*, TensorFlow's minor); {says}")
