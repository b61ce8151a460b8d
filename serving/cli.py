"""`ampflow serve`, `ampflow predict`, `ampflow model-metadata`, `ampflow model-status`.

Thin shells: flags -> a validated config -> the library call. `serve` runs the local server,
or the real `tensorflow_model_server` when it is on PATH *and* can honour every flag given
(`--server auto`; with the default flags it cannot: it listens on every interface and accepts
config reloads from anyone), or always with `--server tf-serving`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
from pathlib import Path

from ampflow.cliutil import HelpFormatter, add_config_arguments, config_from_args
from ampflow.errors import ConfigError, ServingError
from ampflow.serving.model_format import (
    DEFAULT_MODEL_NAME,
    DEFAULT_SIGNATURE,
    IMAGE_BYTES_SIGNATURE,
    MAX_VERSION,
    PROBABILITIES_OUTPUT,
    parse_version_name,
)

log = logging.getLogger(__name__)

_FMT = HelpFormatter


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the serving commands to the top-level `ampflow` parser."""
    serve = subparsers.add_parser(
        "serve", help="Serve SavedModels and TFLite models over TF Serving's and KServe V2's "
        "gRPC and REST APIs.", formatter_class=_FMT,
        description="Serve models in TF Serving's layout (<base>/<version>/) over TF Serving's "
                    "gRPC API (PredictionService, ModelService, health, reflection), KServe's "
                    "V2 gRPC API on the same port, and both REST APIs with --rest-api-port. "
                    "The local server, or tensorflow_model_server where --server allows it.")
    _add_serve_flags(serve)
    serve.set_defaults(func=_serve)

    client_parent = argparse.ArgumentParser(add_help=False)
    _add_client_flags(client_parent)
    predict = subparsers.add_parser(
        "predict", parents=[client_parent], formatter_class=_FMT,
        help="send images (JPEG/PNG/BMP/GIF/.npy) or texts to a served model and print the "
             "top-k classes",
        description="Predict over gRPC (or REST: --rest). Input keys, dtype and shape come from "
                    "the model's metadata. Image files go as they are (their bytes) to a "
                    f"signature with a string input, such as `{IMAGE_BYTES_SIGNATURE}`, which "
                    "decodes them as training did; to a numeric one they go as pixels decoded "
                    "here. Texts (--text, --text-file) go as they are to a text model's "
                    "signature taking a string input named `text` (found in its metadata), "
                    "which tokenizes them in the graph. See also `model-metadata` and "
                    "`model-status`.")
    predict.add_argument("inputs", nargs="*",
                         help="image files (JPEG/PNG/BMP/GIF, told by content) or .npy arrays")
    predict.add_argument("--text", action="append", default=[],
                         help="a raw text for a text model (repeatable)")
    predict.add_argument("--text-file", default=None,
                         help="a file of texts for a text model, one per line (blank lines "
                              "skipped; a line that is not UTF-8 is sent as its bytes)")
    predict.add_argument("--signature", default=None,
                         help=f"signature name (default: {IMAGE_BYTES_SIGNATURE} when every "
                              "input is an image file and the model has that signature, else "
                              f"{DEFAULT_SIGNATURE})")
    predict.add_argument("--version-label", default=None, help="e.g. stable or canary")
    predict.add_argument("--top-k", type=int, default=3, help="classes to print per input")
    predict.add_argument("--output", default=PROBABILITIES_OUTPUT,
                         help="output holding class probabilities")
    predict.add_argument("--labels", default=None,
                         help="labels.txt (one class name per line; the model's assets/labels.txt)")
    predict.set_defaults(func=_predict)
    for name, func, text in (("model-metadata", _metadata, "print a model's signatures"),
                             ("model-status", _status, "print a model's version states")):
        sub = subparsers.add_parser(name, parents=[client_parent], formatter_class=_FMT,
                                    help=text, description=text + " (GetModel* over gRPC)")
        sub.set_defaults(func=func)


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `serve`: one per config field (cliutil), defaults and help from the field.

    Hand-written only where no field says it: the single model's name and base path (a
    `ModelConfig` needs both, the CLI neither when a config file is given), the repeatable
    LABEL=VERSION and root flags, the TLS files (a `TlsConfig` or none) and `--server`.
    """
    from ampflow.serving import config as cfg

    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                   help="served model name (single-model mode; as export --model-name)")
    p.add_argument("--model-base-path", default=None,
                   help="dir holding <version>/ SavedModel dirs (single-model mode)")
    add_config_arguments(p, cfg.ModelConfig, exclude=("name", "base_path", "version_labels"))
    p.add_argument("--version-label", action="append", default=[], metavar="LABEL=VERSION",
                   help="version label, e.g. stable=1 (repeatable)")
    add_config_arguments(p, cfg.ServerConfig, exclude=(
        "models", "tls", "batching", "connection_limits", "reload_config_roots", "max_workers",
        "grpc_channel_arguments"))  # TF Serving's flag alone sets it (tf_serving_binary.py)
    add_config_arguments(p, cfg.BatchingConfig)
    p.add_argument("--reload-config-root", action="append", default=[], metavar="DIR",
                   help="with --allow-reload-config: base paths a reload may name must lie "
                        "under one of these dirs (repeatable; none: only the configured ones)")
    p.add_argument("--tls-cert", default=None, help="server certificate (PEM); enables TLS")
    p.add_argument("--tls-key", default=None, help="server private key (PEM)")
    p.add_argument("--tls-client-ca", default=None,
                   help="CA (PEM) that client certificates must chain to (mutual TLS)")
    _add_connection_limit_flags(p)
    p.add_argument("--server", default="auto", choices=["auto", "local", "tf-serving"],
                   help="auto: tensorflow_model_server if on PATH and it can honour every flag "
                        "(it listens on all interfaces), else the local server")
    from ampflow.serving.tf_serving_binary import add_tf_serving_flags

    add_tf_serving_flags(p)  # TF Serving's own spellings of the flags above


def _add_connection_limit_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ConnectionLimits field, its default and help read from the field."""
    from ampflow.serving.config import ConnectionLimits, flag_name

    group = p.add_argument_group("connection limits (slow clients, idle connections, floods)")
    for f in dataclasses.fields(ConnectionLimits):
        group.add_argument(flag_name(f.name), dest=f.name, type=type(f.default),
                           default=f.default, metavar="S" if f.name.endswith("_s") else "N",
                           help=f.metadata["help"] + " (default: %(default)s)")


