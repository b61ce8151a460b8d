"""A loopback fake of the KFP v2beta1 REST API: the calls `kfp.Client` (kfp 2.17) makes to
upload a pipeline and its versions and to create a run, over real HTTP.

It is not KFP: it validates nothing a backend would (the IR, the workspace, the parameters'
types), runs nothing, and keeps what it received so that a test can compare it with what was
compiled. The paths and JSON field names are those of `kfp_server_api` 2.17 (the client's own
generated REST code), and the healthz answer is backend/src/apiserver/main.go@2.17.0's
(`tag_name`, `multi_user`):

- GET  /apis/v2beta1/healthz
- GET  /apis/v2beta1/experiments (filter on display_name), POST /apis/v2beta1/experiments,
  GET  /apis/v2beta1/experiments/{id}
- POST /apis/v2beta1/pipelines/upload?name=...      (multipart `uploadfile`)
- POST /apis/v2beta1/pipelines/upload_version?pipelineid=...&name=...
- GET  /apis/v2beta1/pipelines (filter on display_name)
- POST /apis/v2beta1/runs, GET /apis/v2beta1/runs/{id}

With `token` set, every call without `Authorization: Bearer <token>` is answered 401, as an
install behind an auth proxy does.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import yaml

CREATED_AT = "2026-01-01T00:00:00Z"


class FakeKfpApi:
    """The KFP REST API on 127.0.0.1: what it received is in `runs`, `experiments`, `pipelines`."""

    def __init__(self, tag: str = "2.17.0", multi_user: bool = False,
                 token: str | None = None) -> None:
        self.tag, self.multi_user, self.token = tag, multi_user, token
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, dict] = {}  # pipeline_version_id -> version (with its IR)
        self.requests: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._send(401, {"error": "Unauthorized", "code": 16,
                                     "message": "Unauthorized"})
                    return False
                return True

            def do_GET(self):  # noqa: N802
                api.requests.append(("GET", self.path))
                if not self._authorized():
                    return None
                url = urlparse(self.path)
                query = parse_qs(url.query)
                parts = url.path.strip("/").split("/")
                if url.path == "/apis/v2beta1/healthz":
                    return self._send(200, {"commit_sha": "fake", "tag_name": api.tag,
                                            "multi_user": api.multi_user})
                if parts[:3] == ["apis", "v2beta1", "experiments"]:
                    if len(parts) == 4:
                        found = api.experiments.get(parts[3])
                        return self._send(200, found) if found else self._missing()
                    found = _filtered(api.experiments.values(), query)
                    return self._send(200, {"experiments": found, "total_size": len(found)}
                                      if found else {})
                if url.path == "/apis/v2beta1/pipelines":
                    found = _filtered(api.pipelines.values(), query)
                    return self._send(200, {"pipelines": found, "total_size": len(found)}
                                      if found else {})
                if parts[:3] == ["apis", "v2beta1", "runs"] and len(parts) == 4:
                    found = api.runs.get(parts[3])
                    return self._send(200, found) if found else self._missing()
                return self._missing()

            def do_POST(self):  # noqa: N802
                api.requests.append(("POST", self.path))
                if not self._authorized():
                    return None
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/apis/v2beta1/experiments":
                    body = self._json()
                    experiment = {**body, "experiment_id": str(uuid.uuid4()),
                                  "created_at": CREATED_AT, "storage_state": "AVAILABLE"}
                    api.experiments[experiment["experiment_id"]] = experiment
                    return self._send(200, experiment)
                if url.path == "/apis/v2beta1/runs":
                    body = self._json()
                    if body.get("experiment_id") not in api.experiments:
                        return self._send(400, {"code": 3, "message": "experiment not found"})
                    run = {**body, "run_id": str(uuid.uuid4()), "state": "PENDING",
                           "created_at": CREATED_AT, "storage_state": "AVAILABLE"}
                    api.runs[run["run_id"]] = run
                    return self._send(200, run)
                if url.path == "/apis/v2beta1/pipelines/upload":
                    spec = self._uploaded_ir()
                    pipeline = {"pipeline_id": str(uuid.uuid4()),
                                "display_name": query.get("name", "uploaded"),
                                "created_at": CREATED_AT}
                    api.pipelines[pipeline["pipeline_id"]] = pipeline
                    self._add_version(pipeline["pipeline_id"], pipeline["display_name"], spec)
                    return self._send(200, pipeline)
                if url.path == "/apis/v2beta1/pipelines/upload_version":
                    if query.get("pipelineid") not in api.pipelines:
                        return self._send(404, {"code": 5, "message": "pipeline not found"})
                    version = self._add_version(query["pipelineid"], query.get("name", "v"),
                                                self._uploaded_ir())
                    return self._send(200, version)
                return self._missing()

            def _missing(self) -> None:
                self._send(404, {"code": 5, "message": f"no such path in the fake: {self.path}"})

            def _json(self) -> dict:
                return json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")

            def _uploaded_ir(self) -> list[dict]:
                """The multipart form's `uploadfile` part (the package), as YAML documents."""
                body = self.rfile.read(int(self.headers["Content-Length"]))
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                form = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
                (part,) = [p for p in form.iter_parts()
                           if p.get_param("name", header="content-disposition") == "uploadfile"]
                return [d for d in yaml.safe_load_all(part.get_payload(decode=True)) if d]

            def _add_version(self, pipeline_id: str, name: str, spec: list[dict]) -> dict:
                version = {"pipeline_id": pipeline_id, "pipeline_version_id": str(uuid.uuid4()),
                           "display_name": name, "created_at": CREATED_AT}
                api.versions[version["pipeline_version_id"]] = {**version, "ir": spec}
                return version

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> FakeKfpApi:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _filtered(items, query: dict) -> list[dict]:
    """kfp's `filter` (a JSON predicate list): only EQUALS on display_name, as the client sends."""
    items = list(items)
    if "filter" not in query:
        return items
    for predicate in json.loads(query["filter"][0]).get("predicates", []):
        key, value = predicate.get("key"), predicate.get("string_value",
                                                         predicate.get("stringValue"))
        items = [i for i in items if i.get(key) == value]
    return items
