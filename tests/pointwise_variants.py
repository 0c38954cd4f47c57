"""Variants whose mods are correct point by point but not on broadcast index grids: written as
users write mods for flex_attention (0-d tensors in, one value out), in the styles that one
call on broadcast grids gets wrong or cannot run: chained lookups in per-batch or per-head
tables, torch.where over stacked index pairs, reductions over indexed slices, and a float32
table times a float64 0-d tensor (a float64 product per point, a float32 one broadcast).
A case module for the tests (``cases_modules=("tests.pointwise_variants",)``), in no matrix.

Each variant's captured tensors come from ``tables`` (fixed seed, per variant and shape), so
the tests' independent per-point definitions read the very same numbers.
"""
from __future__ import annotations

import zlib

import torch

from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder

TABLE_SEED = 20250702
#: Side of the tiles of ``tiles_per_batch`` and ``tiles_per_head``: flex_attention's default
#: block size, so a tile's table entry decides a whole block (empty or full), and a block mask
#: shared by every batch or head would skip blocks that another one sees.
TILE = 128
#: Period of the positions of ``chained_pair_bias`` and ``promoted_bias``.
PERIOD = 4

#: Variants with a mask mod of the styles above (no score mod).
MASK_VARIANTS = ("tiles_per_batch", "tiles_per_head", "counted_documents", "per_head_prefix",
                 "symmetric_pairs")
#: Variants with a score mod of the styles above, and a causal mask.
SCORE_VARIANTS = ("chained_pair_bias", "promoted_bias", "symmetric_pair_bias",
                  "head_temperature")
NAMES = MASK_VARIANTS + SCORE_VARIANTS
#: The variants Inductor compiles (torch 2.13, CPU); the others reduce or stack inside a mod,
#: which its pointwise lowering rejects ("Buffers cannot be created while lowering a
#: pointwise subgraph", or an assertion on aten.cat).
COMPILABLE = ("tiles_per_batch", "tiles_per_head", "chained_pair_bias", "promoted_bias")


def tables(name: str, shape: Shape) -> dict[str, torch.Tensor]:
    """The captured tensors of variant ``name`` for ``shape`` (deterministic)."""
    gen = torch.Generator().manual_seed(TABLE_SEED + zlib.crc32(name.encode()))
    side = max(shape.Sq, shape.Skv)
    tiles = (-(-shape.Sq // TILE), -(-shape.Skv // TILE))
    if name == "tiles_per_batch":
        return {"allowed": torch.rand(shape.B, *tiles, generator=gen) < 0.5}
    if name == "tiles_per_head":
        return {"allowed": torch.rand(shape.Hq, *tiles, generator=gen) < 0.5}
    if name == "counted_documents":
        starts = {0, shape.Skv * 3 // 16, shape.Skv * 7 // 16, shape.Skv * 12 // 16}
        return {"starts": torch.tensor(sorted(starts))}
    if name == "per_head_prefix":
        return {"parts": torch.randint(0, max(1, shape.Skv // 6), (shape.Hq, 3), generator=gen)}
    if name == "symmetric_pairs":
        return {"allowed": torch.rand(side, side, generator=gen) < 0.3}
    if name == "chained_pair_bias":
        return {"bias": torch.randn(shape.Hq, PERIOD, PERIOD, generator=gen)}
    if name == "promoted_bias":
        return {"bias": torch.randn(shape.Hq, PERIOD, generator=gen),  # float32
                "gain": torch.tensor(0.7, dtype=torch.float64)}
    if name == "symmetric_pair_bias":
        return {"bias": torch.randn(shape.Hq, side, side, generator=gen)}
    if name == "head_temperature":
        return {"parts": torch.rand(shape.Hq, 4, generator=gen) + 0.5}
    raise ValueError(f"unknown test variant {name!r}; known: {', '.join(NAMES)}")


def variant(name: str) -> Variant:
    tables(name, Shape(1, 1, 1, 1, 1, 1))  # a one-line error for an unknown name
    return Variant(name)


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _ordered_pair(q_idx, kv_idx):
    """(min, max) of the two indices as a 2-vector; the stacks only line up for scalars."""
    return torch.where(q_idx <= kv_idx, torch.stack((q_idx, kv_idx)),
                       torch.stack((kv_idx, q_idx)))


def _mods(name: str, t: dict[str, torch.Tensor]):
    if name == "tiles_per_batch":
        def tiles_per_batch(b, h, q_idx, kv_idx):
            """Query i sees key j iff tile (i // 128, j // 128) is allowed in batch b's table,
            or i == j (a chained lookup: batch b's table, then its entry)."""
            return t["allowed"][b][q_idx // TILE, kv_idx // TILE] | (q_idx == kv_idx)
        return tiles_per_batch, None
    if name == "tiles_per_head":
        def tiles_per_head(b, h, q_idx, kv_idx):
            """The same with one table per query head h."""
            return t["allowed"][h][q_idx // TILE, kv_idx // TILE] | (q_idx == kv_idx)
        return tiles_per_head, None
    if name == "counted_documents":
        def counted_documents(b, h, q_idx, kv_idx):
            """Causal within documents; a token's document is the number of document starts
            at or before it (a reduction)."""
            starts = t["starts"]
            return ((starts <= q_idx).sum() == (starts <= kv_idx).sum()) & (kv_idx <= q_idx)
        return counted_documents, None
    if name == "per_head_prefix":
        def per_head_prefix(b, h, q_idx, kv_idx):
            """Causal plus a bidirectional prefix whose length, for head h, is the sum of row h
            of ``parts`` (a reduction over an indexed slice)."""
            return (kv_idx < t["parts"][h].sum()) | (kv_idx <= q_idx)
        return per_head_prefix, None
    if name == "symmetric_pairs":
        def symmetric_pairs(b, h, q_idx, kv_idx):
            """Causal, or allowed[min(i, j), max(i, j)] (torch.where over stacked pairs)."""
            pair = _ordered_pair(q_idx, kv_idx)
            return t["allowed"][pair[0], pair[1]] | (kv_idx <= q_idx)
        return symmetric_pairs, None
    if name == "chained_pair_bias":
        def chained_pair_bias(score, b, h, q_idx, kv_idx):
            """score + bias[h][i % 4, j % 4] (a chained lookup)."""
            return score + t["bias"][h][q_idx % PERIOD, kv_idx % PERIOD]
        return _causal, chained_pair_bias
    if name == "promoted_bias":
        def promoted_bias(score, b, h, q_idx, kv_idx):
            """score + bias[h, (i - j) % 4] * gain: a float32 entry times a float64 0-d gain."""
            return score + t["bias"][h, (q_idx - kv_idx) % PERIOD] * t["gain"]
        return _causal, promoted_bias
    if name == "symmetric_pair_bias":
        def symmetric_pair_bias(score, b, h, q_idx, kv_idx):
            """score + bias[h, min(i, j), max(i, j)] (torch.where over stacked pairs)."""
            pair = _ordered_pair(q_idx, kv_idx)
            return score + t["bias"][h, pair[0], pair[1]]
        return _causal, symmetric_pair_bias

    def head_temperature(score, b, h, q_idx, kv_idx):
        """score * mean(parts[h]) (a reduction over an indexed slice)."""
        return score * t["parts"][h].mean()
    return _causal, head_temperature


def _build(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    t = {k: v.to(device) for k, v in tables(variant.name, shape).items()}
    return Mods(*_mods(variant.name, t))


for _name in NAMES:
    builder(_name)(_build)


def cases(profile: str) -> list[Case]:
    """None: the tests run these variants directly."""
    return []
