"""The whole pipeline through the real kfp local runner (SubprocessRunner), tiny epochs."""

import json

import numpy as np
import pytest

from ampflow.errors import PipelineError
from ampflow.pipeline.run_local import LocalRunConfig, run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TASKS = {"prepare-data", "train", "evaluate-parity", "export-savedmodel", "convert-tflite",
         "deploy-serving"}


def test_run_local_produces_every_artifact_and_the_served_model_answers(tmp_path):
    from ampflow.components.prepare_data import load_arrays
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.config import ModelConfig, ServerConfig
    from ampflow.serving.server import start_local_server

    config = LocalRunConfig(workdir=tmp_path, epochs=3, serving_model_name="digits")
    result = run_local(config)

    assert TASKS <= set(result.artifacts)
    art = result.artifacts
    assert (art["prepare-data"]["data"] / "dataset_info.json").is_file()
    assert (art["train"]["model"] / "model.keras").is_file()
    assert json.loads((art["evaluate-parity"]["verdict"] / "verdict.json").read_text())["passed"]
    assert (art["evaluate-parity"]["report"]).read_text().startswith("#")
    assert (art["export-savedmodel"]["saved_model"] / "digits" / "1" / "saved_model.pb").is_file()
    tflite = art["convert-tflite"]["tflite"]
    assert {p.name for p in tflite.glob("*.tflite")} == {
        "float32.tflite", "float16.tflite", "dynamic_range.tflite", "full_int8.tflite"}
    endpoint = json.loads(art["deploy-serving"]["endpoint"].read_text())
    assert endpoint["target"] == "local" and endpoint["version"] == 1
    assert (result.serving_base / "1" / "saved_model.pb").is_file()

    server = start_local_server(ServerConfig(models=(ModelConfig("digits", result.serving_base),),
                                             host="127.0.0.1", port=0))
    try:
        images, labels = load_arrays(art["prepare-data"]["data"], "test", limit=64)
        with PredictionClient(server.address, timeout_s=10) as client:
            assert client.wait_until_available("digits", timeout=60) == 1
            out = client.predict("digits", images.astype("float32")).outputs
        assert out["probabilities"].shape == (64, 10)
        np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)
        assert np.mean(out["class_ids"] == labels) > 0.8
    finally:
        server.stop(0)


def test_run_local_failing_parity_gate_stops_before_export(tmp_path):
    config = LocalRunConfig(workdir=tmp_path, epochs=1, max_relative_logit_diff=0.0)
    with pytest.raises(PipelineError, match="evaluate-parity"):
        run_local(config)
    run_dirs = list((tmp_path / "pipeline_root").iterdir())
    assert len(run_dirs) == 1
    tasks = {p.name for p in run_dirs[0].iterdir()}
    assert "train" in tasks and "export-savedmodel" not in tasks
    verdict = json.loads((run_dirs[0] / "evaluate-parity" / "verdict" / "verdict.json").read_text())
    assert not verdict["passed"]
    assert not list((tmp_path / "serving").rglob("saved_model.pb"))
