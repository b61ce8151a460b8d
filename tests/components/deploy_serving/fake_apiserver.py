"""A tiny fake Kubernetes API server on loopback, to test the client side on the wire.

It answers /version, the discovery endpoints for the kinds k8s/ renders, server-side apply
PATCHes (recorded, and stored), JSON-patch PATCHes of a Deployment (what `kubectl rollout
undo` sends), GETs of what was applied, and the list + watch requests of `kubectl rollout
status`. A stand-in for the Deployment controller gives each Deployment a uid and a revision,
and keeps one ReplicaSet per distinct pod template (as `kubectl rollout undo` reads them). An
applied Deployment reports its rollout as complete at once (its `spec.replicas`, or 2 where
the HPA owns it), except a Deployment whose (name, model-version annotation) is in `stall`:
its rollout is past its progress deadline (pods that never become Ready).

With `kserve=True` it also serves KServe's kinds (serving.kserve.io/v1beta1 InferenceService,
v1alpha1 ServingRuntime) and stands in for the KServe controller: an applied InferenceService
whose spec changed gets the next generation and a new predictor revision, Ready at once (status
observedGeneration, url, the revisions' traffic split by canaryTrafficPercent), except one whose
(name, model-version annotation) is in `isvc_stall`: that revision never becomes ready and the
traffic stays on the previous ready one. With `isvc_lag=n` the controller sees a new spec
only after n reads: until then the status is the previous generation's. Without `kserve`,
KServe's paths answer 404, as a cluster without the CRDs does. `forbid` holds (method,
resource plural) pairs answered 403 Forbidden.
POST creates an object (409 AlreadyExists if it exists) and DELETE removes one, honouring
uid/resourceVersion preconditions (409 Conflict); a merge PATCH (strategic or JSON) merges
`data` and honours a `metadata.resourceVersion` in it (409 Conflict), as the rollout lock needs.
It is not Kubernetes: it checks nothing else a real API server would (schemas, RBAC, conflicts).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
import uuid
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
    "apps/v1": [("deployments", "Deployment", True), ("replicasets", "ReplicaSet", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler", True)],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
}
KSERVE_RESOURCES = {
    "serving.kserve.io/v1beta1": [("inferenceservices", "InferenceService", True)],
    "serving.kserve.io/v1alpha1": [("servingruntimes", "ServingRuntime", True)],
}


class FakeApiServer:
    """`with FakeApiServer() as api:` -> api.url, api.patches, api.objects."""

    def __init__(self, stall: set[tuple[str, str]] = frozenset(), kserve: bool = False,
                 isvc_stall: set[tuple[str, str]] = frozenset(),
                 forbid: set[tuple[str, str]] = frozenset(), isvc_lag: int = 0) -> None:
        self.stall = set(stall)  # (Deployment name, model version) whose rollout never completes
        self.resources = {**RESOURCES, **(KSERVE_RESOURCES if kserve else {})}
        self.isvc_stall = set(isvc_stall)  # (InferenceService name, model version) never ready
        self.forbid = set(forbid)  # (method, plural) answered 403
        self.revisions: dict[str, list[dict]] = {}  # InferenceService path -> its revisions
        self.isvc_lag = isvc_lag
        self.unobserved: dict[str, int] = {}  # InferenceService path -> reads before observed
        self.patches: list[dict] = []  # {"path", "query", "content_type", "body"}
        self.objects: dict[str, dict] = {}  # object path -> stored object
        self.requests: list[tuple[str, str]] = []  # (method, path?query)
        self.merge_patches: list[dict] = []  # the rollout lock's take-overs and releases
        self.version_counter = 0  # resourceVersion of objects created with POST
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

    def deployment(self, namespace: str, name: str) -> dict | None:
        """The stored Deployment, as last applied or patched (None if absent)."""
        return self.objects.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")

    def _deployment_with_status(self, obj: dict) -> dict:
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["generation"] = 1
        obj["metadata"].setdefault("resourceVersion", "1")
        want = obj["spec"].setdefault("replicas", 2)  # no replicas field: the HPA's minimum
        version = obj["metadata"].get("annotations", {}).get("ampflow.dev/model-version")
        if (obj["metadata"]["name"], version) in self.stall:
            obj["status"] = {
                "observedGeneration": 1,
                "replicas": want + 1,
                "updatedReplicas": 1,
                "availableReplicas": want,
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
                "replicas": want,
                "updatedReplicas": want,
                "availableReplicas": want,
                "readyReplicas": want,
                "conditions": [{"type": "Available", "status": "True"}] if want else [],
            }
        return obj

    def _control(self, path: str) -> None:
        """The Deployment controller's bookkeeping after a write: uid, ReplicaSet, revision."""
        dep = self.objects[path]
        meta = dep["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        namespace = path.split("/")[5]
        template = json.dumps(dep["spec"]["template"], sort_keys=True)
        owned = [rs for key, rs in self.objects.items()
                 if "/replicasets/" in key
                 and rs["metadata"]["ownerReferences"][0]["uid"] == meta["uid"]]
        revisions = [int(rs["metadata"]["annotations"][_REVISION]) for rs in owned]
        match = next((rs for rs in owned if _template_without_hash(rs) == template), None)
        if match is None:
            pod_hash = hashlib.sha256(template.encode()).hexdigest()[:10]
            spec = copy.deepcopy(dep["spec"])
            spec["template"]["metadata"]["labels"]["pod-template-hash"] = pod_hash
            spec["selector"]["matchLabels"]["pod-template-hash"] = pod_hash
            match = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                     "metadata": {"name": f"{meta['name']}-{pod_hash}", "namespace": namespace,
                                  "uid": str(uuid.uuid4()), "annotations": {},
                                  "labels": dict(spec["template"]["metadata"]["labels"]),
                                  "ownerReferences": [{
                                      "apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": meta["name"], "uid": meta["uid"],
                                      "controller": True, "blockOwnerDeletion": True}]},
                     "spec": {"replicas": 0, "selector": spec["selector"],
                              "template": spec["template"]},
                     "status": {"replicas": 0}}
            self.objects[f"/apis/apps/v1/namespaces/{namespace}/replicasets/"
                         f"{match['metadata']['name']}"] = match
        current = int(match["metadata"]["annotations"].get(_REVISION, "0"))
        if current != max(revisions, default=0) or current == 0:
            current = max(revisions, default=0) + 1
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                       if k != _REVISION}
        match["metadata"]["annotations"] = {**annotations, _REVISION: str(current)}
        meta["annotations"] = {**annotations, _REVISION: str(current)}

    def _serves(self, path: str) -> bool:
        """Whether `path` lies in a group/version this server serves."""
        parts = path.split("/")
        gv = "v1" if parts[1] == "api" else "/".join(parts[2:4])
        return gv in self.resources

    def _forbidden(self, method: str, path: str) -> bool:
        parts = path.split("/")
        plural = parts[parts.index("namespaces") + 2] if "namespaces" in parts[:-2] else ""
        return (method, plural) in self.forbid

    def _kserve_controller(self, path: str, previous: dict | None) -> None:
        """A changed InferenceService spec: the next generation and a new predictor revision."""
        isvc = self.objects[path]
        revisions = self.revisions.setdefault(path, [])
        generation = (previous or {}).get("metadata", {}).get("generation", 0)
        if previous is None or previous.get("spec") != isvc.get("spec"):
            generation += 1
            name = isvc["metadata"]["name"]
            version = (isvc["metadata"].get("annotations") or {}).get("ampflow.dev/model-version")
            revisions.append({"name": f"{name}-predictor-{len(revisions) + 1:05d}",
                              "ready": (name, version) not in self.isvc_stall})
            self.unobserved[path] = self.isvc_lag
        isvc["metadata"]["generation"] = generation

    def _isvc_with_status(self, path: str) -> dict:
        """The stored InferenceService with the status KServe would give it now."""
        isvc = copy.deepcopy(self.objects[path])
        meta, revisions = isvc["metadata"], self.revisions.get(path, [])
        observed = meta["generation"]
        if self.unobserved.get(path):  # the controller has not reconciled the new spec yet
            self.unobserved[path] -= 1
            revisions, observed = revisions[:-1], observed - 1
        if not revisions:
            return isvc
        latest, ready = revisions[-1], [r for r in revisions if r["ready"]]
        canary = isvc["spec"]["predictor"].get("canaryTrafficPercent", 100)
        if latest["ready"] and len(ready) > 1 and canary < 100:
            traffic = [{"revisionName": latest["name"], "percent": canary,
                        "latestRevision": True, "tag": "latest"},
                       {"revisionName": ready[-2]["name"], "percent": 100 - canary,
                        "latestRevision": False, "tag": "prev"}]
        elif latest["ready"]:
            traffic = [{"revisionName": latest["name"], "percent": 100, "latestRevision": True}]
        else:
            traffic = ([{"revisionName": ready[-1]["name"], "percent": 100,
                         "latestRevision": False}] if ready else [])
        url = f"http://{meta['name']}.{meta['namespace']}.example.com"
        ok = "True" if latest["ready"] else "False"
        why = {} if latest["ready"] else {
            "reason": "RevisionMissing",
            "message": f"Revision \"{latest['name']}\" failed with message: "
                       "Container failed with: model not found."}
        isvc["status"] = {
            "observedGeneration": observed, "url": url,
            "address": {"url": f"http://{meta['name']}-predictor.{meta['namespace']}"
                               ".svc.cluster.local"},
            "conditions": [{"type": "PredictorReady", "status": ok, **why},
                           {"type": "Ready", "status": ok, **why}],
            "components": {"predictor": {
                "latestCreatedRevision": latest["name"],
                **({"latestReadyRevision": ready[-1]["name"]} if ready else {}),
                "traffic": traffic}},
        }
        return isvc

    def _list(self, path: str, query: dict) -> dict | None:
        """A List of the stored objects of one namespaced collection (field/label selector)."""
        parts = path.split("/")
        if len(parts) < 4 or parts[-3] != "namespaces":  # not a namespaced collection
            return None
        prefix = path + "/"
        items = [copy.deepcopy(o) for k, o in self.objects.items()
                 if k.startswith(prefix) and "/" not in k[len(prefix):]]
        name = (query.get("fieldSelector", [""])[0].partition("metadata.name=")[2])
        if name:
            items = [o for o in items if o["metadata"]["name"] == name]
        labels = query.get("labelSelector", [""])[0]
        for term in filter(None, labels.split(",")):
            key, _, value = term.partition("=")
            items = [o for o in items if (o["metadata"].get("labels") or {}).get(key) == value]
        items = [self._deployment_with_status(o) if o.get("kind") == "Deployment" else o
                 for o in items]
        kind = items[0]["kind"] if items else parts[-1][:-1].capitalize()
        group_version = "/".join(parts[2:-3])  # /apis/apps/v1/... -> apps/v1; /api/v1 -> v1
        return {"apiVersion": group_version, "kind": f"{kind}List",
                "metadata": {"resourceVersion": "1"}, "items": items}

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
                url = urlparse(self.path)
                path = url.path.rstrip("/") or "/"
                query = parse_qs(url.query)
                server.requests.append(("GET", self.path))
                if path == "/version":
                    return self._send(200, _VERSION)
                if path == "/api":
                    return self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
                if path == "/apis":
                    return self._send(200, _group_list(server.resources))
                discovery = _resource_list(path, server.resources)
                if discovery is not None:
                    return self._send(200, discovery)
                if not server._serves(path):
                    return self._send(404, _status(404, "NotFound", "the server could not "
                                                   "find the requested resource"))
                if server._forbidden("GET", path):
                    return self._send(403, _status(403, "Forbidden", f"GET {path} forbidden"))
                if query.get("watch", [""])[0] in ("true", "1"):
                    return self._watch()
                key = path.removesuffix("/status")
                with server.lock:
                    obj = server.objects.get(key)
                    listing = server._list(path, query) if obj is None else None
                if listing is not None:
                    return self._send(200, listing)
                if obj is None:
                    return self._send(404, _status(404, "NotFound", f"{key} not found"))
                if obj.get("kind") == "Deployment":
                    obj = server._deployment_with_status(obj)
                if obj.get("kind") == "InferenceService":
                    with server.lock:
                        obj = server._isvc_with_status(key)
                return self._send(200, obj)

            def _watch(self) -> None:
                """A watch stream with no events, closed after a moment (clients re-watch)."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                time.sleep(0.5)

            def do_PATCH(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                content_type = self.headers.get("Content-Type", "")
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(("PATCH", self.path))
                if not server._serves(url.path):
                    return self._send(404, _status(404, "NotFound", "the server could not "
                                                   "find the requested resource"))
                if server._forbidden("PATCH", url.path):
                    return self._send(403, _status(403, "Forbidden", f"PATCH {url.path} is "
                                                   "forbidden: the user may not patch it"))
                with server.lock:
                    recorded = (server.merge_patches if "merge-patch" in content_type
                                else server.patches)  # patches: applies and JSON patches
                    recorded.append(
                        {
                            "path": url.path,
                            "query": parse_qs(url.query),
                            "content_type": content_type,
                            "body": copy.deepcopy(body),  # as sent, before the controller
                        }
                    )
                    if content_type.startswith("application/json-patch+json"):
                        if url.path not in server.objects:
                            return self._send(404, _status(404, "NotFound", url.path))
                        _json_patch(server.objects[url.path], body)
                    elif "merge-patch" in content_type:  # resourceVersion: a precondition
                        stored = server.objects.get(url.path)
                        if stored is None:
                            return self._send(404, _status(404, "NotFound", url.path))
                        wanted = body.get("metadata", {}).get("resourceVersion")
                        if wanted not in (None, stored["metadata"].get("resourceVersion")):
                            return self._send(409, _status(409, "Conflict", "the object has "
                                                           "been modified"))
                        stored.setdefault("data", {}).update(body.get("data", {}))
                        server.version_counter += 1
                        stored["metadata"]["resourceVersion"] = str(server.version_counter)
                    else:
                        before = server.objects.get(url.path)
                        previous = (before or {}).get("metadata", {})
                        if "uid" in previous:  # an object keeps its identity across applies
                            body["metadata"]["uid"] = previous["uid"]
                        server.objects[url.path] = body
                        if body.get("kind") == "InferenceService":
                            server._kserve_controller(url.path, before)
                    if "/deployments/" in url.path:
                        server._control(url.path)
                    stored = server.objects[url.path]
                self._send(200, stored)

            def do_POST(self) -> None:  # noqa: N802 - create: 409 AlreadyExists if it does
                url = urlparse(self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(("POST", self.path))
                key = f"{url.path.rstrip('/')}/{body['metadata']['name']}"
                with server.lock:
                    if key in server.objects:
                        return self._send(409, _status(409, "AlreadyExists", f"{key} exists"))
                    server.version_counter += 1
                    body["metadata"].update(uid=str(uuid.uuid4()),
                                            resourceVersion=str(server.version_counter))
                    server.objects[key] = body
                self._send(201, body)

            def do_DELETE(self) -> None:  # noqa: N802 - with uid/resourceVersion preconditions
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                options = json.loads(self.rfile.read(length)) if length else {}
                server.requests.append(("DELETE", self.path))
                if server._forbidden("DELETE", url.path):
                    return self._send(403, _status(403, "Forbidden", f"DELETE {url.path} is "
                                                   "forbidden: the user may not delete it"))
                wanted = (options or {}).get("preconditions") or {}
                with server.lock:
                    obj = server.objects.get(url.path)
                    if obj is None:
                        return self._send(404, _status(404, "NotFound", f"{url.path} not found"))
                    meta = obj["metadata"]
                    if any(wanted.get(k) not in (None, meta.get(k))
                           for k in ("uid", "resourceVersion")):
                        return self._send(409, _status(409, "Conflict", "precondition failed"))
                    del server.objects[url.path]
                self._send(200, _status(200, "Success", "deleted") | {"status": "Success"})

        return Handler


_REVISION = "deployment.kubernetes.io/revision"


def _template_without_hash(replica_set: dict) -> str:
    template = copy.deepcopy(replica_set["spec"]["template"])
    template["metadata"]["labels"].pop("pod-template-hash", None)
    return json.dumps(template, sort_keys=True)


def _json_patch(obj: dict, ops: list[dict]) -> None:
    """RFC 6902 add/replace/remove on `obj`, in place (what kubectl sends)."""
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        target = obj
        for part in parents:
            target = target.setdefault(part, {})
        if op["op"] in ("add", "replace"):
            target[last] = op["value"]
        elif op["op"] == "remove":
            target.pop(last, None)
        else:
            raise ValueError(f"unsupported JSON patch op {op['op']}")


def _group_list(resources: dict) -> dict:
    groups: dict[str, dict] = {}
    for gv in resources:
        if "/" in gv:
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            found = groups.setdefault(group, {"name": group, "versions": [],
                                              "preferredVersion": entry})
            found["versions"].append(entry)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}


def _resource_list(path: str, resources: dict) -> dict | None:
    gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
    if gv not in resources or (gv != "v1" and not path.startswith("/apis/")):
        return None
    resources = [
        {
            "name": plural,
            "singularName": kind.lower(),
            "namespaced": namespaced,
            "kind": kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        }
        for plural, kind, namespaced in resources[gv]
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
