"""A text request's cost bounded by what it says (issue 50 point 4): `--max-request-tokens`
refuses a request whose tokens after padding are too many, through every decoding path, before
the model runs; `--max-execution-tokens` runs a large one in slices whose answers are one run's.

The bound comes from the bytes (serving/models/token_cost.py): checked here against both real
tokenizers an export ships (TextVectorization's whitespace words, BERT's WordPiece) on texts
made to split into as many tokens as their bytes allow. The protocols are driven through their
adapters over one `InferenceCore` (no server), on test_string_limits.py's model (each text's
byte length), given the assets a text export writes. The slices' answers are checked on a real
one-layer encoder exported by the exporter's own `save_text_servable` (untrained: its
probabilities differ from row to row, which is what is compared).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from test_string_limits import SENDERS, Outcome, _classify, _refused, _write_model

from ampflow.serving.config import ModelConfig
from ampflow.serving.core.inference import InferenceCore, RequestLimits
from ampflow.serving.models.registry import ModelRegistry
from ampflow.serving.models.servable import load_servable
from ampflow.serving.models.token_cost import (
    EXPORT_METADATA,
    TOKENIZER_ASSET,
    TokenCost,
    read_token_cost,
)

MODEL = "lengths"  # test_string_limits.py's senders address it
CAP, BUCKETS = 64, [16, 32, 64]
MAX_TOKENS = 4 * 16  # four short texts, or two of the 32 bucket
TOKENS_FLAG = "(--max-request-tokens)"


def _text_assets(version_dir, buckets=BUCKETS, split="whitespace") -> None:
    """What a text export writes beside its SavedModel for the server: the tokenizer's length
    (assets/tokenizer.json) and the length buckets (ampflow_export.json)."""
    (version_dir / TOKENIZER_ASSET).parent.mkdir(exist_ok=True)
    (version_dir / TOKENIZER_ASSET).write_text(json.dumps(
        {"max_sequence_length": CAP, "split": split}))
    (version_dir / EXPORT_METADATA).write_text(json.dumps({"input": {"length_buckets": buckets}}))


@pytest.fixture(scope="module")
def base_path(tmp_path_factory):
    base = tmp_path_factory.mktemp("request_tokens") / MODEL
    _write_model(base / "1")
    _text_assets(base / "1")
    return base


def _core(base_path, runner=None, **limits):
    registry = ModelRegistry((ModelConfig(MODEL, base_path),), settle_s=0.0)
    registry.start(0)
    return registry, InferenceCore(registry, runner, RequestLimits(**limits))


@pytest.fixture(scope="module")
def core(base_path):
    registry, core = _core(base_path, max_tokens=MAX_TOKENS)
    yield core
    registry.stop()


# ---- the bound: never below what a real tokenizer makes of the bytes -------------------------

HOSTILE = ["a b c d e f g", "!!!!!!!!", "a.b,c;d", "\u4e00\u4e8c\u4e09 x", "caf\u00e9 na\u00efve",
           "\u0130\u0130\u0130 \u00df", "  spaced   out  ", "", "x", "\u00e9" * 9,
           " ".join(["w1"] * 40), "a" * 50]


def _tokens_made(tokenize, texts) -> list[int]:
    """Each text's tokens as its tokenizer makes them (up to its last non-padding id)."""
    ids = np.asarray(tokenize(np.asarray(texts, dtype=object)))
    return [int(np.flatnonzero(row)[-1]) + 1 if row.any() else 0 for row in ids]


def _tokenizer(kind: str):
    from ampflow.modeling.tokenizer import CheckpointTokenizer, TokenizerConfig, fit_tokenizer

    if kind == "whitespace":
        return fit_tokenizer(["a b c d e f g w1 x caf\u00e9 na\u00efve"],
                             TokenizerConfig(max_sequence_length=CAP))
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "!", "x", "##a"]
    return CheckpointTokenizer(vocabulary, do_lower_case=True, sequence_length=CAP)


