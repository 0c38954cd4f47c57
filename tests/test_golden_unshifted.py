"""The golden without the softmax's shift (reference/kernel.py, _UNSHIFTED_LOG2_BOUND): taken
where the Cauchy-Schwarz bound covers a chunk, equal to the shifted golden and to dense float64
evaluations there, and never taken where scores or V would overflow it."""
from __future__ import annotations

import math

import pytest
import torch

import reference.kernel as kernel_module
from cases import variants as v
from cases.inputs import Inputs, make_grad_output, make_inputs
from cases.model import Case, Shape
from reference.golden import golden_attention, reference_pair
from tests.dense_reference import dense_attention


def _count_shifted_chunks(monkeypatch) -> list:
    """Record each call of the golden's flushed exp2, which only the shifted softmax makes."""
    calls = []
    flushed = kernel_module._exp2_flushed

    def counting(exponent):
        calls.append(exponent.shape)
        return flushed(exponent)

    monkeypatch.setattr(kernel_module, "_exp2_flushed", counting)
    return calls


@pytest.mark.parametrize("variant", [v.full(), v.causal(), v.document()])
def test_without_a_score_mod_the_golden_skips_the_shift_and_matches_the_shifted_golden(
        monkeypatch, variant):
    """Ordinary inputs are well within the Cauchy-Schwarz bound (_UNSHIFTED_LOG2_BOUND): no
    chunk takes the shift, and the result is the shifted golden's up to float64 rounding, and
    a dense float64 evaluation's."""
    case = Case(variant, Shape(2, 4, 2, 200, 200, 32), "fp32")
    inputs = make_inputs(case, 5)
    calls = _count_shifted_chunks(monkeypatch)
    unshifted = golden_attention(case, inputs)
    assert calls == []
    monkeypatch.setattr(kernel_module, "_UNSHIFTED_LOG2_BOUND", -1.0)  # no chunk is covered
    shifted = golden_attention(case, inputs)
    assert calls
    torch.testing.assert_close(unshifted.out, shifted.out, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(unshifted.lse, shifted.lse, rtol=1e-14, atol=1e-14)
    dense_out, dense_lse = dense_attention(case, *(t.double().numpy() for t in
                                                   (inputs.q, inputs.k, inputs.v)))
    torch.testing.assert_close(unshifted.out, torch.from_numpy(dense_out), rtol=1e-12,
                               atol=1e-13)
    torch.testing.assert_close(unshifted.lse, torch.from_numpy(dense_lse), rtol=1e-12,
                               atol=1e-13)


def test_scores_beyond_the_bound_take_the_shift_and_still_match_a_dense_evaluation(
        monkeypatch):
    """q scaled by 200 makes scores of hundreds to thousands: unshifted, exp2 would overflow
    and underflow whole rows. Those chunks take the shift (and its flush) and match a dense
    float64 softmax."""
    case = Case(v.causal(), Shape(1, 2, 2, 96, 96, 16), "fp32")
    inputs = make_inputs(case, 2)
    inputs = Inputs(inputs.q * 200, inputs.k, inputs.v)
    calls = _count_shifted_chunks(monkeypatch)
    out = golden_attention(case, inputs).out
    assert calls
    q, k, vv = (t[0].double() for t in (inputs.q, inputs.k, inputs.v))
    scores = (q @ k.transpose(-1, -2)) / 4.0
    assert scores.abs().max() > 710  # e^710 overflows float64
    scores = scores.masked_fill(torch.ones(96, 96, dtype=torch.bool).triu(1), -math.inf)
    dense = torch.softmax(scores, -1) @ vv
    torch.testing.assert_close(out[0], dense, rtol=1e-12, atol=1e-13)


def test_values_too_large_for_unshifted_terms_take_the_shift():
    """Every score 250 in log2 units (within the bound) and V of 2^800: unshifted, each term
    is 2^250 and P V would overflow. V beyond 2^256 sends the batch to the shift, and the
    output is the mean of V's rows, as every key weighs the same."""
    case = Case(v.full(), Shape(1, 1, 1, 8, 8, 4), "fp32")
    u = torch.full((4,), 1.0, dtype=torch.float64)
    u *= math.sqrt(250.0 / (kernel_module._LOG2E / 2.0) / 4.0)  # |u|^2 scale log2e = 250
    q = k = u.expand(1, 1, 8, 4).clone()
    values = torch.arange(32, dtype=torch.float64).view(1, 1, 8, 4) * 2.0 ** 800
    out = golden_attention(case, Inputs(q, k, values)).out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 0], values[0, 0].mean(0).expand(8, 4), rtol=1e-14,
                               atol=0)


def test_rows_that_see_no_key_keep_the_unshifted_gradients_finite(monkeypatch):
    """padded_causal leaves the padded query rows with no key. Unshifted, such a row's P V and
    normalizer are 0; its division must not turn dO into inf in the backward (0 times inf is
    NaN in dV). dQ, dK and dV equal the shifted golden's, with dO large enough (x5) that
    dividing by the smallest float64 would overflow."""
    case = Case(v.padded_causal(48), Shape(1, 2, 2, 64, 64, 16), "fp32", "fwd+bwd")
    inputs = make_inputs(case, 0)
    grad_out = make_grad_output(case, 0) * 5
    calls = _count_shifted_chunks(monkeypatch)
    unshifted, _ = reference_pair(case, inputs, grad_out)
    assert calls == []
    assert torch.all(unshifted.lse[0, :, 48:] == -math.inf)
    monkeypatch.setattr(kernel_module, "_UNSHIFTED_LOG2_BOUND", -1.0)
    shifted, _ = reference_pair(case, inputs, grad_out)
    for name in ("dq", "dk", "dv"):
        assert torch.isfinite(unshifted.grads[name]).all(), name
        torch.testing.assert_close(unshifted.grads[name], shifted.grads[name], rtol=1e-13,
                                   atol=1e-14)
