"""`--autotune`'s measuring process on a text model (issue 40 point 3: autotune learns text).

In-process, on the suite's shared prepared texts (tests/tiny_text_model.py, no training): the
real `_ChildRun` sets up bert_tiny's data, plans its candidates and builds each candidate's
model, without timing a step. What it must do on every machine (the hardware is injected):
fit the tokenizer once for the whole search, and measure XLA for a BERT-style encoder (it has
no convolution, so the XLA-on-CPU skip rule must not apply), and put `auto`'s choice second,
the same rule as for images. On an AVX2-only CPU `auto` is float32 and bfloat16 is skipped
for every model (test_precision.py's KINDS: its candidates are planned at 0 convolutions,
a text model's count).
"""

from __future__ import annotations

import pytest
import tiny_text_model as shared

from ampflow.artifacts.throughput import throughput_unit
from ampflow.components.train import TrainConfig
from ampflow.components.train.precision.autotune_rules import config_to_dict, hardware_to_dict
from ampflow.components.train.precision.policy import HardwareInfo

BF16_CPU = HardwareInfo(cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))


@pytest.fixture(scope="module")
def prepared_texts(tmp_path_factory):
    return shared.prepared_texts(tmp_path_factory)


@pytest.mark.slow  # XLA-compiles and times an encoder
def test_the_search_fits_the_text_tokenizer_once_and_measures_xla_for_an_encoder(
        prepared_texts, tmp_path, monkeypatch):
    import keras

    from ampflow.components.train.precision.autotune_child import _ChildRun
    from ampflow.modeling import tokenizer as tokenizer_module

    fits = []
    real_fit = tokenizer_module.fit_tokenizer
    monkeypatch.setattr(tokenizer_module, "fit_tokenizer",
                        lambda *a, **k: fits.append(1) or real_fit(*a, **k))
    config = TrainConfig(data_dir=prepared_texts, output_dir=tmp_path, model="bert_tiny",
                         max_sequence_length=shared.SEQ, batch_size=8, autotune=True,
                         autotune_steps=3)
    events = []
    try:
        run = _ChildRun({"config": config_to_dict(config),
                         "hardware": hardware_to_dict(BF16_CPU)})
        pairs = run.plan(lambda **event: events.append(event))
        for policy, jit in pairs:  # each candidate's model and loop, no step timed
            run.prepare(policy, jit)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    plan = events[0]
    assert plan["conv_layers"] == 0
    # the parent's rates are in the data's unit, which the plan names: texts, not images
    assert throughput_unit(plan["modality"]).rate == "texts/s"
    assert {("float32", True), ("mixed_bfloat16", True)} <= set(pairs)  # measured, not skipped
    # float32 first, then `auto`'s choice: the images' rule (bf16 where native, no XLA on a CPU)
    assert pairs[:2] == [("float32", False), ("mixed_bfloat16", False)]
    assert len(fits) == 1  # not once for the data, the plan and every half-precision model
