"""Component tier: each KFP component's function called with real KFP artifact objects.

The components are thin wrappers; these tests check the wrapping (artifact paths in, KFP
metrics/metadata out, a failed gate failing the task) without a runner. The whole DAG through
the kfp local runner is tested in tests/pipeline/test_demo.py and test_image_folder_pipeline.py.
"""

import json

import pytest
from kfp import dsl

from ampflow.components.deploy_serving.component import deploy_serving
from ampflow.components.evaluate_parity.component import evaluate_parity
from ampflow.components.prepare_data.component import prepare_data
from ampflow.components.train.component import train
from ampflow.errors import ConfigError, GateFailedError
from ampflow.pipeline.settings import as_component


def _artifact(cls, path):
    return cls(uri=str(path))


def test_prepare_data_component_fills_the_dataset_artifact(tmp_path):
    data = _artifact(dsl.Dataset, tmp_path / "data")
    prepare_data(dataset="ampflow_digits", data=data)
    assert (tmp_path / "data" / "dataset_info.json").is_file()
    assert data.metadata["splits"] == {"train": 1438, "test": 359}
    assert data.metadata["num_classes"] == 10


def test_train_component_rejects_a_bad_jit_setting(tmp_path, prepared_digits):
    with pytest.raises(ConfigError, match="xla must be auto, on or off"):
        train(data=_artifact(dsl.Dataset, prepared_digits),
              model=_artifact(dsl.Model, tmp_path / "m"),
              metrics=_artifact(dsl.Metrics, tmp_path / "metrics"), xla="maybe")


@pytest.mark.parametrize("allreduce, message", [
    ({"allreduce_dtype": "float8"}, "allreduce_dtype must be one of"),
    ({"allreduce_bytes_per_pack": -1}, "allreduce_bytes_per_pack must be >= 0"),
    ({"packed_allreduce": False, "allreduce_dtype": "compute"}, "they need packed_allreduce"),
])
def test_train_component_hands_the_allreduce_flags_to_the_train_step(tmp_path, allreduce,
                                                                    message):
    # the train step's own checks refuse each: the component passed it on (a dropped flag
    # would reach the missing data dir instead, a different error)
    with pytest.raises(ConfigError, match=message):
        train(data=_artifact(dsl.Dataset, tmp_path / "no-data"),
              model=_artifact(dsl.Model, tmp_path / "m"),
              metrics=_artifact(dsl.Metrics, tmp_path / "metrics"), workers=2, **allreduce)


def _evaluate(tmp_path, prepared_digits, model_dir, **thresholds):
    outputs = {
        "metrics": _artifact(dsl.Metrics, tmp_path / "metrics"),
        "confusion": _artifact(dsl.ClassificationMetrics, tmp_path / "confusion"),
        "report": _artifact(dsl.Markdown, tmp_path / "report.md"),
        "verdict": _artifact(dsl.Artifact, tmp_path / "verdict"),
    }
    call = lambda: evaluate_parity(  # noqa: E731
        data=_artifact(dsl.Dataset, prepared_digits), model=_artifact(dsl.Model, model_dir),
        **outputs, **thresholds)
    return outputs, call


@pytest.mark.slow
def test_evaluate_component_logs_kfp_metrics_and_confusion_matrix(tmp_path, prepared_digits,
                                                                 trained_model):
    outputs, call = _evaluate(tmp_path, prepared_digits, trained_model("mixed_float16"))
    assert call() == (True, "parity gate passed (5 checks)")
    assert outputs["metrics"].metadata["argmax_agreement"] >= 0.99
    matrix = outputs["confusion"].metadata["confusionMatrix"]
    assert len(matrix["rows"]) == 10 and len(matrix["annotationSpecs"]) == 10
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("#")
    # self-contained for the KFP UI: per-class accuracy, confusion matrix, logit diffs, loss scale
    assert report.count("](data:image/png;base64,") == 4
    assert outputs["verdict"].metadata["passed"] is True
    from ampflow.components.evaluate_parity.component import parity_gate

    parity_gate(verdict=outputs["verdict"])  # a passed verdict lets the run go on


