"""Generate serving/grpc_predict_v2_pb2.py from the vendored grpc_predict_v2.proto.

The module registers its file in a private descriptor pool (`_POOL`, made in the module
itself) instead of protobuf's default pool: tritonclient's `grpc_service.proto` and kserve's
own `grpc_predict_v2_pb2` define the same `inference.*` message names in the default pool, and
a second definition there fails at import, so the server stays importable beside either.
The proto file name becomes `ampflow/serving/grpc_predict_v2.proto`; the package (`inference`),
messages, field numbers and service name are KServe's, so the wire format and the method paths
(`/inference.GRPCInferenceService/ModelInfer`) are the protocol's. Only messages are
generated: the server registers the service by hand (serving/protocols/v2_grpc.py).

    python -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.76.0
    /tmp/protoc/bin/python serving/protos/generate_v2_pb2.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.76.0"  # the version clients/python generates with (protobuf >= 6.31.1)
HERE = Path(__file__).resolve().parent
PROTO = HERE / "grpc_predict_v2.proto"
TARGET = HERE.parent / "grpc_predict_v2_pb2.py"
VIRTUAL_PATH = "ampflow/serving/grpc_predict_v2.proto"
_ANCHOR = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
_POOL_LINES = ("# A private pool: the `inference` names may already be in the default pool "
               "(tritonclient, kserve).\n_POOL = _descriptor_pool.DescriptorPool()\n")


def generate() -> str:
    """The module's source text."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / VIRTUAL_PATH).parent.mkdir(parents=True)
        (tmp / VIRTUAL_PATH).write_text(PROTO.read_text())
        if protoc.main(["protoc", f"-I{tmp}", f"--python_out={tmp}", VIRTUAL_PATH]) != 0:
            raise SystemExit("protoc failed")
        code = (tmp / VIRTUAL_PATH).with_name("grpc_predict_v2_pb2.py").read_text()
    if _ANCHOR not in code or "_descriptor_pool.Default().AddSerializedFile(" not in code:
        raise SystemExit("unexpected generated code: no default-pool registration to replace")
    code = code.replace(_ANCHOR, _ANCHOR + _POOL_LINES)
    code = code.replace("_descriptor_pool.Default().AddSerializedFile(", "_POOL.AddSerializedFile(")
    return "# ruff: noqa\n" + code


def main() -> None:
    """Write serving/grpc_predict_v2_pb2.py."""
    from importlib.metadata import version

    if version("grpcio-tools") != GRPCIO_TOOLS_VERSION:
        sys.exit(f"grpcio-tools must be {GRPCIO_TOOLS_VERSION}. Received: "
                 f"{version('grpcio-tools')}")
    TARGET.write_text(generate())


if __name__ == "__main__":
    main()
