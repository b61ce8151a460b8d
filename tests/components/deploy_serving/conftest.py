"""Fixtures of the deploy step: tiny real SavedModels in the export layout, and kubeconfigs.

The SavedModel here is our own: a seeded `tf.Module` with the contract's `serving_default`
signature (`images` float32 [-1,8,8,1] -> `probabilities` float32 [-1,10], `class_ids` int64
[-1]) and, as export writes it, the recorded answers to a few images (ampflow_canary.npz). Each
version has other weights, so a test can tell from a prediction which version answered.
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from ampflow.components.deploy_serving import DeployConfig, run_deploy
from ampflow.components.export_savedmodel.canary_examples import write_canary_examples
from ampflow.serving.testing import ServeProcess

MODEL_NAME = "digits"


def write_saved_model(path: Path, seed: int) -> Path:
    """Save a tiny 8x8x1 -> 10 classifier with seeded weights to `path`."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)

    class Tiny(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(rng.normal(0, 0.05, (64, 10)).astype(np.float32))
            self.bias = tf.Variable(rng.normal(0, 1.0, (10,)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, "images")])
        def serve(self, images):
            logits = tf.matmul(tf.reshape(images / 255.0, [-1, 64]), self.kernel) + self.bias
            probabilities = tf.nn.softmax(logits)
            class_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
            return {"probabilities": probabilities, "class_ids": class_ids}

    module = Tiny()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    # the answers export would record (real-looking images: the model's own outputs)
    images = np.random.default_rng(100 + seed).uniform(0, 255, (6, 8, 8, 1))
    write_canary_examples(path, tf.saved_model.load(str(path)), images)
    return path


@pytest.fixture(scope="session")
def export_base(tmp_path_factory) -> Path:
    """<export_base>/digits/{1,2}/: two versions of the tiny model, as the exporter lays them."""
    base = tmp_path_factory.mktemp("export")
    for version in (1, 2):
        write_saved_model(base / MODEL_NAME / str(version), seed=version)
    return base


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_kubeconfig(tmp_path) -> tuple[Path, str]:
    """A kubeconfig whose API server is a free loopback port: (path, server URL)."""
    server = f"https://127.0.0.1:{free_port()}"
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: dead\n  cluster:\n    server: {server}\n"
        "    insecure-skip-tls-verify: true\n"
        "users:\n- name: dead\n  user:\n    token: not-a-real-token\n"
        "contexts:\n- name: dead\n  context:\n    cluster: dead\n    user: dead\n"
        "current-context: dead\n"
    )
    return path, server


@pytest.fixture
def no_kube_env(monkeypatch, tmp_path):
    """No $KUBECONFIG, no ~/.kube/config, not in a pod: no cluster configuration at all."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def served_store(tmp_path, export_base):
    """A model store holding digits/1 and an `ampflow serve` process polling it every 0.5 s."""
    store = tmp_path / "store"
    run_deploy(DeployConfig(saved_model_dir=export_base / MODEL_NAME / "1", model_store=str(store)))
    with ServeProcess(MODEL_NAME, store / MODEL_NAME, tmp_path / "server.log",
                      "--file-system-poll-wait-seconds", "0.5") as server:
        yield store, server.address, server.proc