def _connection_limits(args: argparse.Namespace):
    from ampflow.serving.config import ConnectionLimits

    return ConnectionLimits(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(ConnectionLimits)})


def serve_config_from_args(args: argparse.Namespace):
    """Flags -> a validated `ServerConfig` (shared by the local server and the real binary)."""
    from ampflow.serving import config as cfg

    if args.model_config_file:
        models = tuple(dataclasses.replace(m, model_format=args.model_format,
                                           compute_precision=args.compute_precision)
                       for m in cfg.load_model_config_file(args.model_config_file))
    elif args.model_base_path:
        models = (config_from_args(cfg.ModelConfig, args, name=args.model_name,
                                   base_path=Path(args.model_base_path),
                                   version_labels=_parse_labels(args.version_label)),)
    else:
        raise ConfigError("give --model-base-path or --model-config-file. Received: neither")
    # TF Serving's --monitoring_config_file asks for the metrics on the REST port
    metrics_port = args.rest_api_port if getattr(args, "tf_serving_metrics_on_rest_port",
                                                 False) else args.metrics_port
    return config_from_args(
        cfg.ServerConfig, args, models=models, tls=_tls(args), metrics_port=metrics_port,
        batching=config_from_args(cfg.BatchingConfig, args),
        connection_limits=_connection_limits(args),
        reload_config_roots=tuple(Path(r) for r in args.reload_config_root))


def _tls(args: argparse.Namespace):
    from ampflow.serving import config as cfg

    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ConfigError("--tls-cert and --tls-key must be given together. Received: "
                              f"tls_cert={args.tls_cert}, tls_key={args.tls_key}")
        return cfg.TlsConfig(Path(args.tls_cert), Path(args.tls_key),
                             Path(args.tls_client_ca) if args.tls_client_ca else None)
    if args.tls_client_ca:
        raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key. Received: only "
                          f"tls_client_ca={args.tls_client_ca}")
    return None


def _parse_labels(items: list[str]) -> dict[str, int]:
    """LABEL=VERSION items; VERSION is a version dir's name (model_format's one rule)."""
    labels = {}
    for item in items:
        label, sep, version = item.partition("=")
        number = parse_version_name(version.strip()) if sep else None
        if number is None:
            raise ConfigError(f"--version-label must be LABEL=VERSION, VERSION a number "
                              f"0..{MAX_VERSION}. Received: {item!r}")
        labels[label.strip()] = number
    return labels