@pytest.mark.slow
def test_evaluate_component_failed_gate_publishes_everything_and_the_gate_task_fails(
        tmp_path, prepared_digits, trained_model):
    from ampflow.components.evaluate_parity.component import parity_gate

    outputs, call = _evaluate(tmp_path, prepared_digits, trained_model("mixed_float16"),
                              max_relative_logit_diff=0.0)
    passed, message = call()  # a failed gate does not fail this task: KFP uploads its outputs
    assert passed is False and "max_relative_logit_diff: measured" in message
    verdict = json.loads((tmp_path / "verdict" / "verdict.json").read_text())
    assert verdict["passed"] is False
    assert outputs["verdict"].metadata["passed"] is False
    assert outputs["verdict"].metadata["failed_checks"] == ["max_relative_logit_diff"]
    assert "max_relative_logit_diff" in outputs["metrics"].metadata
    assert (tmp_path / "report.md").read_text().startswith("# FP32 parity: FAILED")
    with pytest.raises(GateFailedError, match=r"failed 1 check\(s\), so the run stops before "
                                              r"export: max_relative_logit_diff: measured"):
        parity_gate(verdict=outputs["verdict"])


@pytest.mark.slow
def test_export_and_convert_components_publish_typed_model_metadata(tmp_path, prepared_digits,
                                                                    trained_model):
    from ampflow.artifacts.verdict import model_sha256
    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.export_savedmodel.component import export_savedmodel

    model_dir = trained_model("mixed_float16")
    outputs, call = _evaluate(tmp_path, prepared_digits, model_dir)
    call()
    saved_model = _artifact(dsl.Model, tmp_path / "saved_model")
    export_savedmodel(model=_artifact(dsl.Model, model_dir), verdict=outputs["verdict"],
                      data=_artifact(dsl.Dataset, prepared_digits), saved_model=saved_model,
                      model_name="digits")
    meta = saved_model.metadata
    assert (meta["framework"], meta["format"], meta["model_name"], meta["version"]) == (
        "tensorflow", "saved_model", "digits", 1)
    assert (tmp_path / "saved_model" / meta["version_dir"] / "saved_model.pb").is_file()
    assert set(meta["signatures"]) == {"serving_default", "classify", "image_bytes"}
    assert (meta["trained_policy"], meta["exported_policy"]) == ("mixed_float16", "float32")
    assert meta["trained_model_sha256"] == model_sha256(model_dir)
    json.dumps(meta)  # KFP stores metadata as JSON

    tflite = _artifact(dsl.Model, tmp_path / "tflite")
    convert_tflite(saved_model=saved_model, data=_artifact(dsl.Dataset, prepared_digits),
                   tflite=tflite, metrics=_artifact(dsl.Metrics, tmp_path / "tm"),
                   report=_artifact(dsl.Markdown, tmp_path / "tr.md"), variants="float32")
    tmeta = tflite.metadata
    assert (tmeta["framework"], tmeta["format"], tmeta["source_version"]) == ("tflite", "tflite", 1)
    variant = tmeta["variants"]["float32"]
    assert variant["file"] == "float32.tflite" and variant["passed"] is True
    assert variant["size_bytes"] == (tmp_path / "tflite" / "float32.tflite").stat().st_size
    json.dumps(tmeta)


def test_deploy_component_target_none_records_no_deployment(tmp_path):
    endpoint = _artifact(dsl.Artifact, tmp_path / "endpoint")
    deploy_serving(saved_model=_artifact(dsl.Artifact, tmp_path / "nothing"), endpoint=endpoint,
                   target="none")
    assert json.loads((tmp_path / "endpoint").read_text()) == {"target": "none"}


def test_every_component_compiles_as_a_lightweight_component_over_our_image():
    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.evaluate_parity.component import parity_gate
    from ampflow.components.export_savedmodel.component import export_savedmodel

    for func in (prepare_data, train, evaluate_parity, parity_gate, export_savedmodel,
                 convert_tflite, deploy_serving):
        component = as_component(func, "registry.example/ampflow:9.9")
        spec = component.component_spec
        assert spec.implementation.container.image == "registry.example/ampflow:9.9"
        assert spec.description  # the docstring flows into the compiled component
        assert component.python_func is func
