"""What the kubernetes target applies: the rendered k8s/ overlay, its canary, the release record.

- The *release* is `kubectl kustomize` of the chosen overlay with the version pinned in the
  model ConfigMap (`model_version_policy { specific }`), whose name carries kustomize's content
  hash: a new version is a new pod template, so the stable Deployment rolls.
- The *canary* is derived from the release: a Deployment `<stable>-canary` with the same pod
  template (so the same pinned version) but `ampflow.dev/track: canary` and a few replicas, and a
  Service `<service>-canary` that reaches only those pods. The canary pods also carry the labels
  the main Service selects, so they serve their share of the real traffic while checked.
- The *release record* is a ConfigMap `<stable>-release` holding the exact objects of the last
  promoted release: a failed deploy re-applies that render, not a re-render with today's
  overlay.
"""

from __future__ import annotations

import copy
import datetime
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ampflow.components.deploy_serving import model_store
from ampflow.components.deploy_serving.config import DeployConfig
from ampflow.errors import ConfigError, DeployError
from ampflow.files import k8s_manifests_dir, yaml_documents

BASE_NAME = "tf-serving"
VERSION_ANNOTATION = "ampflow.dev/model-version"
NAME_ANNOTATION = "ampflow.dev/model-name"
TRACK_LABEL = "ampflow.dev/track"
CANARY_SUFFIX = "-canary"
RECORD_SUFFIX = "-release"
RECORD_KEY = "release.yaml"
SERVER_VOLUME_BASE = "/models"  # where the Deployment mounts the model PVC
_KUSTOMIZE_TIMEOUT_S = 60


def kubectl_path() -> str:
    """$KUBECTL or `kubectl` on PATH; DeployError if neither."""
    kubectl = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if kubectl is None:
        raise DeployError(
            "the kubernetes target needs `kubectl` (kustomize, rollout status/undo): put it on "
            "PATH or set $KUBECTL. Received: not found. Nothing was changed."
        )
    return kubectl


