"""Every compiled variant against the rules of a stock KFP backend (pipeline/backend_rules.py).

The rules, read from kubeflow/pipelines at the tags named (file and lines beside each rule in
backend_rules.py):
- the driver resolves a task's constant input: `{{$.workspace_path}}` anywhere inside the string
  (resolve.go@2.17.0 L430-432), the run/task placeholders only as the whole value (L435-450);
- the launcher replaces `{{$}}` and the input/output placeholders anywhere in the command line
  (launcher_v2.go@2.17.0 L1051-1072);
- the workspace PVC spec must have accessModes (argo.go, every version) and, on 2.15/2.16,
  storageClassName (argo.go@2.15.0 L552, @2.16.0 L578; dropped in 2.17.0 by PR #13306); the
  stock API server has no default spec (PR #12369), so the IR must carry them.
The kfp local runner substitutes placeholders anywhere, so no local run can show these.
"""

from __future__ import annotations

import itertools
import json

import pytest

from ampflow.files import yaml_documents
from ampflow.pipeline.backend_rules import (
    BACKENDS,
    mount_problems,
    placeholder_problems,
    workspace_problems,
)
from ampflow.pipeline.pipeline import PipelineOptions, compile_pipeline

IMAGE = "registry.example/ampflow:1.2.3"
# default, train_workers=2, a deploy into another namespace (gs:// store), GPU and no GPU,
# checkpoints on and off; serving_target is a run-time parameter: every compile holds the
# deploy task under its condition.
VARIANTS = [dict(zip(("train_workers", "gpu", "checkpoints", "serving_namespace"), combo,
                     strict=True))
            for combo in itertools.product((1, 2), (True, False), ("workspace", "none"),
                                           (None, "serving"))]


_CACHE: dict = {}


def _compile(tmp_path, **kwargs):
    """(pipeline spec, platform spec) of the options, compiled once per session."""
    if kwargs.get("serving_namespace"):
        kwargs["model_store_pvc"] = None
    key = tuple(sorted(kwargs.items()))
    if key not in _CACHE:
        path = compile_pipeline(tmp_path / "p.yaml", PipelineOptions(image=IMAGE, **kwargs))
        docs = yaml_documents(open(path))
        _CACHE[key] = docs[0], (docs[1] if len(docs) > 1 else {})
    return _CACHE[key]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_every_placeholder_of_every_variant_is_one_the_217_driver_resolves(tmp_path, variant):
    spec, platform = _compile(tmp_path, **variant)
    assert placeholder_problems(spec) == []
    assert mount_problems(platform) == []  # no claim mounted over the workspace
    text = json.dumps(spec)  # every string whole (a YAML dump may fold a long one)
    if variant["train_workers"] > 1:  # the TFJob's key: the run id, as the whole value
        params = spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]
        assert params["run_key"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    if variant["checkpoints"] == "none":
        assert "{{$.workspace_path}}" not in text


def test_the_old_run_key_is_what_the_driver_leaves_unresolved():
    """The constant the train task got before (one TFJob name for every run) is caught."""
    spec = {"root": {"dag": {"tasks": {"train": {"inputs": {"parameters": {"run_key": {
        "runtimeValue": {"constant": "{{$.pipeline_job_uuid}}/{{$.pipeline_task_name}}"}}}}}}}}}
    (problem,) = placeholder_problems(spec)
    assert "pipeline_job_uuid" in problem and "whole value" in problem
    spec["root"]["dag"]["tasks"]["train"]["inputs"]["parameters"]["run_key"]["runtimeValue"][
        "constant"] = "{{$.workspace_path}}/{{$.pipeline_task_name}}"
    (problem,) = placeholder_problems(spec)  # the workspace branch returns before the switch
    assert "pipeline_task_name" in problem


def test_a_claim_mounted_under_the_workspace_path_is_caught():
    platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {"exec-x": {
        "pvcMount": [{"constant": "c", "mountPath": "/kfp-workspace/models"}]}}}}}}
    (problem,) = mount_problems(platform)
    assert "conflicts with the workspace mount at /kfp-workspace" in problem


def test_an_unknown_placeholder_in_a_command_line_is_caught():
    spec = {"deploymentSpec": {"executors": {"exec-x": {"container": {
        "args": ["--executor_input", "{{$}}", "--run", "{{$.pipeline_job_uuid}}"]}}}}}
    (problem,) = placeholder_problems(spec)
    assert problem.startswith("executor exec-x: {{$.pipeline_job_uuid}}")


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v["checkpoints"] == "workspace"],
                         ids=lambda v: "-".join(map(str, v.values())))
def test_default_workspace_is_accepted_by_217_and_names_its_access_mode(tmp_path, variant):
    _, platform = _compile(tmp_path, **variant)
    workspace = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    assert workspace["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteOnce"]}
    assert workspace_problems(platform, "2.17") == []
    # 2.15/2.16 need the class named: submit fills in the cluster's default (test_preflight)
    for backend in ("2.15", "2.16"):
        (problem,) = workspace_problems(platform, backend)
        assert problem.startswith("workspace PVC spec must specify storageClassName")


def test_workspace_with_a_storage_class_is_accepted_by_every_backend(tmp_path):
    _, platform = _compile(tmp_path, workspace_storage_class="standard-rwo")
    for backend in BACKENDS:
        assert workspace_problems(platform, backend) == [], backend


def test_checkpoints_none_has_no_workspace_for_any_backend(tmp_path):
    _, platform = _compile(tmp_path, checkpoints="none")
    for backend in BACKENDS:
        assert workspace_problems(platform, backend) == []


@pytest.mark.parametrize("patch, backend, message", [
    ({}, "2.17", "must specify accessModes"),  # the IR this project compiled before
    ({}, "2.15", "must specify accessModes"),
    ({"accessModes": ["ReadWriteOnce"], "storageClassName": ""}, "2.17",
     "must be omitted or set to a non-empty value"),
    ({"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}, "2.17",
     "unknown fields in PVC spec patch: ['volumeMode']"),
])
def test_workspace_rules_refuse_what_the_backend_refuses(patch, backend, message):
    platform = {"platforms": {"kubernetes": {"pipelineConfig": {"workspace": {
        "size": "20Gi", "kubernetes": {"pvcSpecPatch": patch}}}}}}
    assert any(message in p for p in workspace_problems(platform, backend))
    # an API server configured with a default spec supplies what the patch lacks
    default = {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs"}
    if not patch:
        assert workspace_problems(platform, backend, default_spec=default) == []


def test_compile_cli_refuses_an_ir_for_a_backend_that_would_refuse_it(tmp_path):
    from ampflow.cli import main

    out = tmp_path / "p.yaml"
    assert main(["compile", "--image", IMAGE, "--output", str(out), "--kfp-backend", "2.16"]) == 2
    assert main(["compile", "--image", IMAGE, "--output", str(out), "--kfp-backend", "2.16",
                 "--workspace-storage-class", "standard"]) == 0
    # serving elsewhere: no claim of another namespace is mounted
    assert main(["compile", "--image", IMAGE, "--output", str(out),
                 "--serving-namespace", "ampflow"]) == 0
    assert "pvcMount" not in out.read_text()