def _serve(args: argparse.Namespace) -> int:
    from ampflow.serving import preflight, tf_serving_binary

    config = serve_config_from_args(args)
    binary = tf_serving_binary.find_binary() if args.server != "local" else None
    if args.server == "tf-serving" and binary is None:
        raise ServingError("--server tf-serving needs tensorflow_model_server on PATH. "
                           "Received: not found (use --server local)")
    if binary is not None:
        reasons = tf_serving_binary.cannot_honour(config)
        if config.workers > 1:  # the binary is one multi-threaded C++ process: no GIL to split
            reasons.append(f"--workers {config.workers} (it is one multi-threaded process)")
        if not reasons:
            preflight.check_server(config)
            tf_serving_binary.exec_binary(config, binary)
        if args.server == "tf-serving":
            raise ConfigError("--server tf-serving cannot run with these flags: "
                              f"{'; '.join(reasons)}. Received: {binary}")
        log.warning("not using %s (on PATH): %s; serving with the local server instead",
                    binary, "; ".join(reasons))
    # before TensorFlow is imported (seconds) or any model loaded: a path one level off or a
    # busy port is one line at once (the server checks again, for its library callers)
    preflight.check_server(config)
    if config.workers > 1:  # a supervisor that never imports TensorFlow (serving/workers.py)
        from ampflow.serving.workers import supervise

        return supervise(config)
    from ampflow.serving.server import serve_forever

    return serve_forever(config)


def _add_client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="server host")
    p.add_argument("--port", type=int, default=None,
                   help="server port (default: 8500 for grpc, 8501 for rest)")
    p.add_argument("--protocol", default="grpc", choices=["grpc", "rest"],
                   help="TF Serving's gRPC API or its REST API")
    p.add_argument("--rest", dest="protocol", action="store_const", const="rest",
                   help="the same as --protocol rest")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME,
                   help="served model name (as export/serve --model-name)")
    p.add_argument("--version", type=int, default=None, help="model version (default: latest)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="deadline of each call")
    p.add_argument("--retries", type=int, default=3, help="retries on UNAVAILABLE")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="first wait up to this long for a version of the model to be AVAILABLE "
                        "(a server that is still starting); 0 = do not wait")
    p.add_argument("--tls-ca", default=None, help="CA (PEM) to verify the server; enables TLS")
    p.add_argument("--tls-cert", default=None, help="client certificate (PEM) for mutual TLS")
    p.add_argument("--tls-key", default=None, help="client private key (PEM)")
    p.add_argument("--tls-server-name", default=None,
                   help="name to check in the server certificate (default: --host)")


def _make_client(args: argparse.Namespace):
    from ampflow.serving.client import PredictionClient
    from ampflow.serving.rest_client import RestClient

    if args.port is None:
        args.port = 8501 if args.protocol == "rest" else 8500
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"port must be in 1..65535. Received: port={args.port}")
    if not args.wait_s >= 0:
        raise ConfigError(f"wait_s must be >= 0. Received: wait_s={args.wait_s}")
    if args.protocol == "rest":
        return RestClient(f"{args.host}:{args.port}", timeout_s=args.timeout_s,
                          retries=args.retries, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                          tls_key=args.tls_key, tls_server_name=args.tls_server_name)
    return PredictionClient(f"{args.host}:{args.port}", timeout_s=args.timeout_s,
                            retries=args.retries, tls_ca=args.tls_ca, tls_cert=args.tls_cert,
                            tls_key=args.tls_key, tls_server_name=args.tls_server_name)


_PROTOCOL_NAMES = {"grpc": "gRPC", "rest": "REST"}


@contextlib.contextmanager
def _client(args: argparse.Namespace):
    """The client for the flags; a server that cannot be reached is said in words."""
    from ampflow.serving.client import RpcError

    client = _make_client(args)
    try:
        with client:
            yield client
    except RpcError as e:
        if e.code.name != "UNAVAILABLE" or "connect" not in e.details.lower():
            raise
        port_flag = "--rest-api-port" if args.protocol == "rest" else "--port"
        raise ServingError(
            f"nothing answers at {args.host}:{args.port} over {_PROTOCOL_NAMES[args.protocol]}: is "
            f"`ampflow serve` running there (its {port_flag} {args.port})? ({e.details})"
        ) from e


