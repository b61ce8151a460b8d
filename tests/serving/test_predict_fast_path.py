"""The Predict fast path answers exactly what the public, slower calls answer.

- `SignatureCall` (servable.py) calls a signature's concrete function with its flat argument
  order worked out at load time; anything that does not match the signature takes the
  public call, so an error is still TensorFlow's own. Its `RuntimeCall` makes the runtime
  call that `_call_flat` makes, without TensorFlow's Python around it, and leaves a recording
  tape or a failing call to `_call_flat`.
- No request ever traces a new function: every batch size runs the one concrete function
  the SavedModel holds, batched or not.
- `tensors.decode_checked` reads numeric `tensor_content` as a view of the request's bytes;
  `tensors.to_proto` writes outputs without `tf.make_tensor_proto`, byte for byte the same.
- REST connections are TCP_NODELAY (the ~44 ms Nagle/delayed-ACK stall of every call).
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import MODEL, free_port, install_version, predict_request
from tensorflow.core.framework import types_pb2
from tensorflow.python.eager import context
from tensorflow_serving.apis import prediction_service_pb2_grpc

from ampflow.serving.config import BatchingConfig
from ampflow.serving.core.inference import InferenceCore
from ampflow.serving.models.servable import SavedModelServable
from ampflow.serving.protocols import tensors
from ampflow.serving.protocols.tf_serving import TFServingProtocol
from ampflow.serving.status import ServingStatusError
from ampflow.serving.testing import sample_images

NUMERIC = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
           np.uint16, np.uint32, np.uint64)
SHAPES = ((), (0,), (1,), (1, 1), (2,), (2, 3), (3, 0, 2), (2, 2, 2))


@pytest.fixture(scope="module")
def servable(model_store) -> SavedModelServable:
    return SavedModelServable(MODEL, 1, Path(model_store) / "1")


class _OneModel:
    """The registry part the core and TF Serving's API use, answering with one servable."""

    def __init__(self, servable):
        self.servable = servable

    def resolve(self, _name, _version, _label):
        return self.servable

    def configs(self):
        return []


def _public(servable, signature, inputs) -> dict:
    outputs = servable._functions[signature].fn(**inputs)
    return {k: v.numpy() for k, v in outputs.items()}


def _values(array) -> list:
    rng = np.random.default_rng(len(array.shape))
    return (rng.standard_normal(array.shape) * 100).astype(array.dtype)


# ---- the signature call -------------------------------------------------------------------

def test_both_signatures_of_the_contract_model_take_the_fast_call(servable):
    assert servable._functions["serving_default"].fast
    assert servable._functions["classify"].fast


def test_a_tensorflow_without_the_flat_call_leaves_the_public_call_in_charge(servable):
    from ampflow.serving.models.servable import SignatureCall, _has_flat_call

    class Changed:  # a TensorFlow whose private entry point took other arguments
        def __init__(self, fn):
            self.structured_input_signature = fn.structured_input_signature
            self.function_type = fn.function_type
            self.public = fn

        def _call_flat(self, tensors):
            raise AssertionError("must not be called")

        def __call__(self, **inputs):
            return self.public(**inputs)

    assert _has_flat_call(servable._functions["serving_default"].fn)
    changed = SignatureCall(Changed(servable._functions["serving_default"].fn))
    assert not changed.fast
    images = sample_images(2)
    np.testing.assert_array_equal(changed({"images": images})["probabilities"],
                                  servable.run("serving_default", {"images": images})[
                                      "probabilities"])


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_fast_call_answers_exactly_the_public_call(servable, rows):
    images = sample_images(rows, seed=rows)
    fast = servable.run("serving_default", {"images": images})
    public = _public(servable, "serving_default", {"images": images})
    assert fast.keys() == public.keys()
    for key in fast:
        assert fast[key].dtype == public[key].dtype
        np.testing.assert_array_equal(fast[key], public[key])


