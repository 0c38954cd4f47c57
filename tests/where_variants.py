"""Score mods whose value is finite everywhere while autograd's slope is not at some points:
torch.where's branch not taken has an infinite or NaN derivative there, and the backward
multiplies it by 0 (tests/test_row_noise.py; an outside audit found the NaN slope made every
noise limit NaN and a correct fp32 backend a MISMATCH)."""
from __future__ import annotations

import torch

from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@builder("where_distance_damped")
def _distance_damped(variant, shape, device):
    """Distant keys' scores divided by the square root of their distance; the diagonal
    (distance 0, where 1 / sqrt(0) is inf) kept as is."""
    def damped(score, b, h, q_idx, kv_idx):
        distance = (q_idx - kv_idx).to(score.dtype)
        return torch.where(distance > 0, score / distance.sqrt(), score)

    return Mods(_causal, damped)


@builder("where_sqrt_positive")
def _sqrt_positive(variant, shape, device):
    """2 sqrt(score) for positive scores, the score itself otherwise (sqrt of a negative is
    NaN in the branch not taken)."""
    def sqrt_positive(score, b, h, q_idx, kv_idx):
        return torch.where(score > 0, 2 * torch.sqrt(score), score)

    return Mods(_causal, sqrt_positive)


@builder("where_first_key_forced")
def _first_key_forced(variant, shape, device):
    """Forces attention onto key 0 with a score of +inf: flex_attention's answer is NaN in
    every row that sees it (inf - inf in the softmax)."""
    def forced(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx == 0, float("inf"), score)

    return Mods(_causal, forced)


@builder("softplus_naive")
def _softplus_naive(variant, shape, device):
    """A softplus of the score written out, log(1 + exp(40 s)) / 40: finite in float64, while
    in float32, where flex_attention evaluates it, exp(40 s) overflows for s above 2.2 and the
    score becomes inf: every float32 kernel's answer is NaN there (an outside review)."""
    def softplus(score, b, h, q_idx, kv_idx):
        return torch.log(1 + torch.exp(40 * score)) / 40

    return Mods(_causal, softplus)


NAMES = ("where_distance_damped", "where_sqrt_positive")


def cases(profile: str) -> list[Case]:
    return [Case(Variant(name), Shape(1, 2, 2, 64, 64, 16), "fp32") for name in NAMES]
