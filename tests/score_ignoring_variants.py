"""A score mod that ignores the score: the attention weights follow the distance alone, so the
output does not depend on q or k and dQ and dK are zero (eager flex_attention refuses such a
mod in its backward; a plain-autograd backend gives no dQ or dK at all)."""
from __future__ import annotations

from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder

NAME = "distance_only"


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


@builder(NAME)
def _distance_only(variant, shape, device):
    def distance_only(score, b, h, q_idx, kv_idx):
        return (kv_idx - q_idx).to(score.dtype) * 0.25

    return Mods(_causal, distance_only)


CASE = Case(Variant(NAME), Shape(1, 2, 2, 32, 32, 16), "fp32", "fwd+bwd")
