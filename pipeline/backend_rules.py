"""What a stock KFP backend does with our compiled IR: the rules ampflow's pipeline relies on.

Read from kubeflow/pipelines' backend at the tags 2.15.0, 2.16.0 and 2.17.0 (each rule names
its file and lines at that tag). `submit` applies them to the IR it is about to send, for the
backend version the endpoint reports, and tests/pipeline applies them to every compiled variant,
so that an IR a stock backend would reject, or a placeholder it would pass through unresolved,
fails here rather than on a cluster. Pure Python over the IR's YAML documents: no kfp import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# --- placeholders -------------------------------------------------------------------------
# The driver resolves a task's constant input parameter (resolve.go@2.17.0 L424-452):
# - L430-432: a string that *contains* `{{$.workspace_path}}` has every occurrence replaced
#   by the workspace mount path, and is returned at once (nothing else in it is resolved);
IN_STRING = ("{{$.workspace_path}}",)
# - L435-450: otherwise `switch valStr`: these are replaced only when they are the whole value;
#   inside a longer string they reach the container as literal text.
WHOLE_VALUE = (
    "{{$.pipeline_job_name}}",
    "{{$.pipeline_job_resource_name}}",
    "{{$.pipeline_job_uuid}}",
    "{{$.pipeline_task_name}}",
    "{{$.pipeline_task_uuid}}",
    "{{$.pipeline_job_create_time_utc}}",
    "{{$.pipeline_job_schedule_time_utc}}",
)
# The launcher builds the container's command line (component/launcher_v2.go@2.17.0 L1051-1072,
# compileCmdAndArgs): `{{$}}` (the executor input JSON) and the input/output placeholders of
# getPlaceholders (L1077-) are replaced anywhere inside an argument.
LAUNCHER_IN_ARGS = re.compile(
    r"\{\{\$\}\}|\{\{\$\.(inputs|outputs)\.(parameters|artifacts)\['[^']+'\][^}]*\}\}")
_PLACEHOLDER = re.compile(r"\{\{\$[^}]*\}\}")


def placeholder_problems(pipeline_spec: dict[str, Any]) -> list[str]:
    """Every placeholder the 2.17 driver or launcher would leave unresolved, one line each."""
    problems = []
    for where, value in _constants(pipeline_spec):
        found = _PLACEHOLDER.findall(value)
        if not found:
            continue
        if any(p in value for p in IN_STRING):
            others = [p for p in found if p not in IN_STRING]
            if others:  # resolve.go L430-432 returns before the whole-value switch
                problems.append(f"{where}: {others} next to {{{{$.workspace_path}}}} in "
                                f"{value!r} stay unresolved")
            continue
        if value in WHOLE_VALUE:
            continue
        problems.append(f"{where}: {found} inside {value!r} is resolved by the driver only as "
                        "the whole value (resolve.go L435-450)")
    for name, executor in (pipeline_spec.get("deploymentSpec", {}).get("executors") or {}).items():
        container = executor.get("container") or {}
        for arg in list(container.get("command") or []) + list(container.get("args") or []):
            for found in _PLACEHOLDER.findall(str(arg)):
                if not LAUNCHER_IN_ARGS.fullmatch(found):
                    problems.append(f"executor {name}: {found} in its command line is not one "
                                    "the launcher replaces (launcher_v2.go L1051-1072)")
    return problems


def _constants(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(location, string) of every runtime constant of a task input in the pipeline spec."""
    if isinstance(node, dict):
        constant = (node.get("runtimeValue") or {}).get("constant")
        if isinstance(constant, str):
            yield where, constant
        for key, value in node.items():
            yield from _constants(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _constants(value, f"{where}[{i}]")


# --- the run's workspace PVC --------------------------------------------------------------
# Retries: the compiler emits an Argo retryStrategy with a limit and backoff but no retryPolicy
# (argocompiler/container.go@2.17.0 L667-684), so Argo's default OnFailure applies: a failed
# pod is retried, a deleted one (an Error) is not; nothing in the IR can change that.
#
# GetWorkspacePVC (argocompiler/argo.go) builds the workspace PVC from the API server's default
# spec (none on a stock install: its config.json has no workspace section since PR #12369) and
# the IR's pvcSpecPatch, and rejects the run when:
BACKENDS = ("2.15", "2.16", "2.17")
# convertStructToPVCSpec (argo.go@2.15.0 L479-505, @2.16.0 L505-531, @2.17.0 L594-620): any
# other field of the patch is "unknown fields in PVC spec patch".
_PATCH_FIELDS = ("accessModes", "storageClassName")
_WORKSPACE_RULES = {
    # version: (lines of the accessModes / storageClassName checks, storage class required)
    "2.15": ("argo.go@2.15.0 L548-554", True),
    "2.16": ("argo.go@2.16.0 L574-580", True),
    # PR #13306 (commit cd33c19): a nil class is the cluster's default; "" is still refused
    "2.17": ("argo.go@2.17.0 L663-672", False),
}


# The driver mounts the workspace at /kfp-workspace into every task whose resolved input holds
# that path (driver.go@2.17.0 L519-549, needsWorkspaceMount) and refuses a task whose own
# volume mount is under it (L816-817).
WORKSPACE_MOUNT_PATH = "/kfp-workspace"  # component/constants.go@2.17.0 L32


def mount_problems(platform_spec: dict[str, Any]) -> list[str]:
    """PVC mounts of the IR that the 2.17 driver refuses (under the workspace mount path)."""
    executors = ((((platform_spec or {}).get("platforms") or {}).get("kubernetes") or {})
                 .get("deploymentSpec") or {}).get("executors") or {}
    return [f"executor {name}: a volume mounted at {mount['mountPath']} conflicts with the "
            f"workspace mount at {WORKSPACE_MOUNT_PATH} (driver.go@2.17.0 L816-817)"
            for name, executor in executors.items() for mount in executor.get("pvcMount") or []
            if str(mount.get("mountPath", "")).startswith(WORKSPACE_MOUNT_PATH)]


def backend_series(tag: str | None) -> str | None:
    """'2.16' for a KFP tag such as '2.16.1' or 'v2.16.0'; None when not a 2.x tag we know."""
    match = re.match(r"v?(\d+)\.(\d+)", tag or "")
    if not match:
        return None
    series = f"{match.group(1)}.{match.group(2)}"
    if series in BACKENDS:
        return series
    return "2.17" if (int(match.group(1)), int(match.group(2))) > (2, 17) else None


def workspace_problems(platform_spec: dict[str, Any], backend: str,
                       default_spec: dict[str, Any] | None = None) -> list[str]:
    """Why `backend` (2.15/2.16/2.17) would refuse the IR's workspace; [] if it accepts it.

    `default_spec`: the API server's default workspace PVC spec (None on a stock install).
    """
    if backend not in _WORKSPACE_RULES:
        raise ValueError(f"backend must be one of {BACKENDS}. Received: {backend!r}")
    workspace = (((platform_spec or {}).get("platforms") or {}).get("kubernetes") or {}).get(
        "pipelineConfig", {}).get("workspace")
    if workspace is None:
        return []
    lines, class_required = _WORKSPACE_RULES[backend]
    problems = []
    if not workspace.get("size"):
        problems.append("workspace size is required but not specified")
    patch = (workspace.get("kubernetes") or {}).get("pvcSpecPatch") or {}
    unknown = sorted(set(patch) - set(_PATCH_FIELDS))
    if unknown:
        problems.append(f"unknown fields in PVC spec patch: {unknown}")
    spec = {**(default_spec or {}), **{k: v for k, v in patch.items() if k in _PATCH_FIELDS}}
    if not spec.get("accessModes"):
        problems.append(f"workspace PVC spec must specify accessModes ({lines})")
    storage_class = spec.get("storageClassName")
    if class_required and not storage_class:
        problems.append(f"workspace PVC spec must specify storageClassName ({lines})")
    elif storage_class == "":
        problems.append("workspace PVC spec storageClassName must be omitted or set to a "
                        f"non-empty value ({lines})")
    return problems


def ir_problems(path: str, backend: str) -> list[str]:
    """Every rule above applied to a compiled IR file, for KFP backend series `backend`."""
    from ampflow.files import yaml_documents

    with open(path) as f:
        docs = yaml_documents(f)
    platform = docs[1] if len(docs) > 1 else {}
    return (placeholder_problems(docs[0]) + mount_problems(platform)
            + workspace_problems(platform, backend))
