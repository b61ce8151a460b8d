"""A tiny, real SavedModel that follows docs/ARTIFACTS.md, for tests, benchmarks and demos.

The serving side is developed beside the exporter, so it needs its own model with the same
contract: `serving_default` (`images` float32 [-1,H,W,C] raw pixels 0..255 -> `probabilities`
float32 [-1,K], `class_ids` int64 [-1]) and `classify` (`inputs` serialized tf.Example with
float_list feature `image` -> `scores` float32 [-1,K], `classes` string [-1,K]), plus
`assets/labels.txt` and `assets.extra/tf_serving_warmup_requests`. The rules of the format (the
classify method name, the warm-up file) come from `ampflow.serving.model_format`, as the
exporter's do. It has no `image_bytes` signature: that one decodes by the training rule, which
lives with the pipeline's steps, so the serving tests exercise it on a real export
(tests/serving/test_serving_image_bytes.py); a model without it is also what an older export
looks like to `ampflow predict`.

Run `python -m ampflow.serving.testing --base-path DIR` to write it for a real TF Serving.
`raw_tensor_proto` builds the TensorProtos of hostile-input tests, unchecked, as a client could;
`ServeProcess` runs `ampflow serve` as a child process on a free loopback port, as TF Serving's
own tests run the real server.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ampflow.files import staging_dir
from ampflow.serving.model_format import (
    CLASS_IDS_OUTPUT,
    CLASSIFY_METHOD,
    CLASSIFY_SIGNATURE,
    DEFAULT_SIGNATURE,
    IMAGE_FEATURE,
    PROBABILITIES_OUTPUT,
    set_method_name,
    write_warmup_records,
)

DEFAULT_SHAPE = (8, 8, 1)
DEFAULT_LABELS = tuple(f"digit_{i}" for i in range(10))


def _build_module(shape: tuple[int, int, int], labels: tuple[str, ...], seed: int):
    import tensorflow as tf

    h, w, c = shape
    n, k = h * w * c, len(labels)
    rng = np.random.default_rng(seed)

    class TinyClassifier(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(rng.normal(0, 0.05, (n, k)).astype(np.float32))
            self.bias = tf.Variable(rng.normal(0, 0.5, (k,)).astype(np.float32))
            self.labels = tf.constant(list(labels))

        @tf.function(input_signature=[tf.TensorSpec([None, h, w, c], tf.float32, "images")])
        def serve(self, images):
            logits = tf.matmul(tf.reshape(images / 255.0, [-1, n]), self.kernel) + self.bias
            probabilities = tf.nn.softmax(logits)
            return {PROBABILITIES_OUTPUT: probabilities,
                    CLASS_IDS_OUTPUT: tf.argmax(probabilities, axis=-1, output_type=tf.int64)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, "inputs")])
        def classify(self, inputs):
            features = tf.io.parse_example(
                inputs, {IMAGE_FEATURE: tf.io.FixedLenFeature([n], tf.float32)})
            scores = self.serve(tf.reshape(features[IMAGE_FEATURE], [-1, h, w, c]))[
                PROBABILITIES_OUTPUT]
            classes = tf.tile(self.labels[None, :], [tf.shape(scores)[0], 1])
            return {"scores": scores, "classes": classes}

    return TinyClassifier()


def install_version(store: str | os.PathLike, base: str | os.PathLike, version: int,
                    source: int | None = None, edit=None) -> Path:
    """Copy `<store>/<source or version>` to `<base>/<version>` as a server must see it: whole.

    The copy goes into a hidden dir beside the versions, `edit(tmp_dir)` may change it (a test
    that needs a damaged version), and one rename puts it in place.
    """
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=base, prefix=f".{version}.incomplete-"))
    shutil.copytree(Path(store) / str(source or version), tmp, dirs_exist_ok=True)
    if edit is not None:
        edit(tmp)
    final = base / str(version)
    os.replace(tmp, final)
    return final


def raw_tensor_proto(dims, dtype: int | None = None, **values):
    """A TensorProto of declared shape `dims`, with each given field set as is (no checks).

    `values` names TensorProto fields: `tensor_content=bytes`, or a typed list such as
    `float_val=[...]`; nothing makes them agree with the shape or the dtype, so a test can
    send exactly the malformed tensor it means to (DT_FLOAT when `dtype` is None).
    """
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

    shape = tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT if dtype is None else dtype,
                                    tensor_shape=shape)
    for field, items in values.items():
        if field == "tensor_content":
            tensor.tensor_content = items
        else:
            getattr(tensor, field).extend(items)
    return tensor


def sample_images(count: int, shape=DEFAULT_SHAPE, seed: int = 0) -> np.ndarray:
    """Deterministic float32 'raw pixel' images in 0..255."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (count, *shape)).astype(np.float32)


