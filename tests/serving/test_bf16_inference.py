"""`ampflow serve --compute-precision bfloat16` (issue 42 point 4): the rewrite per model; refusal.

The proof that a model really computes in bfloat16 is the graph TensorFlow executed for its
first call (run metadata), not its numbers: on a CPU with AVX512_BF16/AMX-BF16 the bf16 model's
MatMul runs in bfloat16 while the float32 model, loaded from the same dir in the same registry,
has no bfloat16 node. On a CPU without them the same tests assert what must happen there
instead of being skipped (issue 46 item 7), read from the machine's own CPU flags: the bf16
version is never served and says why, the float32 one beside it answers, and `ampflow serve
--compute-precision bfloat16` exits 2 with one line naming the missing instructions. The
refusal is also tested with the CPU-flags probe injected, so that it runs on every machine.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest
from serving_helpers import MODEL, install_version

from ampflow.errors import ConfigError, ModelLoadError
from ampflow.serving import compute_precision, cpu_features
from ampflow.serving.config import ModelConfig
from ampflow.serving.testing import sample_images

NATIVE_BF16 = bool(cpu_features.bf16_flags(cpu_features.read_cpu_flags()))
NO_BF16 = frozenset({"sse4_2", "avx2", "fma", "avx512f"})  # an AVX2/AVX-512F CPU without bf16
# compute_precision.unsupported_reason's first words: what is needed, and that this CPU lacks it
REFUSAL = ("--compute-precision bfloat16 needs a CPU with AVX512_BF16 or AMX-BF16; this one "
           "has neither")


def test_bf16_model_runs_its_matmul_in_bfloat16_or_is_never_served_without_bf16(model_store,
                                                                                 tmp_path,
                                                                                 capsys):
    from ampflow.serving.models.registry import ModelRegistry

    install_version(model_store, tmp_path / "m", 1)
    registry = ModelRegistry((ModelConfig("f32", tmp_path / "m"),
                              ModelConfig("bf16", tmp_path / "m", compute_precision="bfloat16")))
    registry.start(0)
    try:
        if NATIVE_BF16:
            _bf16_runs_its_matmul_in_bfloat16(registry)
        else:
            _bf16_is_never_served_here(registry, tmp_path / "m", capsys)
    finally:
        registry.stop()


def _bf16_is_never_served_here(registry, base, capsys) -> None:
    """This CPU has no bf16 (its real flags): the bf16 version fails to load with the reason,
    in one line, the float32 one from the same dir answers, and serve refuses the flag."""
    import grpc

    from ampflow.serving.status import ServingStatusError, VersionState

    out = registry.resolve("f32", None, None).run("serving_default",
                                                  {"images": sample_images(8)})
    assert out["probabilities"].shape == (8, 10)
    with pytest.raises(ServingStatusError) as unserved:
        registry.resolve("bf16", None, None)
    assert unserved.value.code == grpc.StatusCode.NOT_FOUND
    ((version, status),) = registry.status("bf16", None)
    assert version == 1 and status.state == VersionState.END
    assert status.error.startswith(f"ModelLoadError: {REFUSAL}"), status.error
    assert "\n" not in status.error
    code, err = _serve_bf16(base, capsys)
    assert code == 2 and err.startswith(f"ampflow serve: error: {REFUSAL}"), err
    assert len(err.splitlines()) == 1


def _serve_bf16(base, capsys) -> tuple[int, str]:
    """`ampflow serve --compute-precision bfloat16` of `base`: (exit code, stderr).

    Its port is taken: had the refusal not come first, the port would say so (and no server
    can start and stay up).
    """
    from ampflow.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code = main(["serve", "--server", "local", "--model-base-path", str(base),
                     "--port", str(busy.getsockname()[1]), "--compute-precision", "bfloat16"])
    return code, capsys.readouterr().err.strip()


def _bf16_runs_its_matmul_in_bfloat16(registry) -> None:
    images = sample_images(8)
    runs = {}
    for name in ("f32", "bf16"):
        servable = registry.resolve(name, None, None)
        runs[name] = compute_precision.bf16_graph_evidence(
            lambda s=servable: s.run("serving_default", {"images": images}))
        runs[name]["out"] = servable.run("serving_default", {"images": images})
    assert runs["f32"]["graphs"] and runs["bf16"]["graphs"], runs  # first calls were recorded
    assert runs["f32"]["bfloat16_nodes"] == 0
    # frozen at load: its weights are constants, cast once, so no call reads (and casts) one
    assert "ReadVariableOp" not in runs["bf16"]["ops"], runs["bf16"]["ops"]
    assert "ReadVariableOp" in runs["f32"]["ops"]  # the same dir's float32 graph reads them
    assert any("MatMul" in op for op in runs["bf16"]["bfloat16_ops"]), runs["bf16"]
    f32, bf16 = runs["f32"]["out"]["probabilities"], runs["bf16"]["out"]["probabilities"]
    assert bf16.dtype == np.float32  # the signature's contract is unchanged
    np.testing.assert_allclose(bf16, f32, atol=0.02)


def test_bf16_text_model_keeps_its_lookup_table_when_frozen_or_is_refused_without_bf16(
        tmp_path):
    """A lookup table is a resource, not a variable: the frozen graph gets the live table.

    Without bf16 (this CPU's real flags), loading it in bfloat16 is refused in one line; the
    same dir serves float32.
    """
    from ampflow.serving.models.servable import SavedModelServable

    path = _write_text_model(tmp_path / "text" / "1")
    texts = {"text": np.array([b"great film", b"awful odd film", b"unseen"], dtype=object)}
    f32 = SavedModelServable("f32", 1, path).run("serving_default", texts)
    if not NATIVE_BF16:
        with pytest.raises(ModelLoadError) as refused:
            SavedModelServable("bf16", 1, path, "bfloat16")
        assert str(refused.value).startswith(REFUSAL) and "\n" not in str(refused.value)
        assert f32["probabilities"].shape == (3, 3)
        return
    bf16_model = SavedModelServable("bf16", 1, path, "bfloat16")
    evidence = compute_precision.bf16_graph_evidence(
        lambda: bf16_model.run("serving_default", texts))
    assert evidence["bfloat16_nodes"] and "LookupTableFindV2" in evidence["ops"], evidence
    assert "ReadVariableOp" not in evidence["ops"] and "ResourceGather" not in evidence["ops"]
    bf16 = bf16_model.run("serving_default", texts)
    np.testing.assert_array_equal(bf16["class_ids"], f32["class_ids"])
    np.testing.assert_allclose(bf16["probabilities"], f32["probabilities"], atol=0.02)


def test_a_model_tensorflow_cannot_freeze_fails_to_load_with_the_reason(model_store, tmp_path,
                                                                          monkeypatch):
    """Never served half-converted: the version fails to load, and says why (any CPU)."""
    from ampflow.serving.models import frozen
    from ampflow.serving.models.servable import load_servable

    def cannot_freeze(self, fn):
        raise ValueError("Cannot convert the While op\nsecond line")

    monkeypatch.setattr(cpu_features, "read_cpu_flags", lambda: frozenset({"amx_bf16"}))
    monkeypatch.setattr(frozen.FrozenSignature, "__init__", cannot_freeze)
    version = install_version(model_store, tmp_path / MODEL, 1)
    with pytest.raises(ModelLoadError, match=r"could not freeze this model's \(ValueError: "
                                             r"Cannot convert the While op\); serve it in float32"):
        load_servable(MODEL, 1, version, compute_precision="bfloat16")
    assert load_servable(MODEL, 1, version).can_run("serving_default")  # float32 never freezes


def _write_text_model(path):
    """Words -> ids by a StaticHashTable (TextVectorization's resource), embedding, dense."""
    import tensorflow as tf

    words = tf.constant(["great", "awful", "odd", "film"])
    module = tf.Module()
    module.table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(words, tf.range(1, 5, dtype=tf.int64)), 0)
    module.embedding = tf.Variable(tf.random.stateless_normal([5, 16], (1, 2)))
    module.dense = tf.Variable(tf.random.stateless_normal([16, 3], (3, 4)))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, "text")])
    def serve(text):
        ids = module.table.lookup(tf.strings.split(text)).to_tensor()
        pooled = tf.reduce_mean(tf.gather(module.embedding, ids), axis=1)
        probabilities = tf.nn.softmax(tf.matmul(pooled, module.dense))
        return {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, -1)}

    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return path


def test_bf16_is_refused_in_one_line_on_a_cpu_without_it(model_store, tmp_path, monkeypatch,
                                                         capsys):
    from ampflow.serving.models.servable import load_servable

    assert compute_precision.unsupported_reason("bfloat16", frozenset({"amx_bf16"})) is None
    assert compute_precision.unsupported_reason("float32", frozenset()) is None
    monkeypatch.setattr(cpu_features, "read_cpu_flags", lambda: NO_BF16)
    version = install_version(model_store, tmp_path / "store" / MODEL, 1)
    with pytest.raises(ModelLoadError, match="AVX512_BF16 or AMX-BF16"):  # a library caller
        load_servable(MODEL, 1, version, compute_precision="bfloat16")
    with pytest.raises(ConfigError, match="one of"):
        ModelConfig(MODEL, tmp_path, compute_precision="float16")
    with pytest.raises(ConfigError, match="TFLite"):
        ModelConfig(MODEL, tmp_path, model_format="tflite", compute_precision="bfloat16")
    code, err = _serve_bf16(tmp_path / "store" / MODEL, capsys)
    assert code == 2
    assert err.startswith(f"ampflow serve: error: {REFUSAL}"), err
    assert len(err.splitlines()) == 1
