"""A small NumPy BERT in float64, from the formulas, and the tolerance the tests derive for it.

Written from Hugging Face's `BertModel` (eval mode) and the BERT paper, not from ampflow's Keras
layers: the tests compare the Keras encoder's outputs with it.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf

# Unit roundoff of each policy's compute dtype: 2^-24 (float32), 2^-8 (bfloat16: 8 significant
# bits), 2^-11 (float16: 11).
UNIT_ROUNDOFF = {"float32": 2.0**-24, "mixed_bfloat16": 2.0**-8, "mixed_float16": 2.0**-11}
# The tolerance, from the math. The longest dot product has K terms (the intermediate size,
# 128 in the tests). Its float32 rounding error is at most K·u relative to Σ|a·b| in the worst
# case (Higham's γ_K), and λ·√K·u with probability ≥ 1 - 2·exp(-λ²/2) when the roundings are
# independent (Higham & Mary 2019): the tests take √K·u per stage (λ = 1; the stage count,
# taken as if every stage met the largest output, is the margin). From the ids to an output
# there are 13 rounding stages (embedding sum, LayerNorm, q/k/v, scores, softmax, context,
# attention output, LayerNorm, intermediate, GELU, output, LayerNorm per layer, the pooler),
# each passing on values of the outputs' size (LayerNorm'd, gamma ~ 1): float32 outputs are
# within 13·√K·u·max|output| ≈ 3.5e-5 of the exact ones (observed ~1.3e-6). Half precision
# rounds every stored activation to its u (its matmuls accumulate in float32 on CPU, so the
# √K factor does not apply): 13·u·max|output| (bfloat16 ≈ 0.2, observed ~0.05; float16 ≈
# 0.025, observed ~0.004). A wrong formula (tanh GELU, a dropped mask, an unscaled score) is
# off by 1e-3 or more.
STAGES = 13


def tolerance(policy: str, want: np.ndarray, longest_dot: int) -> float:
    """How far the encoder's outputs may be from `want` (the float64 ones) under `policy`."""
    accumulated = np.sqrt(longest_dot) if policy == "float32" else 1.0
    return STAGES * accumulated * UNIT_ROUNDOFF[policy] * float(np.abs(want).max())


def numpy_bert(t: dict[str, np.ndarray], token_ids, segment_ids, *, heads: int,
               eps: float = 1e-12, pad_id: int = 0, approximate_gelu: bool = False):
    """Hugging Face's BertModel, eval mode, in float64: (sequence output, pooled output).

    The sizes come from the tensors (`BertModel` names, `[out, in]` Linear weights).
    """
    t = {k: v.astype(np.float64) for k, v in t.items()}
    batch, seq = token_ids.shape
    hidden = t["embeddings.word_embeddings.weight"].shape[1]
    layers = len({k.split(".")[2] for k in t if k.startswith("encoder.layer.")})
    size = hidden // heads

    def linear(x, name):
        return x @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    def layer_norm(x, name):
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(variance + eps) * t[f"{name}.weight"] + t[f"{name}.bias"]

    def split_heads(x):
        return x.reshape(batch, seq, heads, size).transpose(0, 2, 1, 3)

    x = (t["embeddings.word_embeddings.weight"][token_ids]
         + t["embeddings.position_embeddings.weight"][np.arange(seq)][None]
         + t["embeddings.token_type_embeddings.weight"][segment_ids])
    x = layer_norm(x, "embeddings.LayerNorm")
    # the extended attention mask: 0 for a token, the dtype's minimum for padding, added
    additive = np.where(token_ids != pad_id, 0.0, np.finfo(np.float64).min)[:, None, None, :]
    for n in range(layers):
        p = f"encoder.layer.{n}"
        q, k, v = (split_heads(linear(x, f"{p}.attention.self.{part}"))
                   for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size) + additive
        probabilities = np.exp(scores - scores.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = layer_norm(x + linear(context, f"{p}.attention.output.dense"),
                       f"{p}.attention.output.LayerNorm")
        inner = linear(x, f"{p}.intermediate.dense")
        if approximate_gelu:  # Google's BERT code (and keras-hub): the tanh form
            inner = 0.5 * inner * (1.0 + np.tanh(np.sqrt(2.0 / np.pi)
                                                 * (inner + 0.044715 * inner**3)))
        else:  # Hugging Face's "gelu": the exact erf form
            inner = inner * 0.5 * (1.0 + erf(inner / np.sqrt(2.0)))
        x = layer_norm(x + linear(inner, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    return x, np.tanh(linear(x[:, 0], "pooler.dense"))