def test_fast_call_of_a_string_signature_answers_the_public_call(servable):
    examples = [tf.train.Example(features=tf.train.Features(feature={"image": tf.train.Feature(
        float_list=tf.train.FloatList(value=image.ravel()))})).SerializeToString()
        for image in sample_images(2, seed=5)]
    batch = np.empty(2, dtype=object)
    batch[:] = examples
    fast = servable.run("classify", {"inputs": batch})
    public = _public(servable, "classify", {"inputs": batch})
    np.testing.assert_array_equal(fast["scores"], public["scores"])
    np.testing.assert_array_equal(fast["classes"], public["classes"])


def test_both_signatures_of_the_contract_model_take_the_runtime_call(servable, monkeypatch):
    images = sample_images(2, seed=8)
    expected = servable.run("serving_default", {"images": images})
    expected_scores = servable.run("classify", {"inputs": _classify_batch(2, seed=9)})["scores"]

    def not_this_way(*_args):
        raise AssertionError("the runtime call must answer, not _call_flat")

    for signature in ("serving_default", "classify"):
        assert servable._functions[signature].runtime_call is not None, signature
        monkeypatch.setattr(servable._functions[signature].fn, "_call_flat", not_this_way)
    answer = servable.run("serving_default", {"images": images})
    for key, value in expected.items():
        np.testing.assert_array_equal(answer[key], value)
    np.testing.assert_array_equal(
        servable.run("classify", {"inputs": _classify_batch(2, seed=9)})["scores"],
        expected_scores)


def _classify_batch(count: int, seed: int) -> np.ndarray:
    examples = [tf.train.Example(features=tf.train.Features(feature={"image": tf.train.Feature(
        float_list=tf.train.FloatList(value=image.ravel()))})).SerializeToString()
        for image in sample_images(count, seed=seed)]
    batch = np.empty(count, dtype=object)
    batch[:] = examples
    return batch


@pytest.mark.parametrize("signature, inputs", [
    ("serving_default", {"images": sample_images(5, seed=11)}),
    ("classify", {"inputs": _classify_batch(3, seed=12)}),
], ids=["serving_default", "classify"])
def test_the_runtime_call_answers_exactly_the_flat_call(servable, signature, inputs):
    call = servable._functions[signature]
    flat = call._flat_tensors(inputs)
    direct = call.runtime_call(flat, call.fn.captured_inputs)
    through_tf = call.fn._call_flat(flat, call.fn.captured_inputs)
    assert direct.keys() == through_tf.keys()
    for key in direct:
        assert direct[key].dtype == through_tf[key].dtype
        np.testing.assert_array_equal(direct[key].numpy(), through_tf[key].numpy())


def test_under_a_gradient_tape_the_flat_call_runs_and_records(servable):
    call = servable._functions["serving_default"]
    images = tf.constant(sample_images(2, seed=3))
    with tf.GradientTape() as tape:
        tape.watch(images)
        assert not call.runtime_call.applies(2)  # a tape could record: TF's own call
        outputs = call._call_flat([images])
        loss = tf.reduce_sum(outputs["probabilities"] * tf.range(10, dtype=tf.float32))
    gradient = tape.gradient(loss, images)
    assert gradient is not None and float(tf.reduce_max(tf.abs(gradient))) > 0


def test_a_runtime_failure_is_tensorflows_own_error(servable):
    # a string that is not a tf.Example passes every spec check and fails inside the graph
    batch = np.empty(1, dtype=object)
    batch[:] = [b"not a serialized tf.Example"]
    with pytest.raises(tf.errors.InvalidArgumentError) as public:
        _public(servable, "classify", {"inputs": batch})
    with pytest.raises(tf.errors.InvalidArgumentError) as served:
        servable.run("classify", {"inputs": batch})
    assert str(served.value) == str(public.value)


