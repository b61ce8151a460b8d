"""Generate `src/ampflow_client/_proto/` from `protos/` with grpcio-tools (pinned below).

The vendored `.proto` files keep their proto packages (`tensorflow`, `tensorflow.serving`,
`grpc.health.v1`), so the wire format, `Any` type URLs and gRPC method names
(`/tensorflow.serving.PredictionService/Predict`) are TF Serving's. Only their *file* paths
move under `ampflow_client/_proto/` (imports rewritten to match), so the Python modules live
in our namespace; and the generated modules register their files in a private descriptor
pool (`ampflow_client._proto._pool.POOL`) instead of protobuf's default pool, where
`tensorflow`'s own modules define the same message names (the default pool refuses a second
file defining `tensorflow.DataType`, whatever the file is called).

    pip install grpcio-tools==1.76.0
    python tools/generate_protos.py            # rewrite src/ampflow_client/_proto
    python tools/generate_protos.py --out DIR  # write the package tree under DIR/ instead

tests/clients/test_protos.py regenerates into a temporary dir and compares byte for byte.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

GRPCIO_TOOLS_VERSION = "1.76.0"  # its protoc writes code for protobuf >= 6.31.1, grpcio >= 1.76
HERE = Path(__file__).resolve().parent.parent
PROTOS = HERE / "protos"
PREFIX = "ampflow_client/_proto/"
SERVICE_FILES = ("tensorflow_serving/apis/prediction_service.proto",
                 "tensorflow_serving/apis/model_service.proto",
                 "grpc_health/v1/health.proto")
_IMPORT = re.compile(r'^(import\s+(?:public\s+|weak\s+)?")([^"]+)(";)', re.MULTILINE)


def _rewrite(text: str) -> str:
    return _IMPORT.sub(lambda m: m.group(1) + (
        m.group(2) if m.group(2).startswith("google/protobuf/") else PREFIX + m.group(2))
        + m.group(3), text)


def _private_pool(code: str) -> str:
    anchor = "from google.protobuf import descriptor_pool as _descriptor_pool\n"
    if anchor not in code or "_descriptor_pool.Default().AddSerializedFile(" not in code:
        raise SystemExit("unexpected generated code: no default-pool registration to replace")
    code = code.replace(anchor, anchor + "from ampflow_client._proto._pool import POOL as _POOL\n")
    return code.replace("_descriptor_pool.Default().AddSerializedFile(",
                        "_POOL.AddSerializedFile(")


def generate(out_root: Path) -> list[Path]:
    """Write `ampflow_client/_proto/**` (generated modules and `__init__.py`s) under out_root."""
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rel in sources:
            target = tmp / PREFIX / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_rewrite((PROTOS / rel).read_text()))
        include = Path(grpc_tools.__file__).parent / "_proto"
        args = ["protoc", f"-I{tmp}", f"-I{include}", f"--python_out={out_root}"]
        if protoc.main(args + [PREFIX + rel for rel in sources]) != 0:
            raise SystemExit("protoc failed (python_out)")
        if protoc.main(["protoc", f"-I{tmp}", f"-I{include}", f"--grpc_python_out={out_root}"]
                       + [PREFIX + rel for rel in SERVICE_FILES]) != 0:
            raise SystemExit("protoc failed (grpc_python_out)")
    package = out_root / PREFIX
    for path in sorted(package.rglob("*_pb2.py")):
        path.write_text(_private_pool(path.read_text()))
    for path in sorted(package.rglob("*.py")):
        written.append(path)
    for folder in sorted({p.parent for p in written}):
        if folder != package:
            init = folder / "__init__.py"
            if not init.exists():
                init.write_text("")
            written.append(init)
    return sorted(set(written))


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="root to write ampflow_client/_proto/ under (default: src/)")
    args = parser.parse_args()
    from importlib.metadata import version

    if version("grpcio-tools") != GRPCIO_TOOLS_VERSION:
        sys.exit(f"grpcio-tools must be {GRPCIO_TOOLS_VERSION}. Received: "
                 f"{version('grpcio-tools')}")
    if args.out is None:
        target = HERE / "src"
        generated = target / PREFIX
        for child in generated.iterdir():  # keep the hand-written __init__.py and _pool.py
            if child.is_dir():
                shutil.rmtree(child)
        generate(target)
    else:
        generate(args.out)


if __name__ == "__main__":
    main()
