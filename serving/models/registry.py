"""Which model versions are loaded, and which one answers a request.

This mirrors TF Serving's availability-preserving manager, over its file-system source
(`version_source`: the version dirs on disk and the policy's aspired versions) and its
loader (`servable`: one loaded version, SavedModel or TFLite, behind one interface):
- a version dir is loaded only once it has stopped changing and looks complete;
- a new aspired version is loaded and warmed up *before* it is published, and an old version
  is retired only once an aspired one is available, so a reload never drops a request
  (in-flight requests keep their reference to the old version object);
- a version dir that fails to load (partly written, corrupt) is logged, marked END with its
  error in GetModelStatus, never served, and retried only when its files change.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from ampflow.serving.config import ModelConfig
from ampflow.serving.models.servable import Servable, load_servable
from ampflow.serving.models.tflite import detect_format
from ampflow.serving.models.version_source import (
    aspired_versions,
    dir_fingerprint,
    discover_versions,
    meant_dir_hint,
    missing_entries,
)
from ampflow.serving.status import (
    ServingStatusError,
    VersionState,
    VersionStatus,
    clip,
    load_error_code,
    not_found,
    scrub_paths,
)

log = logging.getLogger(__name__)

INCOMPLETE_GRACE_S = 60.0  # an incomplete-looking version dir unchanged this long is loaded


@dataclasses.dataclass
class _ModelState:
    config: ModelConfig
    served: dict[int, Servable] = dataclasses.field(default_factory=dict)
    status: dict[int, VersionStatus] = dataclasses.field(default_factory=dict)
    failed: dict[int, tuple] = dataclasses.field(default_factory=dict)
    seen: dict[int, tuple] = dataclasses.field(default_factory=dict)  # fingerprint, last poll
    unsettled: set[int] = dataclasses.field(default_factory=set)  # still being written
    waiting: dict[int, list] = dataclasses.field(default_factory=dict)  # missing entries logged
    path_problem: str = ""  # the last base-path warning logged (logged again only on change)


Warmup = Callable[[Servable], int]


class ModelRegistry:
    """Loads, warms up, publishes and retires model versions; resolves a ModelSpec."""

    def __init__(self, models: tuple[ModelConfig, ...], warmup: Warmup | None = None,
                 settle_s: float = 1.0) -> None:
        self._settle_s = settle_s
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._models: dict[str, _ModelState] = {m.name: _ModelState(m) for m in models}
        self._warmup = warmup
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.on_change: Callable[[], None] | None = None

    # ---- discovery and loading -------------------------------------------------------------

    def start(self, poll_wait_s: float) -> None:
        """Load what is there now, then keep polling every `poll_wait_s` (0 = never).

        A version dir is loaded only once it has stopped changing (see `_settled`); start
        waits (a bounded number of settle periods) for dirs still changing, so a model that
        is on disk when the server starts is loaded before the port opens.
        """
        self._settle_s = poll_wait_s or self._settle_s
        self.poll_once()
        for _ in range(10):
            if not self._unsettled():
                break
            time.sleep(self._settle_s)
            self.poll_once()
        if poll_wait_s > 0:
            self._thread = threading.Thread(
                target=self._poll_loop, args=(poll_wait_s,), name="ampflow-version-poller",
                daemon=True,
            )
            self._thread.start()

    def start_problems(self, waiting: bool = False) -> list[str]:
        """Why the server must not start, as TF Serving's start-up refuses (server_core.cc).

        A model with no version available once start has loaded what is on disk: TF Serving
        exits with "N model(s) did not become available" (`waiting`, --wait-for-base-path:
        a model with no version on disk yet is expected, one whose version failed is not; a
        version still being written is loaded once it settles, as before); a version label
        on a version not being served: FAILED_PRECONDITION's words there.
        """
        with self._lock:
            states = list(self._models.values())
        missing = []
        for state in states:
            if state.served or state.unsettled or (waiting and not state.status):
                continue  # (a version still being written is loaded once it settles)
            failed = [(v, st) for v, st in sorted(state.status.items(), reverse=True)
                      if st.error]
            version, error = (failed[0][0], f" due to error: {failed[0][1].error}") \
                if failed else ("Latest", "")
            missing.append(f"{{{{name: {state.config.name} version: {version}}}{error}}}, ")
        problems = [f"{len(missing)} model(s) did not become available: {{{''.join(missing)}}}"
                    ] if missing else []
        return problems + _label_problems(tuple(s.config for s in states),
                                          {s.config.name: s for s in states})

    def stop(self) -> None:
        """Stop polling (loaded versions stay usable until the process ends)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _poll_loop(self, poll_wait_s: float) -> None:
        while not self._stop.wait(poll_wait_s):
            try:
                self.poll_once()
            except Exception:  # one bad poll must never end hot reload
                log.exception("version poll failed; retrying in %.1fs", poll_wait_s)

    def poll_once(self) -> None:
        """One pass: load new aspired versions, then retire unaspired ones (availability first)."""
        with self._poll_lock:
            with self._lock:
                states = list(self._models.values())
            for state in states:
                self._sync_model(state)

    def _unsettled(self) -> bool:
        with self._lock:
            return any(s.unsettled for s in self._models.values())

    def _sync_model(self, state: _ModelState) -> None:
        """Load the aspired versions; a version that fails is skipped and the policy re-applied.

        So with `latest 1`, a corrupt newest dir leaves the newest *loadable* version served
        (TF Serving would aspire the corrupt one and serve nothing for a fresh model).
        Versions whose dir is still being written are not candidates yet.
        """
        config = state.config
        found = self._discover(state)
        state.seen = {v: f for v, f in state.seen.items() if v in found}
        state.waiting = {v: m for v, m in state.waiting.items() if v in found}
        on_disk, state.unsettled = {}, set()
        for version, path in found.items():
            if version in state.served or self._settled(state, version, path):
                on_disk[version] = path
            else:
                state.unsettled.add(version)
        for _ in range(len(on_disk) + 1):
            loadable = [v for v in sorted(on_disk) if not self._known_bad(state, v, on_disk[v])]
            aspired = aspired_versions(config, loadable)
            pending = [v for v in aspired if v not in state.served]
            if not pending:
                break
            for version in pending:
                self._try_load(state, version, on_disk[version])
        self._retire(state, aspired)

    def _discover(self, state: _ModelState) -> dict[int, Path]:
        """Version dirs on disk; a missing or wrong base path is logged once per change."""
        base = Path(state.config.base_path)
        found, problem = discover_versions(base), ""
        if not base.is_dir():
            problem = f"model {state.config.name}: base path {base} does not exist (yet)"
        elif not found:
            problem = f"model {state.config.name}: base path {base} holds no version dirs " \
                      f"(<base>/<number>/saved_model.pb){meant_dir_hint(base)}"
        if problem and problem == state.path_problem:  # every poll until a version appears
            log.info("model %s: still no version in %s; looking again in the next poll",
                     state.config.name, base)
        elif problem != state.path_problem:
            if problem:
                log.warning("%s; waiting for a version to appear", problem)
            state.path_problem = problem
        return found

    def _settled(self, state: _ModelState, version: int, path: Path) -> bool:
        """Whether a version dir has stopped changing and looks complete.

        Stopped changing: its files are the same as at the last poll, or (seen for the first
        time) none changed within the settle period. Complete: every variables shard its file
        names announce is there, and it has every top-level entry (assets/, assets.extra/, ...)
        of the version being served, since versions of one model come from one exporter. A
        copy that pauses between files is thus not loaded half-written; a dir that stays
        incomplete is loaded anyway after INCOMPLETE_GRACE_S unchanged, with a warning. An
        atomic rename of a finished dir (TF Serving's advice) is loaded at once or at the next
        poll.
        """
        fingerprint = dir_fingerprint(path)
        previous, since = state.seen.get(version, (None, time.monotonic()))
        if previous != fingerprint:
            since = time.monotonic()
        state.seen[version] = (fingerprint, since)
        if not fingerprint:
            return False
        if previous is None:
            newest_ns = max(mtime for _name, _size, mtime in fingerprint)
            if time.time() - newest_ns / 1e9 < self._settle_s:
                return False
        elif previous != fingerprint:
            return False
        missing = missing_entries(path, self._reference_layout(state, path))
        if not missing:
            return True
        if time.monotonic() - since < INCOMPLETE_GRACE_S:
            if state.waiting.get(version) != missing:
                state.waiting[version] = missing
                log.info("model %s version %d: waiting for %s (the served version has them)",
                         state.config.name, version, missing)
            return False
        log.warning("model %s version %d: loading without %s (unchanged for %.0fs)",
                    state.config.name, version, missing, INCOMPLETE_GRACE_S)
        return True

    def _reference_layout(self, state: _ModelState, path: Path) -> set[str]:
        """Top-level entries of the newest served version, when both are SavedModels.

        A TFLite version dir holds one file, named after its variant (`full_int8.tflite` beside
        a served `float32.tflite`): it is never "missing" another version's entries.
        """
        with self._lock:
            served = state.served
            newest = served[max(served)] if served else None
        if newest is None or "tflite" in (newest.model_format, detect_format(path)):
            return set()
        try:
            return {p.name for p in Path(newest.path).iterdir() if not p.name.startswith(".")}
        except OSError:
            return set()

    @staticmethod
    def _known_bad(state: _ModelState, version: int, path: Path) -> bool:
        """Failed before with the same files: not retried until they change."""
        return version in state.failed and state.failed[version] == dir_fingerprint(path)

    def _try_load(self, state: _ModelState, version: int, path: Path) -> None:
        name = state.config.name
        fingerprint = dir_fingerprint(path)
        state.status[version] = VersionStatus(VersionState.LOADING)
        started = time.perf_counter()
        try:
            servable = load_servable(name, version, path, state.config.model_format,
                                     state.config.compute_precision)
            replayed = self._warmup(servable) if self._warmup else 0
        except Exception as e:  # a corrupt or partial dir: log, mark, never serve
            state.failed[version] = fingerprint
            state.status[version] = VersionStatus(
                VersionState.END, _load_error_text(e, state.config), load_error_code(e)
            )
            log.error("model %s version %d at %s failed to load, not served: %s",
                      name, version, path, e)
            return
        state.failed.pop(version, None)
        with self._lock:
            state.served = {**state.served, version: servable}
            state.status[version] = VersionStatus(VersionState.AVAILABLE)
        log.info("model %s version %d is AVAILABLE (loaded in %.2fs, %d warm-up requests)",
                 name, version, time.perf_counter() - started, replayed)
        self._changed()

    def _retire(self, state: _ModelState, aspired: list[int]) -> None:
        """Unload versions no longer aspired, but only once an aspired one is being served."""
        stale = [v for v in state.served if v not in aspired]
        if not stale:
            return
        if aspired and not any(v in state.served for v in aspired):
            return  # availability-preserving: keep the old version until a new one is ready
        with self._lock:
            state.served = {v: s for v, s in state.served.items() if v in aspired}
            for version in stale:
                state.status[version] = VersionStatus(VersionState.END)
        for version in stale:
            log.info("model %s version %d unloaded (no longer aspired)", state.config.name, version)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # ---- queries ----------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Names of the configured models."""
        with self._lock:
            return list(self._models)

    def configs(self) -> tuple[ModelConfig, ...]:
        """The configs of the models being served."""
        with self._lock:
            return tuple(state.config for state in self._models.values())

    def knows_version(self, name: str, version: int) -> bool:
        """Whether `version` of model `name` has a status (loaded, failed or unloaded)."""
        with self._lock:
            state = self._models.get(name)
            return state is not None and version in state.status

    def any_available(self) -> bool:
        """Whether every configured model has at least one servable version."""
        with self._lock:
            return bool(self._models) and all(s.served for s in self._models.values())

    def served_ids(self) -> set[int]:
        """Identities of the versions being served (the batcher closes queues of the rest)."""
        with self._lock:
            return {id(s) for state in self._models.values() for s in state.served.values()}

    def set_warmup(self, warmup: Warmup | None) -> None:
        """Replay warm-up requests through `warmup` before a version is published."""
        self._warmup = warmup

    def resolve(self, name: str, version: int | None, label: str | None) -> Servable:
        """The version that answers a request for (name, version | label | latest).

        Codes and texts follow TF Serving's ServerCore: no name is INVALID_ARGUMENT; an unknown
        model, version, or a model with nothing loaded is NOT_FOUND; an unknown label is
        INVALID_ARGUMENT. Client-sent names are clipped; no server path is ever shown.
        """
        if not name:
            raise ServingStatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "ModelSpec has no name specified.")
        with self._lock:
            state = self._models.get(name)
            if state is None:
                raise not_found(
                    f"Servable not found for request: {_spec_text(name, version, label)}. "
                    f"Known models: {sorted(self._models)[:20]}",
                )
            served = state.served
            labels = dict(state.config.version_labels)
        if label:
            if label not in labels:
                raise ServingStatusError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Unrecognized servable version label: {clip(label)}. Known labels: "
                    f"{sorted(labels)}",
                )
            version = labels[label]
        if version is not None:
            if version not in served:
                raise not_found(
                    f"Servable not found for request: {_spec_text(name, version, label)}. "
                    f"Available versions: {sorted(served)}",
                )
            return served[version]
        if not served:
            raise not_found(
                f"Servable not found for request: {_spec_text(name, None, None)}. Model {name} "
                "is configured but no version of it is loaded (see GetModelStatus)",
            )
        return served[max(served)]

    def status(self, name: str, version: int | None) -> list[tuple[int, VersionStatus]]:
        """GetModelStatus: every known version (or one), newest first as in TF Serving."""
        with self._lock:
            state = self._models.get(name)
            if state is None:
                raise not_found(f"Could not find any versions of model {clip(name)}")
            statuses = dict(state.status)
        if version is not None:
            if version not in statuses:
                raise not_found(
                    f"Could not find version {version} of model {name}. Known versions: "
                    f"{sorted(statuses, reverse=True)}",
                )
            return [(version, statuses[version])]
        if not statuses:
            raise not_found(f"Could not find any versions of model {name}")
        return sorted(statuses.items(), reverse=True)

    # ---- reconfiguration --------------------------------------------------------------------

    def reload_config(self, models: tuple[ModelConfig, ...]) -> None:
        """Apply a new model list (HandleReloadConfigRequest): add, drop, relabel models.

        Labels may only point at versions being served; otherwise nothing of the new config
        is kept for that model's labels and FAILED_PRECONDITION is raised, as in TF Serving.
        """
        with self._poll_lock:
            with self._lock:
                old = {name: state.config for name, state in self._models.items()}
                new_states: dict[str, _ModelState] = {}
                for model in models:
                    state = self._models.get(model.name)
                    if state is None or _paths_differ(state.config, model):
                        state = _ModelState(model)
                    new_states[model.name] = state
            for model in models:  # load new models (old labels kept meanwhile), then check labels
                state = new_states[model.name]
                current = old.get(model.name)
                kept = current.version_labels if state.config is current else {}
                state.config = dataclasses.replace(model, version_labels=kept)
                self._sync_model(state)
            problems = _label_problems(models, new_states)
            with self._lock:
                for model in models:
                    state = new_states[model.name]
                    keep = old.get(model.name) if problems else None
                    labels = keep.version_labels if keep is not None else (
                        {} if problems else model.version_labels
                    )
                    state.config = dataclasses.replace(model, version_labels=labels)
                self._models = new_states
        self._changed()
        if problems:
            raise ServingStatusError(grpc.StatusCode.FAILED_PRECONDITION, "; ".join(problems))


