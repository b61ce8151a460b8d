"""Helpers of the k8s tests (a plain module: conftest.py cannot be imported by tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

K8S_DIR = Path(__file__).resolve().parents[2] / "k8s"
TARGETS = ("overlays/cpu", "overlays/gpu", "rbac", "rbac-kubeflow", "model-store", "pipeline", ".")


def require_tool(path: str | None, what: str, install: str) -> str:
    """The tool's path; a missing tool skips locally but fails under CI (CI=true)."""
    if path:
        return path
    message = f"{what} not found; install it: {install}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(object name, pod spec) of every workload among `objects`."""
    out = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out.append((obj["metadata"]["name"], obj["spec"]["template"]["spec"]))
    return out


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def strict_schema(schema):
    """An OpenAPI schema in which an unknown field is an error (the API server would prune it)."""
    if isinstance(schema, dict):
        schema = {k: strict_schema(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    return schema


class ManifestValidator:
    """Custom kinds against stored upstream CRDs (strict), built-in kinds against Kubernetes'.

    `schemas` maps (apiVersion, kind) to a gzip-compressed CRD file in `crds`.
    """

    def __init__(self, crds: Path, schemas: dict[tuple[str, str], str]) -> None:
        self.crds, self.schemas, self._validators = crds, schemas, {}

    def crd_validator(self, api_version: str, kind: str):
        """A strict validator from the stored CRD of `kind` at `api_version`."""
        import gzip

        import jsonschema
        import yaml

        key = (api_version, kind)
        if key not in self._validators:
            crd = yaml.safe_load(gzip.decompress((self.crds / self.schemas[key]).read_bytes()))
            version = api_version.split("/")[1]
            (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
            assert crd["spec"]["names"]["kind"] == kind and entry["served"]
            self._validators[key] = jsonschema.Draft7Validator(
                strict_schema(entry["schema"]["openAPIV3Schema"]))
        return self._validators[key]

    def __call__(self, obj: dict) -> None:
        import kubernetes_validate

        key = (obj["apiVersion"], obj["kind"])
        if key in self.schemas:
            errors = sorted(self.crd_validator(*key).iter_errors(obj), key=lambda e: list(e.path))
            assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        else:
            kubernetes_validate.validate(obj, "1.37.0", strict=True)
