"""Deploying a text model (issue 39 point 5): the canary sends sentences, a text variant ids.

The SavedModel is the real export of bert_tiny trained by `ampflow train` (the session-shared
text export of tests/tiny_text_model.py, made once per test run under a file lock for the
export, convert and deploy tests). Its
`ampflow_canary.npz` holds real test sentences; `serving_default` takes `text` (tf.string).
One in-process `ampflow serve` server for the module polls the store (every version served);
the deploy's canary talks to it over gRPC on loopback, as it talks to tensorflow_model_server.
The TFLite variants are the real convert step's output of that export (float32, and float16
made to fail its gate: a probability difference of 0 asked for).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_text_model import export_text_model

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.errors import DeployError, GateFailedError

MODEL = "reviews"


@pytest.fixture(scope="module")
def text_export(tmp_path_factory) -> tuple[Path, Path]:
    """(prepared text dir, the exported version dir), shared with the export/convert tests."""
    data_dir, _, version_dir = export_text_model(tmp_path_factory)
    return data_dir, version_dir


@pytest.fixture(scope="module")
def server(tmp_path_factory, text_export):
    """(store, address): the in-process server over a store holding the export as version 1."""
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    store = tmp_path_factory.mktemp("served") / "store"
    run_deploy(DeployConfig(saved_model_dir=text_export[1], model_store=str(store), version=1))
    config = ServerConfig(models=(ModelConfig(MODEL, store / MODEL, version_policy="all"),),
                          port=0, file_system_poll_wait_seconds=0.5, enable_warmup=False)
    running = start_local_server(config)
    try:
        yield store, running.address
    finally:
        running.stop(0.5)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, text_export) -> Path:
    """The convert output of the export: float32 passes its gate, float16 fails it."""
    from ampflow.components.convert_tflite import ConvertConfig, run_convert

    data_dir, version_dir = text_export
    out = tmp_path_factory.mktemp("convert") / "tflite"
    # float16 weights change some probability on every machine: a difference of 0 asked for
    # fails the gate whatever the kernels (full_int8 of bert_tiny passes its own, issue 46)
    with pytest.raises(GateFailedError, match="float16"):
        run_convert(ConvertConfig(saved_model_dir=version_dir, data_dir=data_dir,
                                  output_dir=out, variants=("float32", "float16"),
                                  test_limit=32, latency_runs=1, warmup_runs=0,
                                  float16_max_prob_diff=0.0))
    report = json.loads((out / "report.json").read_text())
    assert {v: r["passed"] for v, r in report["variants"].items()} == {
        "float32": True, "float16": False}
    return out


def _versions(store: Path) -> list[str]:
    return sorted(p.name for p in (store / MODEL).iterdir() if p.name != ".versions.lock")


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(400)
def test_text_savedmodel_deploy_passes_its_canary_of_real_sentences(server, text_export):
    from ampflow.artifacts.canary_examples import load_canary_examples

    store, address = server
    recorded = load_canary_examples(text_export[1])
    assert recorded.input_key == "text" and isinstance(recorded.images[0], bytes)
    result = run_deploy(DeployConfig(saved_model_dir=text_export[1], model_store=str(store),
                                     version=2, server_address=address,
                                     canary_timeout_s=60, canary_atol=1e-5))
    assert (result.served_version, result.already_present) == (2, False)
    assert len(set(recorded.class_ids.tolist())) >= 2  # the sentences tell classes apart


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(400)
def test_text_canary_with_a_wrong_expected_class_fails_and_unpublishes(server, text_export,
                                                                       tmp_path):
    from ampflow.artifacts.canary_examples import CANARY_FILE

    store, address = server
    tampered = tmp_path / MODEL / "1"
    shutil.copytree(text_export[1], tampered)
    with np.load(tampered / CANARY_FILE, allow_pickle=False) as data:
        recorded = dict(data)
    recorded["class_ids"] = (recorded["class_ids"] + 1) % recorded["probabilities"].shape[1]
    (tampered / CANARY_FILE).unlink()
    with open(tampered / CANARY_FILE, "wb") as f:
        np.savez(f, **recorded)
    with pytest.raises(DeployError, match=r"with another class.*is not serving this version"):
        run_deploy(DeployConfig(saved_model_dir=tampered, model_store=str(store), version=3,
                                server_address=address, canary_timeout_s=60))
    assert "3" not in _versions(store)  # removed: the previous version stays served


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(400)
def test_text_tflite_float32_deploy_sends_shipped_vocabulary_ids(server, text_export,
                                                                 converted):
    from ampflow.artifacts.canary_examples import load_canary_examples
    from ampflow.modeling.tokenizer import load_tokenizer, token_ids
    from ampflow.serving.models.tflite import TFLiteServable

    store, address = server
    result = run_deploy(DeployConfig(
        saved_model_dir=text_export[1], model_store=str(store), version=4,
        serving_format="tflite", tflite_dir=converted, tflite_variant="float32",
        server_address=address, canary_timeout_s=60, canary_atol=1e-6))
    assert (result.served_version, result.tflite_variant) == (4, "float32")
    version_dir = store / MODEL / "4"
    assert {p.name for p in version_dir.iterdir()} == {
        "float32.tflite", "float32.json", "vocab.txt", "tokenizer.json", "ampflow_deploy.json"}
    assert (version_dir / "vocab.txt").read_bytes() == (converted / "vocab.txt").read_bytes()
    # what a client of the published version does: ids from its vocab.txt, the token_ids
    # signature; it gives the SavedModel's classes on the recorded sentences
    recorded = load_canary_examples(text_export[1])
    ids = token_ids(load_tokenizer(version_dir), list(recorded.images))
    answers = TFLiteServable(MODEL, 4, version_dir).run("token_ids", {"input_ids": ids})
    np.testing.assert_array_equal(answers["class_ids"], recorded.class_ids)


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.timeout(400)
def test_text_tflite_variant_that_failed_its_gate_is_refused_in_one_line(
        text_export, converted, tmp_path, capsys):
    from ampflow.cli import main

    store = tmp_path / "store"
    code = main(["deploy", "--saved-model-dir", str(text_export[1]), "--model-store",
                 str(store), "--serving-format", "tflite", "--tflite-dir", str(converted),
                 "--tflite-variant", "float16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("ampflow deploy: error: --tflite-variant='float16' failed the "
                              "convert step's gate ("), err
    assert not (store / MODEL).exists() or _versions(store) == []


@pytest.mark.parametrize("key, dtype, values, sent", [
    ("images", 1, np.full((2, 8, 8, 1), 0.5), np.float32),  # DT_FLOAT
    ("text", 7, np.array([b"a film", "\u00e9trange".encode()], dtype=object), object),
    ("input_ids", 3, np.array([[5, 1, 0], [2, 0, 0]], np.int64), np.int32),  # DT_INT32
], ids=["images-float32", "text-strings", "token-ids-int32"])
def test_canary_request_is_the_examples_values_in_the_signatures_dtype(key, dtype, values,
                                                                       sent):
    """What every target's canary sends (kubernetes and kserve call the same check)."""
    from ampflow_client.tensors import make_ndarray

    from ampflow.artifacts.canary_examples import CanaryExamples
    from ampflow.components.deploy_serving.canary import request_tensor
    from ampflow.components.deploy_serving.model_store import SignatureSpec

    spec = SignatureSpec({key: (dtype, (-1,))}, ("class_ids", "probabilities"))
    examples = CanaryExamples(values, np.zeros((2, 3), np.float32), np.zeros(2, np.int64),
                              input_key=key)
    proto = request_tensor(spec, examples)
    assert proto.dtype == dtype
    received = make_ndarray(proto)
    assert received.dtype == np.dtype(sent)
    np.testing.assert_array_equal(received, values)


def test_canary_request_for_an_input_the_signature_lacks_is_one_line():
    from ampflow.artifacts.canary_examples import CanaryExamples
    from ampflow.components.deploy_serving.canary import request_tensor
    from ampflow.components.deploy_serving.model_store import SignatureSpec

    examples = CanaryExamples(np.zeros((1, 8, 8, 1), np.float32), np.ones((1, 1), np.float32),
                              np.zeros(1, np.int64))  # images, recorded for an image model
    with pytest.raises(DeployError, match=r"^the signature 'serving_default' must take 'images' "
                                          r".*Received inputs: \['text'\]$"):
        request_tensor(SignatureSpec({"text": (7, (-1,))}, ()), examples)
