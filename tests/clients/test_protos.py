"""The client's generated protos: reproducible, equal to TF Serving 2.21's, and no clash.

`grpcio-tools` (pinned in tools/generate_protos.py) is installed into a temporary folder for
these tests only, so the regenerated code is compared with what is committed.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from client_helpers import CLIENT_ROOT

sys.path.insert(0, str(CLIENT_ROOT / "tools"))
from generate_protos import GRPCIO_TOOLS_VERSION  # noqa: E402

GENERATED = CLIENT_ROOT / "src" / "ampflow_client" / "_proto"
HAND_WRITTEN = {"__init__.py", "_pool.py"}


@pytest.fixture(scope="session")
def grpc_tools_path(tmp_path_factory) -> Path:
    """grpcio-tools at the pinned version, in a folder of its own (not in the main venv)."""
    target = tmp_path_factory.mktemp("grpcio-tools")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--target", str(target),
                    f"grpcio-tools=={GRPCIO_TOOLS_VERSION}"], check=True)
    return target


def _env(*paths: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def test_generated_code_regenerates_byte_for_byte(grpc_tools_path, tmp_path):
    subprocess.run([sys.executable, str(CLIENT_ROOT / "tools" / "generate_protos.py"),
                    "--out", str(tmp_path)], check=True, env=_env(grpc_tools_path))
    fresh = tmp_path / "ampflow_client" / "_proto"
    ours = {p.relative_to(GENERATED) for p in GENERATED.rglob("*.py")
            if "__pycache__" not in p.parts} - {Path(n) for n in HAND_WRITTEN}
    theirs = {p.relative_to(fresh) for p in fresh.rglob("*.py")}
    assert ours == theirs
    different = [str(p) for p in sorted(ours) if not filecmp.cmp(GENERATED / p, fresh / p,
                                                                  shallow=False)]
    assert not different, f"regenerate with tools/generate_protos.py: {different}"


@pytest.fixture(scope="module")
def tf_first(grpc_tools_path, tmp_path_factory) -> subprocess.CompletedProcess:
    """One process (a TensorFlow start-up, the cost of these tests): tensorflow and
    tensorflow_serving imported first, the vendored protos compared with the 2.21.0 wheels'
    (_COMPARE), then the client imported beside them and used with them (_BOTH, tf-first)."""
    root = tmp_path_factory.mktemp("tf-first")
    script = root / "tf_first.py"
    script.write_text(_COMPARE + "\nsys.argv[1:] = ['tf-first']\n" + _BOTH)
    return subprocess.run([sys.executable, str(script), str(CLIENT_ROOT / "protos"),
                           str(root / "set.pb")], env=_env(grpc_tools_path, CLIENT_ROOT / "src"),
                          capture_output=True, text=True)


@pytest.mark.slow  # its fixture starts a fresh TensorFlow process
def test_vendored_protos_compile_to_tensorflow_serving_2_21_descriptors(tf_first):
    """Every vendored file equals, field for field, the one in the 2.21.0 wheels."""
    assert tf_first.returncode == 0, tf_first.stdout + tf_first.stderr
    vendored = len(list((CLIENT_ROOT / "protos").rglob("*.proto")))
    assert f"compared {vendored} files, all equal" in tf_first.stdout


_COMPARE = r'''
import os, sys
from pathlib import Path
import grpc_tools
from grpc_tools import protoc
from google.protobuf import descriptor_pb2, descriptor_pool
import tensorflow_serving.apis.prediction_service_pb2  # noqa: F401 - registers the files
import tensorflow_serving.apis.model_service_pb2  # noqa: F401
import tensorflow.core.example.example_pb2  # noqa: F401
import grpc_health.v1.health_pb2  # noqa: F401

root, out = Path(sys.argv[1]), sys.argv[2]
files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.proto"))
include = Path(grpc_tools.__file__).parent / "_proto"
assert protoc.main(["protoc", f"-I{root}", f"-I{include}", "--include_imports",
                    f"--descriptor_set_out={out}", *files]) == 0


def strip(fdp):  # protoc fills json_name in descriptor sets, not in generated code
    def walk(msg):
        for field in msg.field:
            field.ClearField("json_name")
        for nested in msg.nested_type:
            walk(nested)
    for msg in fdp.message_type:
        walk(msg)
    return fdp


compiled = descriptor_pb2.FileDescriptorSet.FromString(Path(out).read_bytes())
n = 0
for fdp in compiled.file:
    if fdp.name.startswith("google/protobuf/"):
        continue
    ref = descriptor_pool.Default().FindFileByName(fdp.name)
    wheel = descriptor_pb2.FileDescriptorProto.FromString(ref.serialized_pb)
    assert strip(wheel) == strip(fdp), f"{fdp.name} differs from the installed wheel's"
    n += 1
print(f"compared {n} files, all equal")
'''


@pytest.mark.slow  # a fresh TensorFlow process
def test_client_and_tensorflow_serving_api_import_together_and_interoperate(tmp_path, tf_first):
    """One process: tensorflow + tensorflow_serving first, then the client (`tf_first`); and
    one with the client first."""
    assert tf_first.returncode == 0, tf_first.stdout + tf_first.stderr
    assert "interoperate" in tf_first.stdout
    script = tmp_path / "both.py"
    script.write_text(_BOTH)
    out = subprocess.run([sys.executable, str(script), "client-first"],
                         env=_env(CLIENT_ROOT / "src"), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "interoperate" in out.stdout


_BOTH = r'''
import sys
if sys.argv[1] == "client-first":
    import ampflow_client
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2 as tf_predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc as tf_grpc
import ampflow_client
from ampflow_client._proto.tensorflow_serving.apis import predict_pb2
from ampflow_client._proto.tensorflow_serving.apis import prediction_service_pb2_grpc

assert predict_pb2.PredictRequest is not tf_predict_pb2.PredictRequest
assert predict_pb2.PredictRequest.DESCRIPTOR.full_name == "tensorflow.serving.PredictRequest"
request = predict_pb2.PredictRequest()
request.model_spec.name = "m"
request.inputs["x"].CopyFrom(ampflow_client.make_tensor_proto(np.arange(6.0, dtype=np.float32)
                                                              .reshape(2, 3)))
theirs = tf_predict_pb2.PredictRequest.FromString(request.SerializeToString())
np.testing.assert_array_equal(tf.make_ndarray(theirs.inputs["x"]),
                              np.arange(6.0, dtype=np.float32).reshape(2, 3))
assert theirs.SerializeToString() == request.SerializeToString()
# the same gRPC method names
import inspect
method = "/tensorflow.serving.PredictionService/Predict"
assert method in inspect.getsource(prediction_service_pb2_grpc)
assert method in inspect.getsource(tf_grpc)
print("interoperate")
'''


def test_client_never_imports_tensorflow():
    code = ("import sys, ampflow_client, ampflow_client.cli, ampflow_client.images; "
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_serving', 'ampflow', 'keras')]; "
            "assert not bad, bad; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], env=_env(CLIENT_ROOT / "src"),
                         capture_output=True, text=True)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr
