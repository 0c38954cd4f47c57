"""Independent dense masks and biases of the core variants, written from their definitions
(docs and docstrings), not from cases/variants.py's mods: numpy, explicit index grids."""
from __future__ import annotations

import math

import numpy as np

from cases.model import Case


def _grid(sq: int, skv: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(sq)[:, None], np.arange(skv)[None, :]


def _doc_of_tokens(seq_len: int) -> np.ndarray:
    unit = seq_len // 64
    lengths = [n * unit for n in (5, 11, 3, 17, 8, 13, 7)] if unit else [seq_len]
    lengths[-1] += seq_len - sum(lengths)
    return np.concatenate([np.full(n, d) for d, n in enumerate(lengths)])


def _t5_bucket(distance: int, num_buckets: int) -> int:
    exact = num_buckets // 2
    if distance < exact:
        return distance
    octave = int(math.floor(math.log2(distance / exact)))  # whole doublings past `exact`
    upper_half = distance >= 1.5 * exact * 2 ** octave
    return min(exact + 2 * octave + int(upper_half), num_buckets - 1)


def dense_mask(case: Case) -> np.ndarray:
    """Boolean [Hq, Sq, Skv]: True where query i may see key j."""
    s, v = case.shape, case.variant
    i, j = _grid(s.Sq, s.Skv)
    if v.name in ("full", "activation_gelu"):
        m = np.ones((s.Sq, s.Skv), bool)
    elif v.name in ("causal", "alibi", "softcap", "rel_bias"):
        m = j <= i
    elif v.name == "sliding_window":
        w = int(v.param("w"))
        m = (j <= i) & (j > i - w)
    elif v.name == "prefix_lm":
        m = (j < int(v.param("p"))) | (j <= i)
    elif v.name == "document":
        doc = _doc_of_tokens(s.Skv)
        m = (doc[:, None] == doc[None, :]) & (j <= i)
    else:
        raise ValueError(f"no dense reference for {v.name}")
    return np.broadcast_to(m, (s.Hq, s.Sq, s.Skv)).copy()


def dense_score_transform(case: Case, scores: np.ndarray) -> np.ndarray:
    """Apply the variant's score modification to scaled scores [Hq, Sq, Skv] (float64)."""
    s, v = case.shape, case.variant
    i, j = _grid(s.Sq, s.Skv)
    if v.name == "alibi":
        slopes = np.array([2.0 ** (-8.0 * (h + 1) / s.Hq) for h in range(s.Hq)])
        return scores + slopes[:, None, None] * (j - i)[None]
    if v.name == "softcap":
        cap = float(v.param("cap"))
        return cap * np.tanh(scores / cap)
    if v.name == "activation_gelu":  # gelu(x) = x Phi(x), Phi the standard normal's CDF
        erf = np.vectorize(math.erf)
        return np.log(scores * 0.5 * (1.0 + erf(scores / math.sqrt(2.0))) + 1.0)
    if v.name == "rel_bias":
        import torch

        nb = int(v.param("nb"))
        gen = torch.Generator().manual_seed(20240917)
        table = torch.randn(s.Hq, nb, generator=gen).double().numpy()
        buckets = np.vectorize(lambda d: _t5_bucket(int(d), nb))(np.abs(i - j))
        return scores + table[:, buckets]
    return scores


def dense_attention(case: Case, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention written out on the whole [B, Hq, Sq, Skv] grid in float64: scaled scores, the
    variant's score transform, the mask (``dense_mask`` unless given, broadcastable to [B, Hq,
    Sq, Skv]), softmax; a row that sees no key gives out = 0 and lse = -inf. q, k, v are float64
    [B or 1, H, S, D] arrays (key/value heads repeated for GQA here). Returns (out, lse)."""
    s = case.shape
    group = s.Hq // s.Hkv
    k = np.broadcast_to(np.repeat(k, group, axis=1), (s.B, s.Hq, s.Skv, s.D))
    v = np.broadcast_to(np.repeat(v, group, axis=1), (s.B, s.Hq, s.Skv, s.D))
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(s.D)
    scores = np.stack([dense_score_transform(case, scores[b]) for b in range(s.B)])
    visible = np.broadcast_to(dense_mask(case) if mask is None else mask, scores.shape)
    scores = np.where(visible, scores, -np.inf)
    row_max = scores.max(-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max)  # exp(-inf) = 0 where masked
    total = weights.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", weights, v) / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf: a row that sees nothing
        lse = (row_max + np.log(total))[..., 0]
    return out, lse