@pytest.mark.parametrize("kind, tight_text, tight_tokens", [
    ("whitespace", "a b c d e f g", 7),  # 13 bytes: ceil(13 / 2) words
    # 8 bytes: a piece each, and [CLS] [SEP]; slow: BERT's normalization table takes seconds
    pytest.param("wordpiece", "!!!!!!!!", 10, marks=pytest.mark.slow),
])
def test_the_byte_bound_holds_for_the_tokenizers_an_export_ships(kind, tight_text, tight_tokens,
                                                                 tmp_path):
    """Read from the files the tokenizer itself writes; reached where a byte is a token."""
    tokenizer = _tokenizer(kind)
    tokenizer.save(tmp_path / "assets")
    rule = read_token_cost(tmp_path)
    made = _tokens_made(tokenizer.tokenize, [*HOSTILE, tight_text])
    bounds = [rule.row_tokens(len(t.encode())) for t in [*HOSTILE, tight_text]]
    assert all(m <= b for m, b in zip(made, bounds, strict=True)), (made, bounds)
    assert made[-1] == bounds[-1] == tight_tokens
    assert rule.buckets == (CAP,)  # no ampflow_export.json: the cap, never less


def test_a_model_without_a_tokenizer_has_no_token_rule_and_an_unknown_one_costs_the_cap(
        base_path, tmp_path):
    shutil.copytree(base_path / "1", tmp_path / "1")
    (tmp_path / "1" / TOKENIZER_ASSET).unlink()
    assert read_token_cost(tmp_path / "1") is None
    _text_assets(tmp_path / "1", split="sentencepiece")
    assert read_token_cost(tmp_path / "1").padded_length(1) == CAP
    _text_assets(tmp_path / "1", buckets=[16, 32])  # not ending at the cap: not trusted
    assert read_token_cost(tmp_path / "1").buckets == (CAP,)
    cost = TokenCost(CAP, tuple(BUCKETS), 2)
    assert [cost.padded_length(n) for n in (0, 32, 33, 64, 65, 10**6)] == [16, 16, 32, 32, 64, 64]


# ---- the limit, through every decoding path -------------------------------------------------

@pytest.mark.parametrize("path", SENDERS)
def test_a_request_at_the_token_limit_answers_and_one_row_more_is_refused(core, path):
    send = SENDERS[path]
    long_text = b"w " * 16  # 32 bytes: at most 16 words, so the 16 bucket
    assert send(core, [b"ab"] * 3 + [long_text]) == Outcome("OK", (2, 2, 2, 32))
    over = send(core, [b"ab"] * 4 + [long_text])  # 5 x 16 = 80 tokens
    _refused(over, path, TOKENS_FLAG)
    assert "would run 80 tokens (5 rows, each padded" in over.error
    assert f"at most {MAX_TOKENS} tokens per request" in over.error
    # each row costs its own bucket: two texts of the 32 bucket fill the limit, and one more
    # short one is over it
    assert send(core, [b"w " * 17, b"w " * 17]) == Outcome("OK", (34, 34))
    _refused(send(core, [b"w " * 17, b"ab", b"w " * 17]), path, TOKENS_FLAG)
    assert send(core, [b"after"]) == Outcome("OK", (5,))  # nothing left behind


@pytest.mark.parametrize("rest", [False, True], ids=["grpc", "rest"])
def test_classify_counts_its_examples_tokens(core, rest):
    """A serialized tf.Example holds its text and more: its bytes bound the text's tokens."""
    assert _classify(core, ["ab"] * 4, rest=rest) == Outcome("OK", (2, 2, 2, 2))
    _refused(_classify(core, ["ab"] * 5, rest=rest), "-rest-" if rest else "grpc", TOKENS_FLAG)


def test_a_model_that_is_not_a_text_model_is_not_held_to_tokens(base_path, tmp_path):
    shutil.copytree(base_path / "1", tmp_path / MODEL / "1")
    (tmp_path / MODEL / "1" / TOKENIZER_ASSET).unlink()
    registry, core = _core(tmp_path / MODEL, max_tokens=16)
    try:
        assert SENDERS["tf-grpc-string_val"](core, [b"ab"] * 8) == Outcome("OK", (2,) * 8)
    finally:
        registry.stop()


