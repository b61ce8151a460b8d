"""`ampflow-client predict|status|metadata|health`: query a served model from a shell.

`predict` sends image files as they are (their bytes) to a signature whose input is a string
(`image_bytes`, chosen by default when every file is an image and the model has it), and as
pixels otherwise (.npy arrays, or pictures decoded with Pillow). With `--text` / `--text-file`
it sends raw texts to the model's text signature (one string input named `text`, found in its
metadata), which tokenizes them in the graph.
"""

from __future__ import annotations

import argparse
import json
import sys

from ampflow_client._common import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    read_texts,
    takes_text,
    text_label,
    text_signature,
)
from ampflow_client.errors import ClientError, ConfigError

IMAGE_BYTES_SIGNATURE = "image_bytes"  # ampflow's encoded-image signature (docs/ARTIFACTS.md)


def build_parser() -> argparse.ArgumentParser:
    """The parser of `ampflow-client`."""
    parser = argparse.ArgumentParser(prog="ampflow-client", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--host", default="127.0.0.1", help="server host")
    common.add_argument("--port", type=int, default=None,
                        help="server port (default: 8500 for grpc, 8501 for rest)")
    common.add_argument("--rest", action="store_true", help="TF Serving's REST API, not gRPC")
    common.add_argument("--model-name", default="ampflow", help="served model name")
    common.add_argument("--version", type=int, default=None, help="model version")
    common.add_argument("--timeout-s", type=float, default=10.0, help="deadline of each call")
    common.add_argument("--retries", type=int, default=3, help="retries on UNAVAILABLE")
    common.add_argument("--tls-ca", default=None, help="CA (PEM) to verify the server")
    common.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    common.add_argument("--tls-key", default=None, help="client private key (mutual TLS)")
    common.add_argument("--tls-server-name", default=None,
                        help="name to check in the server certificate (default: --host)")
    predict = sub.add_parser("predict", parents=[common],
                             help="top-k classes of image files or of texts")
    predict.add_argument("inputs", nargs="*", metavar="FILE",
                         help="JPEG/PNG/BMP/GIF files (told by content) or .npy arrays")
    predict.add_argument("--text", action="append", default=[],
                         help="a raw text for a text model (repeatable)")
    predict.add_argument("--text-file", default=None,
                         help="a file of texts for a text model, one per line")
    predict.add_argument("--signature", default=None,
                         help=f"default: {IMAGE_BYTES_SIGNATURE} when every input is an image "
                              f"and the model has it, else {DEFAULT_SIGNATURE}")
    predict.add_argument("--version-label", default=None, help="e.g. stable or canary")
    predict.add_argument("--top-k", type=int, default=3, help="classes to print per input")
    predict.add_argument("--output", default="probabilities",
                         help="output holding class probabilities")
    predict.add_argument("--labels", default=None, help="labels.txt, one class per line")
    for name, text in (("status", "a model's version states"),
                       ("metadata", "a model's signatures, as JSON"),
                       ("health", "the gRPC health service's answer (gRPC only)")):
        sub.add_parser(name, parents=[common], help=text)
    return parser


def make_client(args: argparse.Namespace):
    """The gRPC or REST client the flags ask for."""
    from ampflow_client.grpc_client import Client
    from ampflow_client.rest import RestClient

    port = args.port if args.port is not None else (8501 if args.rest else 8500)
    if not 1 <= port <= 65535:
        raise ConfigError(f"port must be in 1..65535. Received: port={port}")
    cls = RestClient if args.rest else Client
    return cls(f"{args.host}:{port}", timeout_s=args.timeout_s, retries=args.retries,
               tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
               tls_server_name=args.tls_server_name)


def predict(client, args: argparse.Namespace) -> list[str]:
    """The lines `predict` prints: a header, then one line per input (or .npy row)."""
    from ampflow_client.images import is_image_file, load_images, read_encoded_images, top_k

    if args.top_k < 1:
        raise ConfigError(f"top_k must be >= 1. Received: top_k={args.top_k}")
    labels = None
    if args.labels:
        try:
            with open(args.labels) as f:
                labels = [line.strip() for line in f if line.strip()]
        except OSError as e:
            raise ConfigError(f"labels must be a readable text file. Received: "
                              f"{args.labels}") from e
    sigs = client.metadata(args.model_name, args.version)
    if args.text or args.text_file is not None:
        return predict_texts(client, args, sigs, labels)
    if not args.inputs:
        raise ConfigError("give image files, --text or --text-file. Received: none")
    signature = args.signature or (
        IMAGE_BYTES_SIGNATURE if IMAGE_BYTES_SIGNATURE in sigs
        and all(is_image_file(p) for p in args.inputs) else DEFAULT_SIGNATURE)
    if signature not in sigs:
        raise ConfigError(f"signature {signature!r} not in model {args.model_name!r}. "
                          f"Available: {sorted(sigs)}")
    if sigs[signature].method_name == CLASSIFY_METHOD:
        raise ConfigError(f"signature {signature!r} is a classify signature: use "
                          "`ampflow predict` or Client.classify with tf.Examples")
    if takes_text(sigs[signature]):
        raise ConfigError(f"signature {signature!r} takes texts (input 'text'), not files. "
                          "Received: files (use --text or --text-file)")
    specs = client.input_specs(args.model_name, args.version, signature)
    if len(specs) != 1:
        raise ConfigError(f"predict needs a single-input signature. Received: inputs "
                          f"{sorted(specs)}")
    (spec,) = specs.values()
    if spec.dtype is not None and spec.dtype.kind == "O":
        batch = read_encoded_images(args.inputs)
    else:
        batch = load_images(args.inputs, spec.shape)
    result = client.predict(args.model_name, batch, args.version, signature,
                            version_label=args.version_label)
    if args.output not in result.outputs:
        raise ConfigError(f"output {args.output!r} not in the response. Received: "
                          f"{sorted(result.outputs)} (use --output)")
    if labels is None:  # the names the model ships, when it does
        labels = client.class_names(args.model_name, result.version)
    rows = top_k(result.outputs[args.output], args.top_k, labels)
    names = args.inputs if len(rows) == len(args.inputs) else [f"row {i}"
                                                                for i in range(len(rows))]
    lines = [f"model {args.model_name} version {result.version} signature {signature}"]
    for name, row in zip(names, rows, strict=True):
        lines.append(f"{name}: " + ", ".join(f"{label} ({cid}) {p:.4f}" for cid, label, p in row))
    return lines


def predict_texts(client, args: argparse.Namespace, sigs: dict,
                  labels: list[str] | None) -> list[str]:
    """`predict --text/--text-file`: raw texts to the text signature, one line per text."""
    from ampflow_client.images import top_k

    if args.inputs:
        raise ConfigError(f"give files or texts, not both. Received: {len(args.inputs)} files "
                          "and --text/--text-file")
    texts = read_texts(args.text, args.text_file)
    signature = args.signature or text_signature(sigs)
    if signature is None:
        raise ConfigError(f"model {args.model_name!r} has no signature taking text (one string "
                          f"input named 'text'). Signatures: {sorted(sigs)} (use --signature)")
    if signature not in sigs:
        raise ConfigError(f"signature {signature!r} not in model {args.model_name!r}. "
                          f"Available: {sorted(sigs)}")
    result = client.predict(args.model_name, texts, args.version, signature,
                            version_label=args.version_label)
    if args.output not in result.outputs:
        raise ConfigError(f"output {args.output!r} not in the response. Received: "
                          f"{sorted(result.outputs)} (use --output)")
    if labels is None:
        labels = client.class_names(args.model_name, result.version)
    rows = top_k(result.outputs[args.output], args.top_k, labels)
    lines = [f"model {args.model_name} version {result.version} signature {signature}"]
    for text, row in zip(texts, rows, strict=True):
        lines.append(f"{text_label(text)}: " + ", ".join(f"{label} ({cid}) {p:.4f}"
                                                        for cid, label, p in row))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ampflow-client`; errors are one line on stderr and exit status 1."""
    args = build_parser().parse_args(argv)
    try:
        with make_client(args) as client:
            if args.command == "predict":
                print("\n".join(predict(client, args)))
            elif args.command == "status":
                for row in client.status(args.model_name, args.version):
                    error = f"  {row['error_message']}" if row["error_message"] else ""
                    print(f"version {row['version']}: {row['state']}{error}")
            elif args.command == "metadata":
                from google.protobuf import json_format

                sigs = client.metadata(args.model_name, args.version)
                print(json.dumps({k: json_format.MessageToDict(v) for k, v in sigs.items()},
                                 indent=2, sort_keys=True))
            elif args.command == "health":
                if args.rest:
                    raise ConfigError("health is a gRPC service; TF Serving's REST API has "
                                      "none (use status). Received: --rest")
                print(client.health())
            sys.stdout.flush()  # a closed pipe is found here, not at exit after main
    except ClientError as e:
        print(f"ampflow-client: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `ampflow-client metadata | head -1`: the reader went away
        return closed_pipe()
    return 0


def closed_pipe() -> int:
    """End quietly, as a shell's SIGPIPE would (exit 141).

    Stdout is pointed at /dev/null so that Python's own flush at exit does not fail again
    and print a traceback.
    """
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a replaced stdout without a file descriptor
        pass
    return 141


if __name__ == "__main__":
    raise SystemExit(main())
