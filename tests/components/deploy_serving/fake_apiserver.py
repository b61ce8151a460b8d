"""A tiny fake Kubernetes API server on loopback, to test the client side on the wire.

It answers /version, the discovery endpoints for the kinds k8s/ renders, server-side apply
PATCHes (recorded, and stored), and GETs of what was applied; an applied Deployment reports
its rollout as complete at once, except a Deployment annotated with `stall_version`, whose
rollout is past its progress deadline (a new version whose pods never become Ready).
It is not Kubernetes: it checks nothing a real API server would (schemas, RBAC, conflicts).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

_VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0",
    "gitCommit": "fake",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# group/version -> [(plural, kind, namespaced)]
RESOURCES = {
    "v1": [
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True),
        ("pods", "Pod", True),
        ("namespaces", "Namespace", False),
    ],
    "apps/v1": [("deployments", "Deployment", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
}


class FakeApiServer:
    """`with FakeApiServer() as api:` -> api.url, api.patches, api.objects."""

    def __init__(self, stall_version: str | None = None) -> None:
        self.stall_version = stall_version
        self.patches: list[dict] = []  # {"path", "query", "content_type", "body"}
        self.objects: dict[str, dict] = {}  # object path -> stored object
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path) -> None:
        """Write a kubeconfig pointing at this server."""
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: u}}]\n"
        )

    def _deployment_with_status(self, obj: dict) -> dict:
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["generation"] = 1
        obj["spec"]["replicas"] = 2
        version = obj["metadata"].get("annotations", {}).get("ampflow.dev/model-version")
        if version is not None and version == self.stall_version:
            obj["status"] = {
                "observedGeneration": 1,
                "replicas": 3,
                "updatedReplicas": 1,
                "availableReplicas": 2,
                "conditions": [
                    {
                        "type": "Progressing",
                        "status": "False",
                        "reason": "ProgressDeadlineExceeded",
                        "message": "ReplicaSet has timed out progressing.",
                    }
                ],
            }
        else:
            obj["status"] = {
                "observedGeneration": 1,
                "replicas": 2,
                "updatedReplicas": 2,
                "availableReplicas": 2,
                "readyReplicas": 2,
            }
        return obj

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output quiet
                pass

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = urlparse(self.path).path.rstrip("/") or "/"
                if path == "/version":
                    return self._send(200, _VERSION)
                if path == "/api":
                    return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
                if path == "/apis":
                    return self._send(200, _group_list())
                discovery = _resource_list(path)
                if discovery is not None:
                    return self._send(200, discovery)
                key = path.removesuffix("/status")
                with server.lock:
                    obj = server.objects.get(key)
                if obj is None:
                    return self._send(404, _status(404, "NotFound", f"{key} not found"))
                if obj.get("kind") == "Deployment":
                    obj = server._deployment_with_status(obj)
                return self._send(200, obj)

            def do_PATCH(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.patches.append(
                        {
                            "path": url.path,
                            "query": parse_qs(url.query),
                            "content_type": self.headers.get("Content-Type"),
                            "body": body,
                        }
                    )
                    server.objects[url.path] = body
                self._send(200, body)

        return Handler


def _group_list() -> dict:
    groups = []
    for gv in RESOURCES:
        if "/" in gv:
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _resource_list(path: str) -> dict | None:
    gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
    if gv not in RESOURCES or (gv != "v1" and not path.startswith("/apis/")):
        return None
    resources = [
        {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": namespaced,
            "kind": kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        for plural, kind, namespaced in RESOURCES[gv]
    ]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }
