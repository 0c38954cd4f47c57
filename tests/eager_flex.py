"""Eager flex_attention as the tests' judge of mods that change their score in place, on every
torch release the suite supports.

torch 2.15.0's eager flex_attention refuses a score mod that changes its score argument in
place (``score.mul_(2)``, ``score.clamp_(-c, c)``, ``score += bias``): Dynamo, which traces
each eager call, raises "Encountered input mutation during higher order op tracing"
(docs/findings.md, finding 11); 2.6 to 2.14 run it. flex_attention reads only what a score mod
returns, so the same mod called on a copy of its score gives the same values: that is how the
tests' eager judge runs it where the running torch refuses it. Where the running torch runs
the mod as it is, the judge runs it as it is, so the tests still compare the golden with
flex_attention's own handling of the change in place.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention

#: What Dynamo says when it refuses a change in place of a higher-order operator's input.
REFUSAL = "input mutation"


def doubled_in_place(score, b, h, q_idx, kv_idx):
    """The smallest mod that changes its score in place."""
    return score.mul_(2)


@functools.cache
def refuses_score_mutation() -> bool:
    """Whether the running torch's eager flex_attention refuses a score mod that changes its
    score argument in place (asked once, on an 8 x 8 problem)."""
    q = torch.zeros(1, 1, 8, 8)
    try:
        flex_attention(q, q.clone(), q.clone(), score_mod=doubled_in_place)
    except Exception as exc:  # noqa: BLE001 - only the refusal is an answer
        if REFUSAL in str(exc):
            return True
        raise
    return False


def as_eager_runs_it(score_mod: Callable | None) -> Callable | None:
    """``score_mod`` as the running torch's eager flex_attention can judge it: on a copy of its
    score where that torch refuses a change in place of the score, as it is otherwise."""
    if score_mod is None or not refuses_score_mutation():
        return score_mod

    def on_a_copy(score, b, h, q_idx, kv_idx):
        return score_mod(score.clone(), b, h, q_idx, kv_idx)

    return on_a_copy
