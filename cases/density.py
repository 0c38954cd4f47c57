"""How much of a case's score matrix its mask leaves visible, and the work that costs.

``density`` is the exact share of visible (query, key) pairs, the mask evaluated point by
point as flex_attention evaluates it; ``block_density`` the share of the 128 x 128 tiles with
any visible pair (what a block-sparse kernel must still compute: a tile-level skip cannot do
better). ``attention_flops`` counts 4·D flops per visible pair and head (QKᵀ and PV, a multiply
and an add each), times 3.5 for a backward case (the backward's five matmuls to the forward's
two, FlashAttention's convention).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from cases.model import Case

BLOCK = 128  # flex_attention's default block size
#: Rows of the query grid evaluated at once (bounds the bool grid to ROWS x Skv per b, h).
ROWS = 512
BACKWARD_FACTOR = 3.5


@dataclass(frozen=True)
class MaskDensity:
    density: float  # visible pairs / all pairs
    block_density: float  # tiles with any visible pair / all tiles
    visible_pairs: int  # over the batch and the query heads


def mask_density(case: Case) -> MaskDensity:
    """The density of ``case``'s mask (1.0 without one); cached per variant and shape."""
    return _density(case.variant, case.shape)


def attention_flops(case: Case, visible_pairs: int) -> float:
    flops = 4.0 * case.shape.D * visible_pairs
    return flops * BACKWARD_FACTOR if case.mode == "fwd+bwd" else flops


@lru_cache(maxsize=256)
def _density(variant, shape) -> MaskDensity:
    from cases.pointwise import evaluate_mask, mask_dependence
    from cases.variants import build_mods

    mask_mod = build_mods(variant, shape).mask_mod
    all_pairs = shape.B * shape.Hq * shape.Sq * shape.Skv
    if mask_mod is None:
        return MaskDensity(1.0, 1.0, all_pairs)
    depends = mask_dependence(mask_mod)
    batches = shape.B if "b" in depends else 1
    heads = shape.Hq if "h" in depends else 1
    row_tiles, col_tiles = -(-shape.Sq // BLOCK), -(-shape.Skv // BLOCK)
    visible, tiles_seen = 0, 0
    kv_idx = torch.arange(shape.Skv)
    for b in range(batches):
        for h in range(heads):
            tiles = torch.zeros(row_tiles, col_tiles, dtype=torch.bool)
            for start in range(0, shape.Sq, ROWS):
                q_idx = torch.arange(start, min(start + ROWS, shape.Sq))
                grid = evaluate_mask(mask_mod, torch.tensor([b]), torch.tensor([h]), q_idx,
                                     kv_idx)[0, 0]
                visible += int(grid.sum())
                rows = q_idx // BLOCK
                hit = torch.zeros(row_tiles, shape.Skv, dtype=torch.bool)
                hit.index_put_((rows,), grid, accumulate=True)
                tiles |= _tile_any(hit, col_tiles)
            tiles_seen += int(tiles.sum())
    scale = (shape.B // batches) * (shape.Hq // heads)
    visible *= scale
    return MaskDensity(visible / all_pairs, tiles_seen / (batches * heads * row_tiles * col_tiles),
                       visible)


def _tile_any(rows: torch.Tensor, col_tiles: int) -> torch.Tensor:
    """[row_tiles, Skv] bool -> [row_tiles, col_tiles]: any visible pair in each tile."""
    pad = col_tiles * BLOCK - rows.shape[1]
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad))
    return rows.view(rows.shape[0], col_tiles, BLOCK).any(dim=2)