def test_a_call_that_fails_in_the_graph_runs_it_once(tmp_path):
    """A failing request must not run the model a second time (stateful ops, cost)."""
    module = tf.Module()
    module.calls = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(x):
        with tf.control_dependencies([module.calls.assign_add(1)]):
            checked = tf.debugging.assert_positive(x, message="x must be positive")
        with tf.control_dependencies([checked]):
            return {"y": x * 2.0}

    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": serve})
    counted = SavedModelServable("counter", 1, tmp_path / "1")
    assert counted._functions["serving_default"].runtime_call is not None
    np.testing.assert_array_equal(
        counted.run("serving_default", {"x": np.array([1.0, 2.0], np.float32)})["y"], [2, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="x must be positive"):
        counted.run("serving_default", {"x": np.array([-1.0], np.float32)})
    assert int(counted._loaded.calls.numpy()) == 2  # one call each, the failing one too


def test_a_tensorflow_without_the_runtime_call_keeps_the_flat_call(servable):
    from ampflow.serving.models.servable import SignatureCall

    class Older:  # a TensorFlow whose functions have no `_inference_function`
        def __init__(self, fn):
            self.structured_input_signature = fn.structured_input_signature
            self.function_type = fn.function_type
            self.captured_inputs = fn.captured_inputs
            self._call_flat = fn._call_flat

    call = SignatureCall(Older(servable._functions["serving_default"].fn))
    assert call.fast and call.runtime_call is None
    images = sample_images(3, seed=4)
    for key, value in call({"images": images}).items():
        np.testing.assert_array_equal(value, _public(servable, "serving_default",
                                                     {"images": images})[key])


@pytest.mark.parametrize("inputs", [
    {"images": sample_images(2).astype(np.float64)},   # another dtype
    {"pictures": sample_images(2)},                    # another name
], ids=["dtype", "name"])
def test_inputs_off_the_signature_take_the_public_call_and_its_answer(servable, inputs):
    def outcome(call):
        try:
            return "ok", call()
        except Exception as e:  # the public call's own error is the expected answer
            return "error", type(e)

    fast = outcome(lambda: servable.run("serving_default", inputs))
    public = outcome(lambda: _public(servable, "serving_default", inputs))
    assert fast[0] == public[0]
    if fast[0] == "error":
        assert fast[1] is public[1]
    else:
        for key in fast[1]:
            np.testing.assert_array_equal(fast[1][key], public[1][key])


def test_inputs_of_another_shape_run_the_graph_as_tf_servings_session_does(servable):
    # TF Serving feeds the graph what was sent; the graph decides. The contract model's
    # Reshape to [-1, 64] takes [2, 8, 8] (128 values) as two images and refuses 144 values.
    images = sample_images(2)
    got = servable.run("serving_default", {"images": images[..., 0]})
    for key, value in _public(servable, "serving_default", {"images": images}).items():
        np.testing.assert_array_equal(got[key], value)
    with pytest.raises(tf.errors.InvalidArgumentError, match="requires a multiple of 64"):
        servable.run("serving_default", {"images": np.zeros((2, 8, 9, 1), np.float32)})


# ---- no retracing -------------------------------------------------------------------------

@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_no_request_traces_a_function_whatever_its_batch_size(model_store, tmp_path,
                                                              start_server, batching):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    extra = {"batching": BatchingConfig(max_batch_size=32, batch_timeout_ms=5)} if batching \
        else {}
    server = start_server(base, **extra)
    with grpc.insecure_channel(server.address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        stub.Predict(predict_request(MODEL, sample_images(1)), timeout=30)
        before = set(context.context().list_function_names())
        sizes = [1, 2, 3, 5, 8, 13, 4, 1, 7, 16, 20]
        with ThreadPoolExecutor(4) as pool:  # concurrent: the batcher merges some of them
            answers = list(pool.map(lambda n: stub.Predict(
                predict_request(MODEL, sample_images(n, seed=n)), timeout=30), sizes))
        after = set(context.context().list_function_names())
    assert [a.outputs["probabilities"].tensor_shape.dim[0].size for a in answers] == sizes
    # no function was added; some may have gone: an earlier test's model, collected meanwhile,
    # takes its functions out of the context (seen in a whole make test run)
    assert after - before == set()


# ---- decoding: zero copy, strict ---------------------------------------------------------

@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_tensor_content_decodes_as_tensorflow_does_without_a_copy(dtype):
    array = _values(np.empty((3, 4), dtype))
    proto = tf.make_tensor_proto(array)
    proto.tensor_content = array.tobytes()  # also for uint16, which TF writes to int_val
    proto.ClearField("int_val")
    decoded = tensors.to_ndarray("x", proto)
    assert decoded.dtype == np.dtype(dtype) and decoded.shape == (3, 4)
    np.testing.assert_array_equal(decoded, tf.make_ndarray(proto))
    np.testing.assert_array_equal(decoded, array)
    assert not decoded.flags.owndata and not decoded.flags.writeable  # a view of the bytes


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("delta", [-1, 1, None], ids=["short", "long", "empty-elsewhere"])
def test_malformed_tensor_content_is_invalid_argument_naming_the_input(dtype, delta):
    array = np.ones((2, 3), dtype)
    proto = tf.make_tensor_proto(array)
    content = array.tobytes()
    proto.tensor_content = content[:-1] if delta == -1 else content + b"\0" if delta == 1 \
        else content[: np.dtype(dtype).itemsize]
    with pytest.raises(ServingStatusError) as info:
        tensors.to_ndarray("pixels", proto)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "pixels" in info.value.message and "tensor_content" in info.value.message


def test_core_refuses_malformed_content_before_running_anything(servable):
    api = TFServingProtocol(InferenceCore(_OneModel(servable)))
    request = predict_request(MODEL, sample_images(2))
    request.inputs["images"].tensor_content = request.inputs["images"].tensor_content[:-4]
    with pytest.raises(ServingStatusError) as info:
        api.predict(request)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


# ---- encoding: byte for byte tf.make_tensor_proto ----------------------------------------

@pytest.mark.parametrize("dtype", [*NUMERIC, np.bool_, ">f4", ">i8", object],
                         ids=lambda d: np.dtype(d).str)
def test_to_proto_writes_what_make_tensor_proto_writes(dtype):
    for shape in SHAPES:
        if dtype is object:
            array = np.array([b"a", b"bc"] * 12, dtype=object)[:int(np.prod(shape))]
            array = array.reshape(shape)
        else:
            array = _values(np.empty(shape, dtype))
        for variant in (array, array.T):  # a transposed view: C order on the wire
            expected = _encoded(tf.make_tensor_proto, variant)
            assert _encoded(tensors.to_proto, variant) == expected, (dtype, shape)
            assert _encoded(lambda a: tensors.to_proto(a, out=tensors.tensor_pb2.TensorProto()),
                            variant) == expected


def _encoded(encode, array):
    """The serialized proto, or the error type (TF refuses some big-endian arrays)."""
    try:
        return encode(array).SerializeToString()
    except (TypeError, ValueError) as e:
        return type(e)


def test_core_response_is_what_the_public_path_encodes(servable):
    api = TFServingProtocol(InferenceCore(_OneModel(servable)))
    for rows in (1, 4):
        images = sample_images(rows, seed=rows)
        response = api.predict(predict_request(MODEL, images))
        public = _public(servable, "serving_default", {"images": images})
        for key, value in public.items():
            assert (response.outputs[key].SerializeToString()
                    == tf.make_tensor_proto(value).SerializeToString())
        assert response.outputs["class_ids"].dtype == types_pb2.DT_INT64


# ---- REST: no Nagle stall -----------------------------------------------------------------

def _server_side_socket(client: socket.socket) -> socket.socket:
    """This process's socket at the other end of `client` (the server runs in-process)."""
    import os

    wanted = (client.getpeername(), client.getsockname())
    for fd in os.listdir("/proc/self/fd"):
        try:
            candidate = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if (candidate.getsockname(), candidate.getpeername()) == wanted:
                return candidate
        except OSError:
            pass
        candidate.close()
    raise AssertionError("no server-side socket found for the connection")


def test_rest_connections_are_tcp_nodelay(model_store, tmp_path, start_server):
    base = tmp_path / MODEL
    install_version(model_store, base, 1)
    server = start_server(base, rest_api_port=free_port())
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as client:
        client.sendall(f"GET /v1/models/{MODEL} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert client.recv(65536).startswith(b"HTTP/1.1 200")  # the connection was accepted
        with _server_side_socket(client) as server_side:
            assert server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0