def test_a_running_servers_token_flags_are_the_limits_its_core_checks(base_path):
    """`ServerConfig` -> `RequestLimits` in start_local_server (in process, gRPC on loopback)."""
    import grpc
    from serving_helpers import running_server

    from ampflow.serving.client import PredictionClient, RpcError
    from ampflow.serving.config import ServerConfig

    config = ServerConfig(models=(ModelConfig(MODEL, base_path),), host="127.0.0.1", port=0,
                          max_request_tokens=MAX_TOKENS, max_execution_tokens=16,
                          enable_warmup=False, grace_s=0.5)
    with running_server(config) as server, PredictionClient(server.address, timeout_s=30,
                                                            retries=0) as client:
        texts = [b"ab", b"abc", b"a", b"abcd"]  # 4 slices of one row each, joined in order
        assert client.predict(MODEL, texts).outputs["lengths"].tolist() == [2, 3, 1, 4]
        with pytest.raises(RpcError) as refused:
            client.predict(MODEL, texts + [b"x"])
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert TOKENS_FLAG in refused.value.details


# ---- slices -----------------------------------------------------------------------------------

def _recording_runner(rows: list):
    def run(servable, signature, inputs, _timeout):
        rows.append(len(next(iter(inputs.values()))))
        return servable.run(signature, inputs)
    return run


def test_a_request_above_the_execution_tokens_runs_in_slices_joined_in_order(base_path):
    rows: list[int] = []
    registry, core = _core(base_path, _recording_runner(rows), slice_tokens=2 * 16)
    try:
        texts = [b"x" * n for n in range(1, 8)]  # 7 rows of the 16 bucket: 112 tokens
        assert SENDERS["v2-rest-data"](core, texts) == Outcome("OK", tuple(range(1, 8)))
        assert rows == [2, 2, 2, 1]
        rows.clear()
        assert SENDERS["tf-grpc-string_val"](core, [b"w " * 17] * 3) == Outcome("OK", (34,) * 3)
        assert rows == [1, 1, 1]  # rows of the 32 bucket: one a slice
    finally:
        registry.stop()


def test_one_long_text_does_not_pad_the_short_ones_of_its_request(base_path):
    """1 long text among 31 short ones: the short ones run at their bucket, the long one at its
    own, and every answer is back in its row (as it was sent)."""
    rows: list[int] = []
    registry, core = _core(base_path, _recording_runner(rows))
    try:
        texts = [b"x" * (i % 7 + 1) for i in range(31)]
        texts.insert(5, b"w " * 60)
        assert SENDERS["v2-grpc-raw"](core, texts) == Outcome("OK", tuple(map(len, texts)))
        assert rows == [31, 1]
        rows.clear()
        assert SENDERS["tf-rest-instances-utf8"](core, [b"a", b"b"]) == Outcome("OK", (1, 1))
        assert rows == [2]  # one bucket: one run, as before
    finally:
        registry.stop()


def test_a_long_text_runs_apart_from_the_reviews_that_share_its_bucket_by_their_bytes(
        base_path):
    """31 reviews of 150 bytes and one of 1,000: the byte bound puts all 32 in the cap's bucket
    (150 bytes may hold 75 words), yet the reviews run without the long one (before, all 32
    ran padded to its length), each run still sliced at its bucket's tokens."""
    rows: list[int] = []
    registry, core = _core(base_path, _recording_runner(rows), slice_tokens=16 * CAP)
    try:
        texts = [b"a review " * 16 + b"x" * 6] * 31
        texts.insert(9, b"w " * 500)
        assert SENDERS["tf-grpc-string_val"](core, texts) == Outcome("OK", tuple(map(len, texts)))
        assert rows == [16, 15, 1]
    finally:
        registry.stop()


@pytest.fixture(scope="module")
def encoder_version(tmp_path_factory):
    """A one-layer BERT-style encoder on a 64-token cap, exported as the export step does."""
    import keras

    from ampflow.components.export_savedmodel.text_signatures import (
        length_buckets_of,
        save_text_servable,
    )
    from ampflow.modeling.text_models import EncoderShape, build_encoder_classifier
    from ampflow.modeling.tokenizer import TokenizerConfig, fit_tokenizer

    words = [f"w{i}" for i in range(40)]
    tokenizer = fit_tokenizer([" ".join(words)], TokenizerConfig(max_sequence_length=CAP))
    keras.utils.set_random_seed(5)
    model = build_encoder_classifier(EncoderShape(layers=1, hidden=16, heads=2), CAP,
                                     tokenizer.vocabulary_size, 3, dropout=0.0)
    version = tmp_path_factory.mktemp("encoder") / "reviews" / "1"
    save_text_servable(model, tokenizer, ["a", "b", "c"], version)
    (version / EXPORT_METADATA).write_text(json.dumps(
        {"input": {"length_buckets": length_buckets_of(model, CAP)}}))
    return version, words


