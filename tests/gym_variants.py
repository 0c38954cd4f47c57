"""Attention-gym style variants that the suite's authors did not write: a case module written
by an outside trial of the suite from its docs alone (README.md, docs/cases.md, docs/oracle.md
and the example module), as a user would, on 2026-12-02. Kept as it was written (this
docstring aside), so the oracle is proven on mods it was not shaped around:
tests/test_third_party_variants.py.

- natten2d: NATTEN's 2D neighbourhood mask, the window shifted inward at the borders;
- t5_bias: T5's bucketed relative position bias (log-spaced buckets, a float32 table);
- softcap_window: tanh soft-capping inside a causal sliding window;
- prefix_doc: a prefix LM inside packed documents of uneven lengths;
- head_block_bias: a per-head block table, a float32 slope and a float64 0-d constant in a
  torch.where; compiled on the CPU, torch gives NaN for it (docs/findings.md, finding 3).
"""
from __future__ import annotations

import math

import torch

from cases.catalog import check_profile
from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder


# --- NATTEN 2D neighborhood attention --------------------------------------------------------
def natten2d(width: int, kernel: int) -> Variant:
    """Tokens on a 2D grid of `width` columns (row-major, S // width rows). Query i at (r, c)
    sees key j at (r', c') iff |clamp(r, k//2, R-1-k//2) - r'| <= k//2 and the same for columns
    (NATTEN: the window is shifted inward at borders, so each query sees k*k keys)."""
    return Variant("natten2d", (("gw", width), ("k", kernel)))


@builder("natten2d")
def _build_natten2d(variant, shape, device):
    W, K = int(variant.param("gw")), int(variant.param("k"))
    H = shape.Skv // W
    half = K // 2

    def natten_mask(b, h, q_idx, kv_idx):
        q_r, q_c = q_idx // W, q_idx % W
        kv_r, kv_c = kv_idx // W, kv_idx % W
        center_r = q_r.clamp(half, (H - 1) - half)
        center_c = q_c.clamp(half, (W - 1) - half)
        return ((center_r - kv_r).abs() <= half) & ((center_c - kv_c).abs() <= half)

    return Mods(natten_mask, None)


# --- T5 bucketed relative position bias -------------------------------------------------------
def t5_bias(num_buckets: int, max_distance: int) -> Variant:
    """score + table[bucket(kv - q), h], table float32 [num_buckets, Hq] (seeded randn * 0.5);
    bidirectional T5 buckets: half per sign, exact below num_buckets//4, log-spaced up to
    max_distance."""
    return Variant("t5_bias", (("nb", num_buckets), ("md", max_distance)))


@builder("t5_bias")
def _build_t5_bias(variant, shape, device):
    nb, md = int(variant.param("nb")), int(variant.param("md"))
    gen = torch.Generator().manual_seed(1234)
    table = (torch.randn(nb, shape.Hq, generator=gen) * 0.5).to(device)
    half = nb // 2
    max_exact = half // 2

    def t5_score(score, b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx
        bucket = (rel > 0).to(torch.long) * half
        n = rel.abs()
        large = max_exact + (
            torch.log(n.float() / max_exact) / math.log(md / max_exact) * (half - max_exact)
        ).to(torch.long)
        large = torch.clamp(large, max=half - 1)
        bucket = bucket + torch.where(n < max_exact, n, large)
        return score + table[bucket, h]

    return Mods(None, t5_score)


# --- tanh soft-cap + sliding window ------------------------------------------------------------
def softcap_window(cap: int, window: int) -> Variant:
    """cap * tanh(score / cap); causal window: query i sees key j iff 0 <= i - j < window."""
    return Variant("softcap_window", (("cap", cap), ("w", window)))


@builder("softcap_window")
def _build_softcap_window(variant, shape, device):
    cap, window = float(variant.param("cap")), int(variant.param("w"))

    def window_mask(b, h, q_idx, kv_idx):
        d = q_idx - kv_idx
        return (d >= 0) & (d < window)

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return Mods(window_mask, softcap)


# --- prefix LM inside packed documents ---------------------------------------------------------
def prefix_doc(num_docs: int, prefix: int) -> Variant:
    """Packed documents of uneven lengths (doc d has weight d+1); query i sees key j iff same
    document and (j <= i or j - start(doc) < prefix)."""
    return Variant("prefix_doc", (("n", num_docs), ("p", prefix)))


@builder("prefix_doc")
def _build_prefix_doc(variant, shape, device):
    n, prefix = int(variant.param("n")), int(variant.param("p"))
    S = shape.Skv
    weights = torch.arange(1, n + 1, dtype=torch.float64)
    bounds = (weights.cumsum(0) / weights.sum() * S).round().long()
    lengths = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), bounds]))
    doc_id = torch.repeat_interleave(torch.arange(n), lengths).to(device)
    doc_start = torch.cat([torch.zeros(1, dtype=torch.long), bounds[:-1]]).to(device)

    def prefix_doc_mask(b, h, q_idx, kv_idx):
        same = doc_id[q_idx] == doc_id[kv_idx]
        in_prefix = (kv_idx - doc_start[doc_id[kv_idx]]) < prefix
        return same & ((kv_idx <= q_idx) | in_prefix)

    return Mods(prefix_doc_mask, None)


# --- third-party style: per-head table, float64 0-d constant, torch.where ----------------------
def head_block_bias(block: int) -> Variant:
    """Causal; score + torch.where(q//t == kv//t, bias[h][q//t, kv//t] * alpha, -slope[h] * alpha
    * (q - kv)) where bias float32 [Hq, nq, nk] seeded, slope[h] = 2^-(h+1), alpha float64 0.75."""
    return Variant("head_block_bias", (("t", block),))


@builder("head_block_bias")
def _build_head_block_bias(variant, shape, device):
    t = int(variant.param("t"))
    gen = torch.Generator().manual_seed(99)
    bias = torch.randn(shape.Hq, -(-shape.Sq // t), -(-shape.Skv // t), generator=gen).to(device)
    slope = (2.0 ** -torch.arange(1, shape.Hq + 1, dtype=torch.float32)).to(device)
    alpha = torch.tensor(0.75, dtype=torch.float64, device=device)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def score_mod(score, b, h, q_idx, kv_idx):
        same_block = (q_idx // t) == (kv_idx // t)
        add = torch.where(same_block, bias[h][q_idx // t, kv_idx // t] * alpha,
                          -slope[h] * alpha * (q_idx - kv_idx))
        return score + add

    return Mods(causal, score_mod)


LENGTH_PARAMS = {"softcap_window": ("w",), "prefix_doc": ("p",), "head_block_bias": ("t",)}


def cases(profile: str) -> list[Case]:
    div = {"full": 1, "smoke": 8}[check_profile(profile)]
    tags = frozenset({"custom", profile})
    out = []
    for S in (2048 // div, 1600 // div):  # 256 / 200 at smoke
        mha = Shape(B=1, Hq=4, Hkv=4, Sq=S, Skv=S, D=64)
        gqa = Shape(B=2, Hq=4, Hkv=2, Sq=S, Skv=S, D=64)
        out += [
            Case(natten2d(16 if S % 16 == 0 else 10, 5), mha, "bf16", "fwd", tags=tags),
            Case(t5_bias(32, 128), gqa, "bf16", "fwd", tags=tags),
            Case(softcap_window(5, 512 // div), mha, "bf16", "fwd", tags=tags),
            Case(prefix_doc(3, 128 // div), gqa, "bf16", "fwd", tags=tags),
            Case(head_block_bias(256 // div), mha, "fp32", "fwd", tags=tags),
        ]
    return out
