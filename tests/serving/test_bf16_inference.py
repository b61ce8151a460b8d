"""`ampflow serve --compute-precision bfloat16` (issue 42 point 4): the rewrite per model; refusal.

The proof that a model really computes in bfloat16 is the graph TensorFlow executed for its
first call (run metadata), not its numbers: on a CPU with AVX512_BF16/AMX-BF16 the bf16 model's
MatMul runs in bfloat16 while the float32 model, loaded from the same dir in the same registry,
has no bfloat16 node. On a CPU without them that test is skipped with the reason, and serve
refuses the flag in one line (the CPU-flags probe injected, so that refusal is tested on every
machine).
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


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU has neither AVX512_BF16 nor AMX-BF16: "
                                            "bfloat16 serving is refused here (tested below)")
def test_bf16_model_runs_its_matmul_in_bfloat16_beside_a_float32_model(model_store, tmp_path):
    from ampflow.serving.models.registry import ModelRegistry

    install_version(model_store, tmp_path / "m", 1)
    registry = ModelRegistry((ModelConfig("f32", tmp_path / "m"),
                              ModelConfig("bf16", tmp_path / "m", compute_precision="bfloat16")))
    registry.start(0)
    images = sample_images(8)
    runs = {}
    for name in ("f32", "bf16"):
        servable = registry.resolve(name, None, None)
        runs[name] = compute_precision.bf16_graph_evidence(
            lambda s=servable: s.run("serving_default", {"images": images}))
        runs[name]["out"] = servable.run("serving_default", {"images": images})
    assert runs["f32"]["graphs"] and runs["bf16"]["graphs"], runs  # first calls were recorded
    assert runs["f32"]["bfloat16_nodes"] == 0
    assert any("MatMul" in op for op in runs["bf16"]["bfloat16_ops"]), runs["bf16"]
    f32, bf16 = runs["f32"]["out"]["probabilities"], runs["bf16"]["out"]["probabilities"]
    assert bf16.dtype == np.float32  # the signature's contract is unchanged
    np.testing.assert_allclose(bf16, f32, atol=0.02)


def test_bf16_is_refused_in_one_line_on_a_cpu_without_it(model_store, tmp_path, monkeypatch,
                                                         capsys):
    from ampflow.cli import main
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
    with socket.socket() as busy:  # had the refusal not come first, the port would say so
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code = main(["serve", "--server", "local", "--model-base-path",
                     str(tmp_path / "store" / MODEL), "--port", str(busy.getsockname()[1]),
                     "--compute-precision", "bfloat16"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("ampflow serve: error: --compute-precision bfloat16 needs a CPU with "
                          "AVX512_BF16 or AMX-BF16"), err
    assert len(err.splitlines()) == 1
