"""Mods with an operation vmap has no batching rule for: the same values as one point at a time,
batched where functionalizing the mod gives the operation a rule (cases/pointwise.py)."""
from __future__ import annotations

import itertools
import threading
import warnings

import pytest
import torch
from torch._C import _functorch

from cases.pointwise import evaluate_mask, evaluate_score

GRID = [torch.arange(n) for n in (2, 3, 5, 7)]
CAP = 0.75


def clamp_in_place(score, b, h, q_idx, kv_idx):
    """torch.clamp_ has no batching rule (torch 2.13); torch.clamp has one."""
    return score.float().clamp_(min=-CAP, max=CAP) + kv_idx


def clamp_or_zero(score, b, h, q_idx, kv_idx):
    """Catches what clamp_ raises: with the fallback off, the except branch would be taken."""
    try:
        return score.clone().clamp_(min=-CAP, max=CAP)
    except RuntimeError:
        return score * 0


def log_ndtr(score, b, h, q_idx, kv_idx):
    """special.log_ndtr has no batching rule even out of place: evaluated per point."""
    return torch.special.log_ndtr(score) - q_idx


def score_mod_point_by_point(mod, score):
    out = torch.empty(score.shape, dtype=torch.float64)
    for point in itertools.product(*(range(len(g)) for g in GRID)):
        out[point] = mod(score[point], *(torch.tensor(i) for i in point))
    return out


def evaluated(mod, score):
    """evaluate_score's values, and whether vmap's per-point fallback ran (its warning)."""
    was = _functorch._is_vmap_fallback_enabled()
    _functorch._set_vmap_fallback_warning_enabled(True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = evaluate_score(mod, score, *GRID)
    assert _functorch._is_vmap_fallback_enabled() == was  # set back
    fell_back = any("batching rule" in str(w.message) for w in seen)
    return out, fell_back


@pytest.mark.parametrize("mod, batched", [(clamp_in_place, True), (clamp_or_zero, True),
                                          (log_ndtr, False)])
def test_a_mod_vmap_cannot_batch_gets_its_values_point_by_point(mod, batched):
    score = torch.randn(*(len(g) for g in GRID), dtype=torch.float64,
                        generator=torch.Generator().manual_seed(3))
    out, fell_back = evaluated(mod, score)
    torch.testing.assert_close(out.double(), score_mod_point_by_point(mod, score),
                               rtol=0, atol=0)
    assert fell_back is not batched


def test_the_fallback_switch_is_set_back_when_the_mod_raises_and_masks_still_evaluate():
    def raising(score, b, h, q_idx, kv_idx):
        score.clamp_(min=0)  # reaches the fallback first
        raise ValueError("the mod's own error")

    with pytest.raises(Exception, match="the mod's own error"):
        evaluate_score(raising, torch.zeros(2, 3, 5, 7, dtype=torch.float64), *GRID)
    assert _functorch._is_vmap_fallback_enabled()
    mask = evaluate_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, *GRID)
    assert torch.equal(mask[0, 0], torch.arange(7) <= torch.arange(5)[:, None])


def test_evaluations_in_two_threads_take_turns_with_the_switch():
    """The golden's thread and the executor's main thread evaluate mods at once: each gets its
    own mod's values while the other holds the process-wide switch."""
    score = torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want = score_mod_point_by_point(clamp_in_place, score)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(torch.equal(evaluate_score(clamp_in_place, score, *GRID).double(),
                                           want))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [True] * 40
    assert _functorch._is_vmap_fallback_enabled()