def _predict(args: argparse.Namespace) -> int:
    from ampflow.serving.client import load_images, read_encoded_images, takes_text, top_k
    from ampflow.serving.model_format import CLASSIFY_METHOD

    if args.top_k < 1:
        raise ConfigError(f"top_k must be >= 1. Received: top_k={args.top_k}")
    labels = _read_labels(args.labels)
    texts = _texts(args)
    with _client(args) as client:
        _wait_until_available(client, args)
        if texts is not None:
            return _predict_texts(client, args, texts, labels)
        args.signature = args.signature or _default_signature(client, args)
        # (signature_defs, not signature(): no TensorFlow import to read the method and specs)
        specs = client.input_specs(args.model_name, args.version, args.signature)
        signature = client.signature_defs(args.model_name, args.version)[args.signature]
        if signature.method_name == CLASSIFY_METHOD:
            return _classify(client, args)
        if len(specs) != 1:
            raise ServingError(f"`ampflow predict` needs a single-input signature. Received: "
                               f"inputs {sorted(specs)}")
        (spec,) = specs.values()
        if takes_text(signature):
            raise ConfigError(f"signature {args.signature!r} takes texts (input 'text'), not "
                              "files. Received: files (use --text or --text-file)")
        if spec.dtype is not None and spec.dtype.kind == "O":  # a string input: the files
            batch = read_encoded_images(args.inputs)
        elif spec.dtype is not None and spec.dtype.kind in "fiu":
            batch = load_images(args.inputs, spec.shape)
        else:
            raise ConfigError(
                f"`ampflow predict` sends images as numbers or as encoded files, so signature "
                f"{args.signature!r} must take a numeric or a string input. Received: input "
                f"{spec.name!r} of type {'unknown' if spec.dtype is None else spec.dtype.name} "
                "(use --signature)")
        result = client.predict(args.model_name, batch, args.version, args.signature,
                                version_label=args.version_label)
        if args.output not in result.outputs:
            raise ServingError(f"output {args.output!r} not in the response. Received: "
                               f"{sorted(result.outputs)} (use --output)")
        if labels is None:  # the names the model ships, when it does
            labels = client.class_names(args.model_name, result.version)
    print(f"model {args.model_name} version {result.version} signature {result.signature}")
    rows = top_k(result.outputs[args.output], args.top_k, labels)
    _print_rows(args.inputs, rows)
    return 0


def _texts(args: argparse.Namespace) -> list[str | bytes] | None:
    """The texts of --text/--text-file (None: images); files and texts together refused."""
    from ampflow.serving.client import read_texts

    if not args.text and args.text_file is None:
        if not args.inputs:
            raise ConfigError("give image files, --text or --text-file. Received: none")
        return None
    if args.inputs:
        raise ConfigError(f"give image files or texts, not both. Received: {len(args.inputs)} "
                          "files and --text/--text-file")
    return read_texts(args.text, args.text_file)


def _predict_texts(client, args: argparse.Namespace, texts: list, labels) -> int:
    """Raw texts to the model's text signature; one line per text, as images get."""
    from ampflow.serving.client import text_label, text_signature, top_k

    sigs = client.signature_defs(args.model_name, args.version)
    signature = args.signature or text_signature(sigs)
    if signature is None:
        raise ConfigError(f"model {args.model_name!r} has no signature taking text (one string "
                          f"input named 'text'). Received: signatures {sorted(sigs)} (use "
                          "--signature, or send images)")
    result = client.predict(args.model_name, texts, args.version, signature,
                            version_label=args.version_label)
    if args.output not in result.outputs:
        raise ServingError(f"output {args.output!r} not in the response. Received: "
                           f"{sorted(result.outputs)} (use --output)")
    if labels is None:
        labels = client.class_names(args.model_name, result.version)
    print(f"model {args.model_name} version {result.version} signature {signature}")
    rows = top_k(result.outputs[args.output], args.top_k, labels)
    _print_rows([text_label(t) for t in texts], rows)
    return 0


def _default_signature(client, args: argparse.Namespace) -> str:
    """`image_bytes` when every input is an image file and the model has that signature.

    The server then decodes the files exactly as training did. Otherwise `serving_default`
    (pixels decoded here).
    """
    from ampflow.serving.client import is_image_file

    if all(is_image_file(path) for path in args.inputs) and \
            IMAGE_BYTES_SIGNATURE in client.signature_defs(args.model_name, args.version):
        return IMAGE_BYTES_SIGNATURE
    return DEFAULT_SIGNATURE


