"""Served over gRPC, a text model padded to each request's length buckets answers as the same
weights padded to the cap do (issue 50's serving parity, end to end).

One small BERT-style encoder (one layer, untrained: its probabilities differ from text to text,
which is what is compared) exported twice by the exporter's own `save_text_servable`: taking any
length (the server splits a request by length bucket, each run padded to its bucket) and behind
a fixed cap input (every text padded to the cap). Both are served by one in-process `ampflow
serve` server; ampflow's `PredictionClient` sends raw texts over loopback gRPC.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from serving_helpers import running_server

from ampflow.serving.client import PredictionClient
from ampflow.serving.config import ModelConfig, ServerConfig

pytestmark = [pytest.mark.serving, pytest.mark.slow]  # exports twice and starts a server

CAP = 64
WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def twin_exports(tmp_path_factory):
    """{"buckets": base path, "padded": base path}: the same weights, exported both ways."""
    import keras

    from ampflow.components.export_savedmodel.text_signatures import (
        length_buckets_of,
        save_text_servable,
    )
    from ampflow.modeling.text_models import EncoderShape, build_encoder_classifier
    from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

    tokenizer = fit_tokenizer([" ".join(WORDS)], TokenizerConfig(max_sequence_length=CAP))
    keras.utils.set_random_seed(5)
    model = build_encoder_classifier(EncoderShape(layers=1, hidden=16, heads=2), CAP,
                                     tokenizer.vocabulary_size, 3, dropout=0.0)
    ids = keras.Input((CAP,), dtype="int32")
    twins = {"buckets": model, "padded": keras.Model(ids, model(ids))}
    assert length_buckets_of(model, CAP) == [16, 32, 64]
    assert length_buckets_of(twins["padded"], CAP) is None
    root, bases = tmp_path_factory.mktemp("text-twins"), {}
    for name, keras_model in twins.items():
        version = root / name / "1"
        save_text_servable(keras_model, tokenizer, ["a", "b", "c"], version)
        (version / "ampflow_export.json").write_text(json.dumps(
            {"input": {"length_buckets": length_buckets_of(keras_model, CAP)}}))
        bases[name] = root / name
    return bases


def test_bucketed_answers_over_grpc_are_the_cap_padded_ones(twin_exports):
    """32 texts of 1 to 60 words in one request, then 1 long text among 31 short ones: the same
    classes and probabilities within float32 rounding from both models, over gRPC."""
    rng = np.random.default_rng(0)
    mixed = [" ".join(rng.choice(WORDS, int(rng.integers(1, 61)))) for _ in range(32)]
    one_long = ["w1 w2"] * 7 + [" ".join(WORDS * 3)] + ["w3 w4 w5"] * 24
    config = ServerConfig(models=tuple(ModelConfig(n, b) for n, b in twin_exports.items()),
                          host="127.0.0.1", port=0, grace_s=1.0)
    with running_server(config) as server, PredictionClient(server.address,
                                                            timeout_s=60) as client:
        for texts in (mixed, one_long):
            utf8 = [t.encode() for t in texts]
            answers = {n: client.predict(n, utf8).outputs for n in twin_exports}
            bucketed, padded = answers["buckets"], answers["padded"]
            np.testing.assert_array_equal(bucketed["class_ids"], padded["class_ids"])
            np.testing.assert_allclose(bucketed["probabilities"], padded["probabilities"],
                                       atol=1e-6, rtol=0)
            assert np.ptp(padded["probabilities"][:, 0]) > 1e-4  # rows differ: a mix-up shows