def _label_problems(models: tuple[ModelConfig, ...], states: dict[str, _ModelState]) -> list[str]:
    problems = []
    for model in models:
        served = states[model.name].served
        for label, version in model.version_labels.items():
            if version not in served:
                problems.append(
                    f"Request to assign label {label!r} to version {version} of model "
                    f"{model.name}, which is not currently available for inference "
                    f"(available: {sorted(served)})"
                )
    return problems


def _paths_differ(a: ModelConfig, b: ModelConfig) -> bool:
    return Path(a.base_path).resolve() != Path(b.base_path).resolve()


def _spec_text(name: str, version: int | None, label: str | None) -> str:
    """How TF Serving prints a ServableRequest: Latest(m) / Specific(m, 3)."""
    name = clip(name)
    if version is not None:
        return f"Specific({name}, {version})"
    if label:
        return f"Label({name}, {clip(label)})"
    return f"Latest({name})"


def _load_error_text(error: Exception, config: ModelConfig) -> str:
    """A load error for GetModelStatus, without server paths.

    The base path is shown as `<base_path>`, other absolute paths as `<path>`, so clients never
    learn the server's file system.
    """
    text = f"{type(error).__name__}: {getattr(error, 'message', None) or error}"
    base = Path(config.base_path)
    for path in sorted({str(base), str(base.resolve())}, key=len, reverse=True):
        text = text.replace(path, "<base_path>")
    return scrub_paths(text)[:2000]


