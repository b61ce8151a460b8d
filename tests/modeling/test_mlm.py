"""BERT's masking rule, counted over many tokens, and the masked-LM head's arithmetic.

Rates are checked against binomial bounds (6 standard deviations: a correct rule fails about
once in 10⁹ runs, a rule off by a tenth of its rate fails always at these counts), so the test
holds for any seed and any CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from ampflow.modeling.mlm import IGNORED, gather_predictions, mask_tokens

VOCAB, PAD, UNK, CLS, SEP, MASK = 500, 0, 1, 2, 3, 4
SPECIAL = (PAD, UNK, CLS, SEP, MASK)


def _sequences(rng, rows: int = 4000, length: int = 48) -> np.ndarray:
    """`[CLS] words [SEP] [PAD]…` with varied lengths; a few [UNK] among the words."""
    ids = rng.integers(5, VOCAB, (rows, length)).astype(np.int32)
    ids[rng.random(ids.shape) < 0.02] = UNK
    lengths = rng.integers(3, length + 1, rows)
    for row, n in enumerate(lengths):
        ids[row, 0], ids[row, n - 1], ids[row, n:] = CLS, SEP, PAD
    return ids


def _within(count: int, trials: int, p: float) -> bool:
    sd = np.sqrt(trials * p * (1 - p))
    return abs(count - trials * p) <= 6 * sd


@pytest.fixture(scope="module")
def masked():
    rng = np.random.default_rng(0)
    original = _sequences(rng)
    batch = mask_tokens(original, np.random.default_rng(1), special_ids=SPECIAL, mask_id=MASK,
                        vocab_size=VOCAB)
    return original, batch


def test_fifteen_percent_of_ordinary_tokens_are_chosen(masked):
    original, batch = masked
    ordinary = ~np.isin(original, SPECIAL)
    chosen = batch.labels != IGNORED
    assert _within(int(chosen.sum()), int(ordinary.sum()), 0.15)


def test_special_tokens_are_never_chosen_or_changed(masked):
    original, batch = masked
    special = np.isin(original, SPECIAL)
    assert (batch.labels[special] == IGNORED).all()
    np.testing.assert_array_equal(batch.token_ids[special], original[special])


def test_labels_are_on_chosen_positions_only_and_hold_the_original_id(masked):
    original, batch = masked
    chosen = batch.labels != IGNORED
    np.testing.assert_array_equal(batch.labels[chosen], original[chosen])
    # an unchosen position is never altered: nothing is changed without a label to learn from
    np.testing.assert_array_equal(batch.token_ids[~chosen], original[~chosen])


def test_chosen_tokens_are_80_percent_mask_10_random_10_kept(masked):
    original, batch = masked
    chosen = batch.labels != IGNORED
    n = int(chosen.sum())
    now, before = batch.token_ids[chosen], original[chosen]
    as_mask = now == MASK
    kept = now == before
    replaced = ~as_mask & ~kept
    assert _within(int(as_mask.sum()), n, 0.8)
    # a random draw equal to the original also reads as "kept": 1 in the ordinary vocabulary
    p_same = 0.1 / (VOCAB - len(SPECIAL))
    assert _within(int(kept.sum()), n, 0.1 + p_same)
    assert _within(int(replaced.sum()), n, 0.1 - p_same)
    assert not np.isin(now[replaced], SPECIAL).any()  # random ids are ordinary tokens
    assert len(np.unique(now[replaced])) > (VOCAB - len(SPECIAL)) * 0.9  # drawn across them


def test_max_predictions_caps_each_row_and_leaves_the_rest_untouched():
    rng = np.random.default_rng(2)
    original = _sequences(rng, rows=500)
    batch = mask_tokens(original, rng, special_ids=SPECIAL, mask_id=MASK, vocab_size=VOCAB,
                        rate=0.5, max_predictions=4)
    chosen = batch.labels != IGNORED
    assert chosen.sum(axis=1).max() == 4
    np.testing.assert_array_equal(batch.token_ids[~chosen], original[~chosen])


def test_gather_predictions_packs_the_chosen_positions_in_order():
    labels = np.full((2, 6), IGNORED, np.int32)
    labels[0, [1, 4]] = [7, 9]
    positions, ids, weights = gather_predictions(labels, 3)
    np.testing.assert_array_equal(positions, [[1, 4, 0], [0, 0, 0]])
    np.testing.assert_array_equal(ids, [[7, 9, 0], [0, 0, 0]])
    np.testing.assert_array_equal(weights, [[1, 1, 0], [0, 0, 0]])


def test_the_head_scores_against_the_tied_embedding_table():
    import keras

    from ampflow.modeling.mlm import MaskedLmHead

    rng = np.random.default_rng(3)
    hidden, table = rng.standard_normal((2, 3, 8)), rng.standard_normal((11, 8))
    head = MaskedLmHead(8, 11, layer_norm_eps=1e-6)
    logits = np.asarray(head(hidden.astype("float32"), table.astype("float32")))
    head.output_bias.assign(np.arange(11, dtype="float32"))
    with_bias = np.asarray(head(hidden.astype("float32"), table.astype("float32")))
    kernel, bias = (np.asarray(v) for v in (head.transform.kernel, head.transform.bias))
    x = np.asarray(keras.activations.gelu(hidden @ kernel + bias, approximate=False))
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(logits, x @ table.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(with_bias - logits, np.broadcast_to(np.arange(11), logits.shape),
                               atol=1e-4)
