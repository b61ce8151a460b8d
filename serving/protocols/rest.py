"""The one shape of a REST protocol on the REST port: `RestDoor`.

TF Serving's /v1 and KServe V2's /v2 share a port (transport/http.py's `RestApp`), so each is
a door of the same shape: which paths it answers (`answers`), and a `route` from one request to
one reply. The door itself times and labels the call for the metrics (`CallObserver`) and turns
any error into the port's one envelope (`error_reply`), so the two protocols cannot drift apart
in how a request is counted or how a failure reads.
"""

from __future__ import annotations

from ampflow.serving.core.inference import CallObserver, CallRecord, InferenceCore, Observer
from ampflow.serving.transport.http import REST_TIMEOUT_S, Reply, error_reply


class RestDoor:
    """One REST protocol over the core: `answers(path)`, then `handle` (which never raises)."""

    def __init__(self, core: InferenceCore, observe: Observer | None = None,
                 timeout_s: float | None = REST_TIMEOUT_S) -> None:
        """`timeout_s`: the REST deadline, also the core's for a batch (None: none)."""
        self.core = core
        self.timeout_s = timeout_s
        self.calls = CallObserver(core, observe)

    def answers(self, path: str) -> bool:
        """Whether a request for `path` (without its query) is this protocol's."""
        raise NotImplementedError

    def route(self, method: str, path: str, headers: dict[str, str], body: bytes,
              record: CallRecord) -> Reply:
        """The reply to one request; `record` learns the method, model and version answered."""
        raise NotImplementedError

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> Reply:
        """Answer one request: (HTTP status, body, headers); any error is the one envelope."""
        try:
            with self.calls.call() as record:
                return self.route(method, raw_path.split("?", 1)[0], headers, body, record)
        except Exception as e:  # noqa: BLE001 - every error becomes the one HTTP envelope
            return error_reply(e, method, raw_path)
