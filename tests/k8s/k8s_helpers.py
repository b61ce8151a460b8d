"""Helpers of the k8s tests (a plain module: conftest.py cannot be imported by tests)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml

K8S_DIR = Path(__file__).resolve().parents[2] / "k8s"
TARGETS = ("overlays/cpu", "overlays/gpu", "rbac", "rbac-kubeflow", "model-store", "pipeline", ".")
# libyaml's parser where PyYAML has it: the same objects as yaml.SafeLoader, ~10x less CPU on the
# stored CRDs (4.4 CPU-s for the five of them in pure Python, 0.5 CPU-s with libyaml)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str | bytes):
    """`yaml.safe_load(text)`, parsed by libyaml when PyYAML has it."""
    return yaml.load(text, Loader=_LOADER)


def load_all_yaml(text: str | bytes) -> list:
    """`yaml.safe_load_all(text)` without its empty documents, parsed by libyaml when it can."""
    return [d for d in yaml.load_all(text, Loader=_LOADER) if d]


def validate_builtin(obj: dict, k8s_version: str = "1.37.0") -> None:
    """`kubernetes_validate.validate(obj, k8s_version, strict=True)`, each schema file read once.

    The library reads and parses its JSON schema files on every call, the 1.8 MB definitions
    file included (~20 ms each), and the k8s tests validate ~80 objects. The validation itself,
    its version rule and its errors stay the library's.
    """
    import kubernetes_validate.utils

    with mock.patch.object(kubernetes_validate.utils, "schema_contents", _read_schema_once()):
        kubernetes_validate.validate(obj, k8s_version, strict=True)


@functools.cache
def _read_schema_once():
    """kubernetes_validate's schema file reader, remembering what it parsed (nothing mutates it)."""
    import kubernetes_validate.utils

    return functools.cache(kubernetes_validate.utils.schema_contents)


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

        key = (api_version, kind)
        if key not in self._validators:
            crd = load_yaml(gzip.decompress((self.crds / self.schemas[key]).read_bytes()))
            version = api_version.split("/")[1]
            (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
            assert crd["spec"]["names"]["kind"] == kind and entry["served"]
            self._validators[key] = jsonschema.Draft7Validator(
                strict_schema(entry["schema"]["openAPIV3Schema"]))
        return self._validators[key]

    def __call__(self, obj: dict) -> None:
        key = (obj["apiVersion"], obj["kind"])
        if key in self.schemas:
            errors = sorted(self.crd_validator(*key).iter_errors(obj), key=lambda e: list(e.path))
            assert not errors, "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        else:
            validate_builtin(obj)