def _classify(client, args: argparse.Namespace) -> int:
    """Predict through a `tensorflow/serving/classify` signature.

    Images go as tf.Examples (the model contract's `image` float_list feature); the top-k
    come from the returned scores.
    """
    from ampflow.serving.client import load_images

    images = load_images(args.inputs, _image_shape(client, args))
    result = client.classify(args.model_name, images, args.version, args.signature,
                             version_label=args.version_label)
    print(f"model {args.model_name} version {result.version} signature {args.signature}")
    rows = [sorted(((i, label, score) for i, (label, score) in enumerate(row)),
                   key=lambda r: -r[2])[:args.top_k] for row in result.classes]
    _print_rows(args.inputs, rows)
    return 0


def _wait_until_available(client, args: argparse.Namespace) -> None:
    """With --wait-s: poll the model's status (either API) until a version is AVAILABLE.

    One line says what it waits for, once the first poll finds no version ready; the polls
    themselves print nothing (as TF Serving's clients): each is one call without the client's
    retries, whose `attempt i/N` warnings were ten lines before the answer. Giving up is the
    one error.
    """
    import time

    if args.wait_s <= 0:
        return
    deadline, said = time.monotonic() + args.wait_s, False
    last, retries, client.retries = "no answer yet", client.retries, 0  # the loop retries
    try:
        while time.monotonic() < deadline:
            try:
                states = client.status(args.model_name, args.version)
            except ServingError as e:  # not listening yet, or the model not loaded yet
                last = str(e).splitlines()[0]
            else:
                if any(row["state"] == "AVAILABLE" for row in states):
                    return
                last = ", ".join(f"version {row['version']}: {row['state']}" for row in states)
            if not said:
                log.info("waiting up to %gs for model %r at %s:%d to be AVAILABLE",
                         args.wait_s, args.model_name, args.host, args.port)
                said = True
            time.sleep(0.2)
    finally:
        client.retries = retries
    raise ServingError(f"model {args.model_name!r} at {args.host}:{args.port} was not "
                       f"AVAILABLE within --wait-s {args.wait_s:g}. Last: {last}")


def _image_shape(client, args: argparse.Namespace) -> tuple[int, ...] | None:
    """The image shape a classify signature expects (it only says "serialized Examples").

    Read from the same model's single-input `serving_default` signature when it has one
    ([-1, H, W, C]: images are resized to it); else None (images are sent as they are).
    """
    specs = client.input_specs(args.model_name, args.version) if DEFAULT_SIGNATURE in \
        client.signature_defs(args.model_name, args.version) else {}
    if len(specs) == 1:
        (spec,) = specs.values()
        if spec.shape is not None and len(spec.shape) == 4:
            return spec.shape
    return None


def _print_rows(inputs: list[str], rows) -> None:
    # one row per image: a .npy file may hold a whole batch
    names = inputs if len(rows) == len(inputs) else [f"row {i}" for i in range(len(rows))]
    for name, row in zip(names, rows, strict=True):
        best = ", ".join(f"{label} ({cid}) {p:.4f}" for cid, label, p in row)
        print(f"{name}: {best}")


def _read_labels(path: str | None) -> list[str] | None:
    if path is None:
        return None
    try:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError as e:
        raise ConfigError(f"labels must be a readable text file. Received: {path}") from e


def _metadata(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    with _client(args) as client:
        _wait_until_available(client, args)
        sigs = client.signature_defs(args.model_name, args.version)
    print(json.dumps({name: json_format.MessageToDict(sig) for name, sig in sigs.items()},
                     indent=2, sort_keys=True))
    return 0


def _status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _wait_until_available(client, args)
        rows = client.status(args.model_name, args.version)
    for row in rows:
        error = f"  {row['error_message']}" if row["error_message"] else ""
        print(f"version {row['version']}: {row['state']}{error}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m ampflow.serving.cli`: the serving commands alone, same behaviour as `ampflow`.

    Useful where only the serving side is wanted (a serving container, tests that must not
    depend on the other steps' commands).
    """
    import sys

    from ampflow.command import main as run_command

    return run_command(argv, [sys.modules[__name__]])


if __name__ == "__main__":
    from ampflow.task_exit import exit_command

    exit_command(main())