def render(config: DeployConfig, model_name: str, version: int) -> list[dict[str, Any]]:
    """`kubectl kustomize` the overlay with namespace, prefix, image and the pinned version."""
    manifests = Path(config.manifests_dir or k8s_manifests_dir())
    overlay = manifests / "overlays" / config.overlay
    if not (overlay / "kustomization.yaml").is_file():
        raise ConfigError(
            "manifests_dir (or $AMPFLOW_K8S_DIR) must hold overlays/<overlay>/kustomization.yaml."
            f" Received: manifests_dir={str(manifests)!r} (no {config.overlay} overlay there)"
        )
    kubectl = kubectl_path()
    with tempfile.TemporaryDirectory(prefix="ampflow-render-") as tmp:
        _write_kustomization(Path(tmp), config, manifests, model_name, version)
        try:
            proc = subprocess.run(
                [kubectl, "kustomize", tmp],
                capture_output=True,
                text=True,
                timeout=_KUSTOMIZE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise DeployError(f"kubectl kustomize did not finish in {e.timeout}s") from e
    if proc.returncode != 0:
        raise DeployError(f"kubectl kustomize {overlay} failed: {proc.stderr.strip()}")
    return [doc for doc in yaml_documents(proc.stdout) if doc]


def canary_objects(release: list[dict[str, Any]], replicas: int) -> list[dict[str, Any]]:
    """The model ConfigMap of `release`, its Deployment as the canary track, a canary Service."""
    stable = one(release, "Deployment")
    canary = copy.deepcopy(stable)
    canary["metadata"]["name"] = stable["metadata"]["name"] + CANARY_SUFFIX
    canary["metadata"].setdefault("labels", {})[TRACK_LABEL] = "canary"
    canary["spec"]["replicas"] = replicas
    canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] = "canary"
    canary["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] = "canary"
    service = copy.deepcopy(one(release, "Service"))
    service["metadata"]["name"] += CANARY_SUFFIX
    service["spec"]["selector"] = {**service["spec"]["selector"], TRACK_LABEL: "canary"}
    return [one(release, "ConfigMap"), canary, service]


def scaled(deployment: dict[str, Any], replicas: int) -> dict[str, Any]:
    """A copy of `deployment` with `replicas` (0 takes it out of service; HPA leaves 0 alone)."""
    out = copy.deepcopy(deployment)
    out["spec"]["replicas"] = replicas
    return out


def shared_objects(release: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a canary needs to exist on a first deploy: all but the stable Deployment and HPA."""
    return [o for o in release if o["kind"] not in ("Deployment", "HorizontalPodAutoscaler")]


def release_record(release: list[dict[str, Any]], model_name: str, version: int,
                   namespace: str) -> dict[str, Any]:
    """The ConfigMap that records `release` as the promoted one (read back by `parse_record`)."""
    stable = one(release, "Deployment")
    labels = {k: v for k, v in (stable["metadata"].get("labels") or {}).items()
              if k != TRACK_LABEL}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": stable["metadata"]["name"] + RECORD_SUFFIX,
                     "namespace": namespace, "labels": labels},
        "data": {
            RECORD_KEY: yaml.safe_dump_all(release, sort_keys=False),
            "model_name": model_name,
            "version": str(version),
            "promoted_at": datetime.datetime.now(datetime.UTC).isoformat(),
        },
    }


def parse_record(config_map: dict[str, Any] | None) -> tuple[list[dict[str, Any]], int] | None:
    """(recorded release objects, version) from a release record ConfigMap; None if absent."""
    if not config_map:
        return None
    data = config_map.get("data") or {}
    try:
        objects = [doc for doc in yaml_documents(data[RECORD_KEY]) if doc]
        version = int(data["version"])
        one(objects, "Deployment")
    except (KeyError, ValueError, yaml.YAMLError, DeployError) as e:
        name = (config_map.get("metadata") or {}).get("name")
        raise DeployError(f"the release record ConfigMap {name} is unreadable ({e}); nothing "
                          "was changed. Fix or delete it, then deploy again.") from e
    return objects, version


def record_name(release: list[dict[str, Any]]) -> str:
    """The release record's ConfigMap name for this render."""
    return one(release, "Deployment")["metadata"]["name"] + RECORD_SUFFIX


def service_address(objects: list[dict[str, Any]], namespace: str) -> str:
    """The in-cluster gRPC address of the (one) Service among `objects`."""
    return f"{one(objects, 'Service')['metadata']['name']}.{namespace}.svc:8500"


def server_model_base(config: DeployConfig) -> str:
    """Where the servers find the store: the URI itself, or the PVC's mount point."""
    if config.server_model_base:
        return config.server_model_base.rstrip("/")
    store = str(config.model_store)
    return store.rstrip("/") if model_store.is_uri(store) else SERVER_VOLUME_BASE


def models_config(name: str, base_path: str, version: int) -> str:
    """The ModelServerConfig text proto that serves exactly `version` of `name`."""
    return (
        "# Written by ampflow deploy: serves exactly one version (a rollback re-pins the old).\n"
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{name}"\n'
        f'    base_path: "{base_path}/{name}"\n'
        '    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ specific {{ versions: {version} }} }}\n"
        "  }\n"
        "}\n"
    )


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of `kind` among `objects`."""
    found = [o for o in objects if o.get("kind") == kind]
    if len(found) != 1:
        raise DeployError(f"expected one {kind} in the rendered manifests. Received: {len(found)}")
    return found[0]


def _write_kustomization(
    tmp: Path, config: DeployConfig, manifests: Path, model_name: str, version: int
) -> None:
    """A throw-away overlay on top of the chosen one; only the models.config file is new."""
    (tmp / "models.config").write_text(
        models_config(model_name, server_model_base(config), version)
    )
    rel = os.path.relpath(manifests.resolve(), tmp.resolve())
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": config.namespace,
        "resources": [f"{rel}/overlays/{config.overlay}"],
        "configMapGenerator": [
            {"name": "tf-serving-config", "behavior": "merge", "files": ["models.config"]}
        ],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": BASE_NAME},
                "patch": yaml.safe_dump(
                    [
                        _annotate(VERSION_ANNOTATION, str(version)),
                        _annotate(NAME_ANNOTATION, model_name),
                    ]
                ),
            }
        ],
    }
    if config.name_prefix:
        kustomization["namePrefix"] = config.name_prefix
    if model_store.is_uri(str(config.model_store)):
        kustomization["components"] = [f"{rel}/components/object-store"]
    if config.image:
        kustomization["images"] = [_image_override(config.image)]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))


def _annotate(key: str, value: str) -> dict[str, Any]:
    """A JSON-patch op adding one Deployment annotation ('/' escaped as '~1')."""
    return {"op": "add", "path": f"/metadata/annotations/{key.replace('/', '~1')}", "value": value}


def _image_override(image: str) -> dict[str, str]:
    """Kustomize `images:` entry replacing tensorflow/serving with `image` (tag or digest)."""
    entry = {"name": "tensorflow/serving"}
    if "@" in image:
        entry["newName"], entry["digest"] = image.split("@", 1)
    elif ":" in image.rsplit("/", 1)[-1]:
        entry["newName"], entry["newTag"] = image.rsplit(":", 1)
    else:
        entry["newName"] = image
    return entry
