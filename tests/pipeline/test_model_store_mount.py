"""The model-store mount path has one home: `MODEL_STORE_MOUNT` in the deploy step's config.

The pipeline mounts the model-store claim into the deploy task there, the pipeline parameter
`serving_model_store` points there by default, and `ampflow submit`'s preflight reads that
default. Only the KFP component's own default repeats it: a lightweight component's source is
copied alone into its pod, where a module constant would not be defined.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

from ampflow.components.deploy_serving.component import deploy_serving
from ampflow.components.deploy_serving.config import MODEL_STORE_MOUNT
from ampflow.pipeline import preflight
from ampflow.pipeline.parameters import PIPELINE_PARAMETERS
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline
from ampflow.pipeline.settings import as_component

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example/ampflow:1.2.3"
# file -> how many times it may write the path out as a string literal
LITERALS = {"components/deploy_serving/config.py": 1,  # the constant itself
            "components/deploy_serving/component.py": 1,  # the component's default (see above)
            "pipeline/pipeline.py": 0, "pipeline/parameters.py": 0, "pipeline/preflight.py": 0}


def test_the_mount_path_is_written_out_only_where_it_must_be():
    for path, allowed in LITERALS.items():
        found = re.findall(r"""["']/models["']""", (ROOT / path).read_text())
        assert len(found) == allowed, f"{path} writes '/models' out {len(found)} times"


def test_the_component_default_is_the_constant():
    default = inspect.signature(deploy_serving).parameters["model_store"].default
    spec = as_component(deploy_serving, IMAGE).component_spec
    assert default == spec.inputs["model_store"].default == MODEL_STORE_MOUNT


def test_the_compiled_mount_and_the_parameter_default_are_the_constant(tmp_path):
    assert PipelineOptions(image=IMAGE).model_store_mount == MODEL_STORE_MOUNT
    assert PIPELINE_PARAMETERS["serving_model_store"][1] == MODEL_STORE_MOUNT
    package = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image=IMAGE))
    spec, platform = list(yaml.safe_load_all(Path(package).read_text()))[:2]
    assert spec["root"]["inputDefinitions"]["parameters"]["serving_model_store"][
        "defaultValue"] == MODEL_STORE_MOUNT
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    (mount,) = executors["exec-deploy-serving"]["pvcMount"]
    assert mount["mountPath"] == MODEL_STORE_MOUNT


def test_preflight_takes_the_constant_as_the_default_store():
    """Without a claim and without --param serving_model_store, the store is the mount path,
    a directory: preflight names it."""
    options = PipelineOptions(image=IMAGE, serving_namespace="elsewhere")
    for target in ("kubernetes", "kserve"):
        needs = preflight.run_needs(options, {"serving_target": target}, "kubeflow", False)
        (problem,) = needs.problems
        assert problem.startswith(f"serving_model_store={MODEL_STORE_MOUNT!r} is a directory")


def _deploy_task_inputs(spec: dict) -> dict:
    """The deploy task's constant inputs, wherever the compiler nested it (under a condition)."""
    found = {}

    def walk(node):
        if isinstance(node, dict):
            for name, task in node.get("tasks", {}).items():
                if name == "deploy-serving":
                    found.update(task["inputs"].get("parameters", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    return found


def test_the_deploy_task_is_told_the_claim_it_mounts(tmp_path):
    """A kserve InferenceService reads pvc://<claim>/...: the claim the pipeline mounts, not
    the component's default name."""
    package = compile_pipeline(tmp_path / "p.yaml",
                               PipelineOptions(image=IMAGE, model_store_pvc="team-models"))
    spec, platform = list(yaml.safe_load_all(Path(package).read_text()))[:2]
    inputs = _deploy_task_inputs(spec)
    assert inputs["model_store_claim"]["runtimeValue"]["constant"] == "team-models"
    (mount,) = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][
        "exec-deploy-serving"]["pvcMount"]
    assert mount["constant"] == "team-models" or mount.get("pvcName") == "team-models"