def write_model_version(base_path: str | os.PathLike, version: int, *, seed: int | None = None,
                        model_name: str = "ampflow", shape=DEFAULT_SHAPE,
                        labels: tuple[str, ...] = DEFAULT_LABELS, warmup: bool = True) -> Path:
    """Write `<base_path>/<version>/` atomically (staging dir + rename); returns its path."""
    import tensorflow as tf

    final = Path(base_path) / str(version)
    module = _build_module(tuple(shape), tuple(labels), version if seed is None else seed)
    with staging_dir(final, replaces="saved_model.pb") as tmp:
        tf.saved_model.save(module, str(tmp),
                            signatures={DEFAULT_SIGNATURE: module.serve,
                                        CLASSIFY_SIGNATURE: module.classify})
        set_method_name(tmp, CLASSIFY_SIGNATURE, CLASSIFY_METHOD)
        (tmp / "assets").mkdir(exist_ok=True)
        (tmp / "assets" / "labels.txt").write_text("\n".join(labels) + "\n")
        if warmup:
            write_warmup_records(tmp, model_name, sample_images(2, shape, seed=99), 2)
    return final


class ServeProcess:
    """`ampflow serve --server local` in a child process, as TF Serving's tests run their server.

    The server picks a free port (`--port 0`); `address` is what it prints once it listens.
    Its log (stderr) goes to `log_path`; its resident memory is its own (`rss_mb`). `stop`
    (or leaving the `with` block) sends SIGTERM, the server's graceful drain, then SIGKILL
    after `stop_timeout_s`; a server that ended any other way gets its log's end printed
    (pytest shows it with the failure).
    """

    def __init__(self, model_name: str, base_path: str | os.PathLike, log_path: str | os.PathLike,
                 *flags: str, start_timeout_s: float = 180.0,
                 stop_timeout_s: float = 15.0) -> None:
        self.log_path = Path(log_path)
        self.stop_timeout_s = stop_timeout_s
        argv = [sys.executable, "-m", "ampflow.cli", "serve", "--server", "local",
                "--model-name", model_name, "--model-base-path", str(base_path),
                "--host", "127.0.0.1", "--port", "0", *flags]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        self.address = self._wait_for_address(start_timeout_s)

    def _wait_for_address(self, timeout_s: float) -> str:
        found: list[str] = []

        def read_stdout() -> None:  # keeps reading, so the pipe never fills
            for line in self.proc.stdout:
                match = re.match(r"ampflow serve: listening on (\S+:\d+)", line)
                if match and not found:
                    found.append(match.group(1))

        threading.Thread(target=read_stdout, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not found and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not found:
            self.stop()
            raise RuntimeError(f"ampflow serve did not start within {timeout_s:g}s; "
                               f"see {self.log_path}")
        return found[0]

    @property
    def rss_mb(self) -> float:
        """The server's resident memory, from /proc (NaN where there is none)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after `stop_timeout_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
            print(self.log_path.read_text()[-3000:])
        return self.proc.returncode

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Write the fixture model, e.g. to serve it with a real tensorflow_model_server."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base-path", required=True, help="model base path to write into")
    parser.add_argument("--versions", type=int, nargs="+", default=[1], help="versions to write")
    args = parser.parse_args(argv)
    for version in args.versions:
        print(write_model_version(args.base_path, version))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
