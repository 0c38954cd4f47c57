"""delta's size in float32 (reference/row_noise.py: _delta_rounding, _float32_delta_variance)
against what correct float32 forwards actually move delta_i = dO_i . O_i by: eager
flex_attention's output, and a forward in the order of flex_attention's Triton template
(tests/float32_forward.py, online_forward), each summed in float32 as a backward takes delta
from it. Before REFERENCE_VERSION 17 delta's size in float32 held only O's last rounding, a
median 3-9x short of these errors and up to 200-500x in rows whose scores are tens."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases import variants as v
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
from conformance import compat
from reference import row_noise
from reference.golden import Reference, reference_pair
from reference.row_sizes import RowSizes, over_pairs
from reference.verdict import judge
from tests.fa_style_backward import block_mask_of, fa_style_gradients, tf32
from tests.float32_forward import online_forward

#: Soft-capping with scores of tens, causal rows that see few keys, full attention over many.
CASES = [Case(v.softcap(50.0), Shape(1, 4, 4, 256, 256, 64), "fp32", "fwd+bwd", 4),
         Case(v.causal(), Shape(1, 4, 2, 256, 256, 128), "fp32", "fwd+bwd", 4),
         Case(v.full(), Shape(2, 2, 2, 256, 512, 64), "fp32", "fwd+bwd", 1)]
U = 2.0 ** -24


class _DeltaSize(RowSizes):
    """One RMS of delta's rounding per query row, [B, Hq, Sq], in units of u."""

    def __init__(self, case: Case):
        s = case.shape
        self.rms = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64)

    def add(self, t) -> None:
        self.rms[t.b, :, t.rows] = row_noise._delta_rounding(t, torch.float32).squeeze(-1) \
            / row_noise._DELTA_DRAWS_COVERED

    def result(self) -> dict[str, torch.Tensor]:
        return {"rms": self.rms}


def _ratios(case: Case, seed: int = 0) -> dict[str, torch.Tensor]:
    """Per visible row, |delta's error| over one RMS of its size, for each forward."""
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    golden, _ = reference_pair(case, inputs, grad_out)
    mods = build_mods(case.variant, case.shape)
    rms = over_pairs(case, inputs, mods, golden.out, golden.lse, grad_out,
                     [_DeltaSize(case)])[0]["rms"]
    exact = (grad_out.double() * golden.out).sum(-1)
    eager = compat.attention(flex_attention, inputs.q, inputs.k, inputs.v, mods.score_mod,
                             block_mask_of(case), enable_gqa=case.shape.Hq != case.shape.Hkv)
    ratios = {}
    for name, out in (("eager", eager), ("online", online_forward(case, inputs))):
        delta = (out.float() * grad_out.float()).sum(-1).double()  # as a backward takes it
        ratios[name] = ((delta - exact).abs() / U / rms)[rms > 0]
    return ratios


@pytest.mark.slow
def test_delta_sizes_hold_what_correct_float32_forwards_move_delta_by():
    """A size is 3 RMS of the rounding: no row's error is past it, and the median row's is
    a fraction of one RMS (measured 0.2-0.4 at S256-S1024: the model sums one key at a time,
    as a fused multiply-add loop does, and these forwards round less)."""
    for case in CASES:
        for name, ratio in _ratios(case).items():
            assert ratio.median() < 1.0, (case.id, name, float(ratio.median()))
            assert ratio.max() < row_noise._DELTA_DRAWS_COVERED, (case.id, name,
                                                                   float(ratio.max()))


@pytest.mark.slow
def test_without_the_float32_terms_delta_sizes_fall_short(monkeypatch):
    """O's last rounding alone, as before REFERENCE_VERSION 17: the median row's error is
    several RMS of that size, and the worst rows' tens."""
    monkeypatch.setattr(row_noise, "_float32_delta_variance", lambda t: torch.zeros_like(t.lse))
    for case in CASES:
        for name, ratio in _ratios(case).items():
            assert ratio.median() > 2.0, (case.id, name, float(ratio.median()))
            assert ratio.max() > 10.0, (case.id, name, float(ratio.max()))


def test_a_backward_taking_delta_from_a_coarser_copy_of_o_is_caught_and_its_forward_passes():
    """The sizes allow a float32 kernel's own arithmetic, not a coarser O: a FlashAttention-
    style backward taking delta from O with TF32's 10-bit mantissa fails (4.2x and more in
    the probe's runs, benchmarks/float32_gradient_probe.py), from the Triton-order forward's
    own O it passes."""
    for case in CASES:
        inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
        golden, baseline = reference_pair(case, inputs, grad_out)
        out = online_forward(case, inputs)
        for stored, passes in ((out, True), (tf32(out), False)):
            observed = Reference(out, None, fa_style_gradients(case, inputs, grad_out, stored))
            verdict = judge(case, golden, baseline, observed)
            assert verdict.passed == passes, (case.id, passes, verdict.summary)
            if not passes:
                assert verdict.metrics["dq"]["worst_row_margin"] > 3, (case.id, verdict.metrics)


@pytest.mark.slow
def test_a_prescaled_forward_that_failed_before_passes(monkeypatch):
    """A review's correct kernel: q times the softmax scale and log2 e before the product,
    the Triton template's order otherwise, its O given to the FlashAttention-style backward.
    Before REFERENCE_VERSION 17 a dK row failed at 1.63x its limit on this case and seed,
    a false MISMATCH; the same sizes without the float32 terms still fail it."""
    case = Case(v.causal(), Shape(4, 4, 2, 1024, 1024, 64), "fp32", "fwd+bwd", 4)
    inputs, grad_out = make_inputs(case, 3), make_grad_output(case, 3)
    out = online_forward(case, inputs, prescaled=True)
    observed = Reference(out, None, fa_style_gradients(case, inputs, grad_out, out))
    golden, baseline = reference_pair(case, inputs, grad_out)
    verdict = judge(case, golden, baseline, observed)
    assert verdict.passed, verdict.summary
    monkeypatch.setattr(row_noise, "_float32_delta_variance", lambda t: torch.zeros_like(t.lse))
    golden, baseline = reference_pair(case, inputs, grad_out)
    before = judge(case, golden, baseline, observed)
    assert not before.passed and "dk:row" in before.metrics["failed_rules"], before.metrics