@pytest.mark.slow  # exports a real encoder (~3 s quiet, 14 s on a loaded 2-core host)
def test_sliced_answers_are_the_single_runs(encoder_version):
    """1 long and 31 short texts, then 64 of mixed lengths: the same classes, and probabilities
    within float32 rounding of one run's, whether the request runs in one piece or by length
    bucket in slices."""
    from ampflow.serving.core import tokens

    version, words = encoder_version
    servable = load_servable("reviews", 1, version)
    assert servable.token_cost.buckets == (16, 32, 64)
    rng = np.random.default_rng(0)
    mixed = [" ".join(rng.choice(words, int(rng.integers(1, 60)))) for _ in range(64)]
    for texts in (["w1 w2"] * 7 + [" ".join(words)] + ["w1 w2"] * 24, mixed):
        inputs = {"text": np.asarray([t.encode() for t in texts], dtype=object)}
        whole = servable.run("serving_default", inputs)
        parts = tokens.row_parts(tokens.request_tokens(servable, inputs), 5 * 64)
        signature = servable.signature_defs["serving_default"]
        sliced = tokens.run_in_parts(lambda part, _left: servable.run("serving_default", part),
                                     inputs, parts, None, signature)
        assert len(parts) > 2 and sorted(np.concatenate(parts)) == list(range(len(texts)))
        np.testing.assert_array_equal(sliced["class_ids"], whole["class_ids"])
        np.testing.assert_allclose(sliced["probabilities"], whole["probabilities"], atol=1e-6)
        assert np.ptp(whole["probabilities"][:, 0]) > 1e-4  # rows differ: a mix-up would show


# ---- the server-side batcher ------------------------------------------------------------------

def test_the_batcher_merges_text_requests_of_one_length_bucket_only(base_path):
    """3 requests of 2 short texts and 2 of 3 long ones, sent at once: two full batches, one per
    bucket (before, a long request merged with short ones and padded them to its bucket), and
    each request gets its own answers."""
    from concurrent.futures import ThreadPoolExecutor

    from ampflow.serving.config import BatchingConfig
    from ampflow.serving.core.batching import Batcher

    servable = load_servable(MODEL, 1, base_path / "1")
    merged: list[tuple[int, int]] = []
    batcher = Batcher(BatchingConfig(max_batch_size=6, batch_timeout_ms=10_000),
                      lambda requests, rows: merged.append((requests, rows)))
    short, long = [b"ab", b"abc"], [b"w " * 20] * 3
    requests = [short, long, short, long, short]
    try:
        with ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda texts: batcher.run(
                servable, "serving_default",
                {"text": np.asarray(texts, dtype=object)}, 60)["lengths"].tolist(), requests))
    finally:
        batcher.close()
    assert sorted(merged) == [(2, 6), (3, 6)]
    assert answers == [[len(t) for t in texts] for texts in requests]


def test_string_outputs_of_parts_join_at_their_own_lengths(base_path):
    """A part's string output (Classify's class names) may be longer than the first part's:
    joined as objects, never cut to the first part's width."""
    from ampflow.serving.core import tokens

    servable = load_servable(MODEL, 1, base_path / "1")
    inputs = {"text": np.asarray([b"ab", b"w " * 20], dtype=object)}
    parts = tokens.row_parts(tokens.request_tokens(servable, inputs), 0)
    assert len(parts) == 2  # the 16 and the 32 bucket

    def run_part(part, _left):
        return {"lengths": np.asarray([t[:3] for t in part["text"]], dtype="S")}

    joined = tokens.run_in_parts(run_part, inputs, parts, None,
                                 servable.signature_defs["serving_default"])
    assert joined["lengths"].tolist() == [b"ab", b"w w"]
