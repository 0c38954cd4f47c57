"""Deliberately wrong outputs, for proving that the verdict catches real bugs.

Each fault takes a case, its inputs and a correct dtype output, and returns a broken output
as a buggy backend would produce it. Faults that change the semantics (a row that ignores the
mask, an off-by-one mask, a dropped key block, a lost score mod) are recomputed with the
baseline kernel on the wrong semantics, so the only difference from a correct output is the bug.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.variants import Mods, build_mods
from reference.kernel import chunked_attention

Fault = Callable[[Case, Inputs, torch.Tensor], torch.Tensor]


def _recompute(case: Case, inputs: Inputs, mods: Mods) -> torch.Tensor:
    dtype = torch_dtype(case.dtype)
    out, _ = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=dtype)
    return out.to(dtype)


def _middle(n: int) -> int:
    """Row S/2+1, or the last row of a sequence too short for it (S = 1 or 2)."""
    return min(n // 2 + 1, n - 1)


def row_ignores_mask(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """Query row S/2+1 of every head sees every key (its mask is not applied)."""
    mods = build_mods(case.variant, case.shape)
    row = _middle(case.shape.Sq)
    mask = mods.mask_mod

    def leaky(b, h, q_idx, kv_idx):
        return mask(b, h, q_idx, kv_idx) | (q_idx == row)

    out = good.clone()
    out[:, :, row] = _recompute(case, inputs, replace(mods, mask_mod=leaky))[:, :, row]
    return out


def mask_off_by_one(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """The mask is evaluated one key too far: key j is judged as key j - 1."""
    mods = build_mods(case.variant, case.shape)
    mask = mods.mask_mod

    def shifted(b, h, q_idx, kv_idx):
        return mask(b, h, q_idx, kv_idx - 1)

    return _recompute(case, inputs, replace(mods, mask_mod=shifted))


def dropped_key_block(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """Key block 1 (keys 128..255, or the second eighth of a short sequence) is skipped."""
    mods = build_mods(case.variant, case.shape)
    block = min(128, max(1, case.shape.Skv // 8))
    mask = mods.mask_mod

    def dropped(b, h, q_idx, kv_idx):
        keep = (kv_idx < block) | (kv_idx >= 2 * block)
        return keep if mask is None else keep & mask(b, h, q_idx, kv_idx)

    return _recompute(case, inputs, replace(mods, mask_mod=dropped))


def score_mod_ignored(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """The score mod is silently not applied (the mask still is)."""
    mods = build_mods(case.variant, case.shape)
    return _recompute(case, inputs, replace(mods, score_mod=None))


def head_scaled(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """One head's output is 1% too large (a wrong per-head scale)."""
    out = good.clone()
    h = case.shape.Hq // 2
    out[:, h] = (out[:, h].float() * 1.01).to(good.dtype)
    return out


def heads_swapped(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """Two query heads' outputs are exchanged (a wrong head index)."""
    out = good.clone()
    out[:, [0, 1]] = good[:, [1, 0]]
    return out


def last_row_zeroed(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """The last query row is left at zero (a tail block never written)."""
    out = good.clone()
    out[:, :, -1] = 0
    return out


def row_from_neighbour(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """One query row holds its neighbour's output (a wrong row index)."""
    out = good.clone()
    row = _middle(case.shape.Sq)
    out[:, :, row] = good[:, :, row - 1]
    return out


def single_nan(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """One NaN in one element."""
    out = good.clone()
    out[-1, -1, _middle(case.shape.Sq), 0] = math.nan
    return out


def single_inf(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """One +Inf in one element."""
    out = good.clone()
    out[0, 0, 0, -1] = math.inf
    return out


def wrong_scale(case: Case, inputs: Inputs, good: torch.Tensor) -> torch.Tensor:
    """Scores scaled by 1/D instead of 1/sqrt(D)."""
    d = case.shape.D
    shrunk = Inputs(inputs.q.float().mul(1 / math.sqrt(d)).to(inputs.q.dtype), inputs.k, inputs.v)
    mods = build_mods(case.variant, case.shape)
    return _recompute(case, shrunk, mods)


def _has_mask(case: Case) -> bool:
    return build_mods(case.variant, case.shape).mask_mod is not None


def _has_score_mod(case: Case) -> bool:
    return build_mods(case.variant, case.shape).score_mod is not None


#: name -> (fault, applies to case). A fault that would not change a case's output (an
#: off-by-one mask where there is no mask) does not apply to it.
FAULTS: dict[str, tuple[Fault, Callable[[Case], bool]]] = {
    "row_ignores_mask": (row_ignores_mask, _has_mask),
    "mask_off_by_one": (mask_off_by_one, _has_mask),
    "dropped_key_block": (dropped_key_block, lambda case: True),
    "score_mod_ignored": (score_mod_ignored, _has_score_mod),
    "head_scaled": (head_scaled, lambda case: True),
    "heads_swapped": (heads_swapped, lambda case: case.shape.Hq > 1),
    "last_row_zeroed": (last_row_zeroed, lambda case: True),
    "row_from_neighbour": (row_from_neighbour, lambda case: case.shape.Sq > 2),
    "single_nan": (single_nan, lambda case: True),
    "single_inf": (single_inf, lambda case: True),
    "wrong_scale": (wrong_scale, lambda case: True),
}
