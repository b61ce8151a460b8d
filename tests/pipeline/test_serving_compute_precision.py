"""The pipeline's `serving_compute_precision` (issue 42 point 4): deploy's own, checked early.

Its default is DeployConfig's `compute_precision` field (the signature restates no literal; the
compiled deploy task's wiring, with prepare-data's dataset for the bf16 parity gate, is checked
in test_compile_submit.py). A bfloat16 run whose deploy would refuse it (a target that runs
tensorflow_model_server, a TFLite variant) is refused by `check_arguments` before anything
runs, with deploy's own line, rather than by the deploy task after training. `run-local`
passes its `--serving-compute-precision` to the pipeline, refused first on a CPU without bf16.
"""

from __future__ import annotations

import ast

import pytest
from pipeline_signature import pipeline_signature_defaults

from ampflow.components.deploy_serving.config import DeployConfig
from ampflow.errors import ConfigError
from ampflow.pipeline.parameters import PIPELINE_PARAMETERS, check_arguments, parse_param


def test_the_default_is_deploys_field_and_the_component_spells_it_out():
    import inspect

    from ampflow.components.deploy_serving.component import deploy_serving

    home = DeployConfig.__dataclass_fields__["compute_precision"].default
    assert PIPELINE_PARAMETERS["serving_compute_precision"][1] == home == "float32"
    assert inspect.signature(deploy_serving).parameters["compute_precision"].default == home
    assert not isinstance(pipeline_signature_defaults()["serving_compute_precision"],
                          ast.Constant)


@pytest.mark.parametrize("params, message", [
    ({"serving_target": "kubernetes"}, r"needs target 'local' or 'kserve'.*"
                                       r"Received: target='kubernetes'"),
    ({"serving_target": "local", "serving_format": "tflite", "tflite_variant": "float16"},
     r"rewrites a SavedModel's graph.*Received: serving_format='tflite'"),
])
def test_bfloat16_on_what_deploy_refuses_is_refused_before_anything_runs(params, message):
    with pytest.raises(ConfigError, match=message):
        check_arguments({"serving_compute_precision": "bfloat16", **params})
    for target in ("local", "kserve"):  # both run ampflow serve
        check_arguments({"serving_compute_precision": "bfloat16", "serving_target": target})
    check_arguments({**params, "serving_compute_precision": "float32"})  # the default: as before
    assert parse_param("serving_compute_precision=bfloat16") == (
        "serving_compute_precision", "bfloat16")
    with pytest.raises(ConfigError, match="float32, bfloat16|bfloat16"):
        parse_param("serving_compute_precision=float16")


def test_run_local_passes_it_and_refuses_it_first_on_a_cpu_without_bf16(tmp_path, monkeypatch):
    from ampflow.pipeline.run_local import LocalRunConfig
    from ampflow.serving import cpu_features

    monkeypatch.setattr(cpu_features, "read_cpu_flags", lambda: frozenset({"amx_bf16"}))
    config = LocalRunConfig(workdir=tmp_path, serving_compute_precision="bfloat16")
    assert config.arguments()["serving_compute_precision"] == "bfloat16"
    with pytest.raises(ConfigError, match="rewrites a SavedModel's graph"):
        LocalRunConfig(workdir=tmp_path, serving_compute_precision="bfloat16",
                       serving_format="tflite", tflite_variant="float16")
    monkeypatch.setattr(cpu_features, "read_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    with pytest.raises(ConfigError, match="needs a CPU with AVX512_BF16 or AMX-BF16"):
        LocalRunConfig(workdir=tmp_path, serving_compute_precision="bfloat16")
    assert LocalRunConfig(workdir=tmp_path).arguments()["serving_compute_precision"] == "float32"
