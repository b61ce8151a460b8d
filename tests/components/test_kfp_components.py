"""Component tier: each KFP component's function called with real KFP artifact objects.

The components are thin wrappers; these tests check the wrapping (artifact paths in, KFP
metrics/metadata out, a failed gate failing the task) without a runner. The whole DAG through
the kfp local runner is tested in tests/pipeline/test_run_local.py.
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
    with pytest.raises(ConfigError, match="jit_compile must be auto, true or false"):
        train(data=_artifact(dsl.Dataset, prepared_digits),
              model=_artifact(dsl.Model, tmp_path / "m"),
              metrics=_artifact(dsl.Metrics, tmp_path / "metrics"), jit_compile="maybe")


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
    call()
    assert outputs["metrics"].metadata["argmax_agreement"] >= 0.99
    matrix = outputs["confusion"].metadata["confusionMatrix"]
    assert len(matrix["rows"]) == 10 and len(matrix["annotationSpecs"]) == 10
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("#")
    assert report.count("](data:image/png;base64,") == 3  # self-contained for the KFP UI
    assert outputs["verdict"].metadata["passed"] is True


@pytest.mark.slow
def test_evaluate_component_failed_gate_fails_the_task_after_writing_outputs(
        tmp_path, prepared_digits, trained_model):
    outputs, call = _evaluate(tmp_path, prepared_digits, trained_model("mixed_float16"),
                              max_relative_logit_diff=0.0)
    with pytest.raises(GateFailedError, match="max_relative_logit_diff"):
        call()
    verdict = json.loads((tmp_path / "verdict" / "verdict.json").read_text())
    assert verdict["passed"] is False
    assert "max_relative_logit_diff" in outputs["metrics"].metadata


def test_deploy_component_target_none_records_no_deployment(tmp_path):
    endpoint = _artifact(dsl.Artifact, tmp_path / "endpoint")
    deploy_serving(saved_model=_artifact(dsl.Artifact, tmp_path / "nothing"), endpoint=endpoint,
                   target="none")
    assert json.loads((tmp_path / "endpoint").read_text()) == {"target": "none"}


def test_every_component_compiles_as_a_lightweight_component_over_our_image():
    from ampflow.components.convert_tflite.component import convert_tflite
    from ampflow.components.export_savedmodel.component import export_savedmodel

    for func in (prepare_data, train, evaluate_parity, export_savedmodel, convert_tflite,
                 deploy_serving):
        component = as_component(func, "registry.example/ampflow:9.9")
        spec = component.component_spec
        assert spec.implementation.container.image == "registry.example/ampflow:9.9"
        assert spec.description  # the docstring flows into the compiled component
        assert component.python_func is func
