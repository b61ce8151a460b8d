"""The parity gate's thresholds have one home, the evaluate step's config: every layer that
passes them on (the pipeline's parameters, `run-local`/`demo`, the KFP component) has its
defaults, so a threshold changed there changes everywhere."""

import inspect

import pytest
import yaml

from ampflow.components.evaluate_parity.config import EvaluateConfig
from ampflow.pipeline.pipeline import AUTO_RELATIVE_LOGIT_DIFF, PipelineOptions, compile_pipeline
from ampflow.pipeline.run_local import LocalRunConfig

THRESHOLDS = ("max_accuracy_drop", "min_agreement", "max_baseline_accuracy_drop",
              "baseline_alpha", "chance_alpha", "min_accuracy", "metric_thresholds")
# the comparison with the model serving: its own component
SERVING = ("serving_alpha", "serving_rule", "non_inferiority_margin", "max_detectable_drop",
           "force")


def _evaluate_default(name):
    return EvaluateConfig.__dataclass_fields__[name].default


def test_pipeline_parameters_default_to_the_evaluate_steps_thresholds(tmp_path):
    path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(gpu=False))
    params = next(yaml.safe_load_all(open(path)))["root"]["inputDefinitions"]["parameters"]
    for name in THRESHOLDS + SERVING:
        assert params[name].get("defaultValue", "") == _evaluate_default(name), name
    # EvaluateConfig's auto bound (None) travels as a negative float
    assert _evaluate_default("max_relative_logit_diff") is None
    assert params["max_relative_logit_diff"]["defaultValue"] == AUTO_RELATIVE_LOGIT_DIFF < 0


def test_local_run_and_component_defaults_are_the_evaluate_steps_thresholds():
    from ampflow.components.evaluate_parity.component import compare_serving, evaluate_parity

    local = {f.name: f.default for f in LocalRunConfig.__dataclass_fields__.values()}
    # the component's source is copied into its task, so it spells its defaults out
    component = inspect.signature(evaluate_parity).parameters
    for name in THRESHOLDS:
        assert local[name] == component[name].default == _evaluate_default(name), name
    comparison = inspect.signature(compare_serving).parameters
    for name in SERVING:
        assert local[name] == comparison[name].default == _evaluate_default(name), name
    assert local["max_relative_logit_diff"] == AUTO_RELATIVE_LOGIT_DIFF
    assert component["max_relative_logit_diff"].default == AUTO_RELATIVE_LOGIT_DIFF


def test_a_bad_gate_setting_is_refused_before_anything_runs(tmp_path):
    """The evaluate step's own checks, at submit/compile and run-local time, not after
    training."""
    from ampflow.errors import ConfigError
    from ampflow.pipeline.parameters import check_arguments, parse_param

    for text, message in (("chance_alpha=0", r"chance_alpha must be in \(0, 1\)"),
                          ("metric_thresholds=amp_accuracy>0.9",
                           r"metric_thresholds must be NAME>=VALUE or NAME<=VALUE"),
                          ("min_accuracy=1.5", r"min_accuracy must be in \[0, 1\]")):
        name, value = parse_param(text)
        with pytest.raises(ConfigError, match=message):
            check_arguments({name: value})
    with pytest.raises(ConfigError, match=r"serving_alpha must be in \(0, 1\)"):
        LocalRunConfig(workdir=tmp_path, serving_alpha=1.0)
    with pytest.raises(ConfigError, match=r"non_inferiority_margin must be > 0 points"):
        check_arguments({"serving_rule": "non-inferiority"})
    with pytest.raises(ConfigError, match=r"--param serving_rule must be one of "
                                          r"no-regression, non-inferiority"):
        parse_param("serving_rule=strict")
    with pytest.raises(ConfigError, match=r"non_inferiority_margin must be > 0 points"):
        LocalRunConfig(workdir=tmp_path, serving_rule="non-inferiority")
    check_arguments({"metric_thresholds": "amp_accuracy>=0.9", "min_accuracy": 0.5})
