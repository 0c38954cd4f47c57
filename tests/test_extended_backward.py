"""The extended matrix's backward cases where a kernel sums or guards what the forward cannot
show (cases/catalog.py): a correct FlashAttention-style backward passes each on two seeds, and
the bug each case is there for is caught. Before them, an outside mutation test of the
backward (2026-12-07) found a backend whose GQA or shared-batch dK and dV were one query
head's, one whose masked rows' gradients were NaN, and one that dropped the soft-cap's
gradient, each passing the whole extended matrix."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tests.fa_style_backward as fa_style
from cases.catalog import matrix
from cases.pointwise import evaluate_score
from reference.verdict import judge
from tests.test_gradient_verdict import correct_backward

NEW_BACKWARD_CASES = {  # the case's tag beside "backward" -> its id at smoke sizes
    "gqa": "causal/b1-h8x2-s128x128-d128/bf16/fwd+bwd",
    "kv_broadcast": "causal/b2x1-h8x8-s128x128-d128/bf16/fwd+bwd",
    "masked_rows": "padded_causal-v96/b1-h8x8-s128x128-d128/bf16/fwd+bwd",
    "large_inputs": "softcap-cap50/b1-h8x8-s128x128-d128/bf16/fwd+bwd/x4",
}


def extended_case(case_id: str):
    [case] = [c for c in matrix("smoke", "extended") if c.id == case_id]
    assert "backward" in case.tags
    return case


def test_the_extended_matrix_has_the_backward_cases_that_catch_these_bugs():
    backward = {c.id: c.tags for c in matrix("smoke", "extended") if c.mode == "fwd+bwd"}
    for tag, case_id in NEW_BACKWARD_CASES.items():
        assert tag in backward.get(case_id, ()), (tag, case_id)
    assert "full/b1-h8x2-s128x128-d128/bf16/fwd+bwd" in backward  # GQA without a mask too


@pytest.mark.parametrize("tag", NEW_BACKWARD_CASES)
def test_a_correct_flashattention_style_backward_passes_them(tag):
    case = extended_case(NEW_BACKWARD_CASES[tag])
    for seed in (0, 1):
        golden, baseline, observed = correct_backward(case, seed)
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, f"seed {seed}: {verdict.summary}"


@pytest.mark.parametrize("tag", ["gqa", "kv_broadcast"])
def test_shared_key_value_gradients_averaged_instead_of_summed_are_caught(tag):
    """dK and dV of a key/value head (batch) are sums over the query heads (batches) that
    read it; a kernel that averages them is off by the group's size."""
    case = extended_case(NEW_BACKWARD_CASES[tag])
    s = case.shape
    readers = s.Hq // s.Hkv if tag == "gqa" else s.B
    golden, baseline, observed = correct_backward(case, 0)
    averaged = {name: (g.float() / readers).to(g.dtype) if name != "dq" else g
                for name, g in observed.grads.items()}
    verdict = judge(case, golden, baseline, replace(observed, grads=averaged))
    assert not verdict.passed
    assert {"dk", "dv"} <= {rule.split(":")[0] for rule in verdict.metrics["failed_rules"]}


def test_nan_gradients_on_fully_masked_rows_are_caught():
    """P = exp(-inf - (-inf)) on a row that sees no key: NaN where the gradient is 0."""
    case = extended_case(NEW_BACKWARD_CASES["masked_rows"])
    valid = dict(case.variant.params)["v"]
    golden, baseline, observed = correct_backward(case, 0)
    dq = observed.grads["dq"].clone()
    dq[:, :, valid:] = float("nan")
    verdict = judge(case, golden, baseline, replace(observed, grads=dict(observed.grads, dq=dq)))
    assert not verdict.passed and "dq:nonfinite" in verdict.metrics["failed_rules"], \
        verdict.metrics["failed_rules"]


def test_a_soft_cap_whose_gradient_is_dropped_is_caught_at_inputs_x4(monkeypatch):
    """The capped scores in the forward, slope 1 in the backward (the cap's tanh derivative
    dropped). At inputs x1 the slope is above 0.99 and the core-shaped backward case cannot
    tell (within rounding, an outside mutation test); at x4 it is caught."""
    case = extended_case(NEW_BACKWARD_CASES["large_inputs"])
    assert case.input_scale == 4
    golden, baseline, correct = correct_backward(case, 0)

    def slope_one(score_mod, scores, *index):
        capped = evaluate_score(score_mod, scores, *index)
        return scores + (capped - scores).detach()

    monkeypatch.setattr(fa_style, "evaluate_score", slope_one)
    _, _, dropped = correct_backward(case, 0)
    assert torch.equal(dropped.out, correct.out)  # the forward is untouched
    verdict = judge(case, golden, baseline, dropped)
    assert not verdict.passed
    assert {"dq", "dk"} <= {rule.split(":")[0] for rule in verdict.metrics["failed_rules"]}
