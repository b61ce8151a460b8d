"""What `ampflow serve` checks before it loads anything: base paths that can serve, free ports.

A base path one level off is the commonest way to start a server that serves nothing: the
version dir itself (`runs/x/serving/ampflow/1`), the store above the model
(`runs/x/serving`), or a folder no version has reached. TF Serving then logs, listens and
answers NOT_FOUND forever; here each is refused in one line naming the path that would work,
before TensorFlow is even imported. A port already in use is found the same way, by binding it,
so the error names the flag (`--port`, `--rest-api-port`, `--metrics-port`) instead of arriving
seconds later as gRPC's C++ log line.

Nothing here imports TensorFlow or gRPC: the CLI runs it first.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from ampflow.errors import ConfigError
from ampflow.serving.compute_precision import check_supported
from ampflow.serving.model_format import SAVED_MODEL_PB, parse_version_name, version_dirs

WAIT_FLAG = "--wait-for-base-path"
_TFLITE_SUFFIX = ".tflite"


def check_server(config) -> None:
    """Every model's base path and every port of a `ServerConfig`, before anything loads."""
    for model in config.models:
        check_base_path(model.name, model.base_path, wait=config.wait_for_base_path)
        check_supported(model.compute_precision)  # a bf16 server on a CPU without bf16
    ports = {"--port": config.port, "--rest-api-port": config.rest_api_port}
    if config.metrics_port != config.rest_api_port:  # else the REST app serves the metrics
        ports["--metrics-port"] = config.metrics_port
    check_ports_free(config.host, ports)


def check_base_path(name: str, base: Path, *, wait: bool) -> None:
    """Refuse a base path that cannot serve model `name`; `wait` allows one not filled yet.

    A version dir or a store of models is refused even with `wait`: no deploy will ever put
    a version where the server looks.
    """
    base = Path(base)
    if not base.is_dir():
        if wait:
            return
        raise ConfigError(
            f"model base path must be an existing directory. Received: model {name} "
            f"base_path={base} (not found; pass {WAIT_FLAG} to start anyway and load it once "
            "it appears)")
    if _holds_model_files(base):
        raise ConfigError(_model_files_message(name, base))
    if version_dirs(base):
        return
    stores = _children_with_versions(base)
    if stores:
        raise ConfigError(_store_message(name, base, stores))
    if not wait:
        raise ConfigError(
            f"model base path must hold numbered version dirs (<base>/<number>/"
            f"{SAVED_MODEL_PB}). Received: model {name} base_path={base}, which holds none "
            f"(export or deploy a version there first, or pass {WAIT_FLAG} to serve it once "
            "a deploy writes one)")


def _holds_model_files(path: Path) -> bool:
    """A SavedModel or a TFLite file right in `path`: a version dir, not a base path."""
    if (path / SAVED_MODEL_PB).is_file():
        return True
    try:
        return any(p.suffix == _TFLITE_SUFFIX and p.is_file() for p in path.iterdir())
    except OSError:
        return False


def _model_files_message(name: str, base: Path) -> str:
    version = parse_version_name(base.name)
    if version is not None:
        return (f"model base path must be the dir that holds the version dirs, not one of "
                f"them. Received: model {name} base_path={base}, version {version} itself; "
                f"use --model-base-path {base.parent}")
    return (f"model base path must hold numbered version dirs, not the model's files. "
            f"Received: model {name} base_path={base}, which holds the model itself; move "
            f"them into {base / '1'} and keep --model-base-path {base}")


def _children_with_versions(base: Path) -> list[Path]:
    try:
        children = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    return [child for child in children if version_dirs(child)]


def _store_message(name: str, base: Path, stores: list[Path]) -> str:
    meant = stores[0]
    for store in stores:  # the model of the same name, when the store has it
        if store.name == name:
            meant = store
    others = f" (it holds the models {[s.name for s in stores]})" if len(stores) > 1 else ""
    return (f"model base path must hold numbered version dirs. Received: model {name} "
            f"base_path={base}, a store of models{others}; use --model-base-path {meant}, "
            f"which holds versions {sorted(version_dirs(meant))}")


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Bind each nonzero port of `ports` ({flag: port}) on `host`, then let it go.

    SO_REUSEADDR as servers set it, so a port whose last server just closed (TIME_WAIT) is
    free and only a listening socket makes it busy.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for flag, port in ports.items():
        if not port:
            continue
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as e:
                busy = e.errno == errno.EADDRINUSE
                raise ConfigError(
                    f"{flag} must be a port free on {host}. Received: {flag} {port}, "
                    f"{'already in use (another server?)' if busy else e.strerror}; pick "
                    f"another {flag} or stop what holds it") from e
