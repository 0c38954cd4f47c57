"""The gradient verdict against a FlashAttention-style backward (tests/fa_style_backward.py):
rows of dQ and dK whose terms cancel are judged by the size of what cancels, so a correct
backward passes there, and broken gradients are still caught."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases import variants as v
from cases.composed import And, Atom, Not, composed
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
from conformance import compat
from reference.golden import Reference, reference_pair
from reference import row_noise
from reference.row_noise import cancelling_magnitudes
from reference import verdict as verdict_module
from reference.verdict import judge
from tests.fa_style_backward import LOSSES, block_mask_of, fa_style_gradients

#: GQA, lengths off the 128 grid, and causal rows 0 and 1 that see one and two keys.
SHAPE = Shape(2, 4, 2, 129, 200, 16)


def correct_backward(case: Case, seed: int, loss: str | None = None, ds_scaled: bool = False,
                     partials_rounded: bool = False):
    """The golden, the baseline and a correct backend's answer: eager flex_attention's output
    and the FlashAttention-style gradients computed from it (with ``loss``, one of the
    precision losses of tests/fa_style_backward.py: not a correct answer; with ``ds_scaled``,
    dS rounded as eager flex_attention rounds it; with ``partials_rounded``, dK and dV summed
    over shared heads and batches as eager rounds them)."""
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    golden, baseline = reference_pair(case, inputs, grad_out)
    s = case.shape
    out = compat.attention(flex_attention, inputs.q, inputs.k, inputs.v,
                           build_mods(case.variant, s).score_mod, block_mask_of(case),
                           enable_gqa=s.Hq != s.Hkv)
    grads = fa_style_gradients(case, inputs, grad_out, out, loss, ds_scaled, partials_rounded)
    return golden, baseline, Reference(out, None, grads)


@pytest.mark.parametrize("variant", [v.causal(), v.alibi(), v.softcap(5.0)],
                         ids=lambda var: var.token)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_flashattention_style_backward_passes_where_its_rows_cancel(variant, dtype):
    """Without the cancelling magnitudes (and the operands' roundings, reference/
    gradient_roundings.py, added since), the dQ rows that see few keys failed the row rule
    (up to 18x past its limit on the same shapes): their golden is small, the kernel's rounding
    of O in delta is not."""
    case = Case(variant, SHAPE, dtype, "fwd+bwd")
    failed_without = 0
    for seed in range(3):
        golden, baseline, observed = correct_backward(case, seed)
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, f"seed {seed}: {verdict.summary}"
        without = judge(case, replace(golden, row_noise=None, row_only_noise=None), baseline,
                        observed)
        failed_without += not without.passed
    if (variant.name, dtype) in (("causal", "bf16"), ("alibi", "bf16"), ("alibi", "fp16")):
        assert failed_without, "these cases failed on every seed without the magnitudes"


def test_float32_rows_that_see_one_key_pass_where_the_golden_gradient_is_exactly_zero():
    """One query row, one key: dQ is 0 (the softmax of one score is 1 whatever the score),
    the baseline's too, and a kernel's delta leaves a rounding in it, which the absolute floor
    alone (1e-9 in float32) failed."""
    case = Case(v.full(), Shape(3, 2, 2, 1, 1, 8), "fp32", "fwd+bwd")
    for seed in range(3):
        golden, baseline, observed = correct_backward(case, seed)
        assert golden.grads["dq"].abs().max() < 1e-12  # 0 up to the golden's float64 rounding
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, f"seed {seed}: {verdict.summary}"


#: Rows of one or a few terms: one query row over 67 keys (decoding), and 7 causal rows over 300
#: keys (row 0 sees one key).
FEW_TERM_SHAPES = [Shape(1, 2, 2, 1, 67, 16), Shape(2, 4, 4, 7, 300, 64)]
FEW_TERM_VARIANTS = [v.full(), v.causal(), v.alibi(), v.softcap(5.0)]


def test_float32_rows_of_few_terms_pass_a_correct_backward_by_the_size_of_its_roundings():
    """Where a row holds one or a few terms its error is one rounding of P_ij or dP_ij, and
    the baseline's own draw of it can be 30x smaller than a correct kernel's. Without the
    float32 rounding magnitudes this backward failed 13 of these 32 runs (up to 4.8x with inputs
    x1: a dQ row that sees one key, dP rounded 4 ulps off by the CPU's float32 matmul; more
    with inputs x4, whose scores of tens round 16x coarser). Since REFERENCE_VERSION 17 the
    sizes of delta's float32 arithmetic, in what cancels, cover part of it: 7 of 32 fail
    without the float32 magnitudes on this machine."""
    failed_without = []
    for shape, variant, scale, seed in itertools.product(FEW_TERM_SHAPES, FEW_TERM_VARIANTS,
                                                         (1, 4), range(2)):
        case = Case(variant, shape, "fp32", "fwd+bwd", scale)
        golden, baseline, observed = correct_backward(case, seed)
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, f"{case.id} seed {seed}: {verdict.summary}"
        inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
        cancelling = cancelling_magnitudes(case, inputs, build_mods(variant, shape),
                                           golden.out, golden.lse, grad_out)
        without = replace(golden, row_noise={"out": golden.row_noise["out"], **cancelling})
        if not judge(case, without, baseline, observed).passed:
            failed_without.append((case.id, seed))
    assert len(failed_without) >= 4, failed_without  # 7 of 32 on this machine's BLAS


@pytest.mark.parametrize("loss", LOSSES)
def test_float32_precision_losses_are_caught_on_rows_of_few_terms(loss):
    """The rounding magnitudes allow tens of float32 ulps, not a lower precision: dP from TF32
    operands, or P rounded to bfloat16, fails on every few-term shape. (Not causal or ALiBi
    on the decoding shape: its one row sees one key there, whose P is exactly 1 in bfloat16
    too.)"""
    decode, causal_rows = FEW_TERM_SHAPES
    for shape, variant in [(decode, v.full()), (causal_rows, v.full()), (causal_rows, v.causal()),
                           (causal_rows, v.alibi())]:
        case = Case(variant, shape, "fp32", "fwd+bwd")
        golden, baseline, observed = correct_backward(case, 0, loss)
        verdict = judge(case, golden, baseline, observed)
        assert not verdict.passed, f"{loss} on {case.id} passed"
        assert max(verdict.metrics[g]["worst_row_margin"] for g in ("dq", "dk", "dv")) > 20


@pytest.mark.parametrize("name", ["dq", "dk", "dv"])
def test_a_float32_gradient_row_one_part_in_ten_thousand_off_is_caught(name):
    """What the float32 rounding magnitudes leave to the row rule where rows see many keys:
    one row of dQ, dK or dV scaled by 1 + 1e-4 (about 1,700 float32 ulps) fails, 8-10x past
    its limit (a row 1e-5 off sits at the limit; docs/oracle.md)."""
    case = Case(v.causal(), Shape(1, 4, 2, 512, 512, 64), "fp32", "fwd+bwd")
    golden, baseline, observed = correct_backward(case, 0)
    assert judge(case, golden, baseline, observed).passed
    scaled = observed.grads[name].clone()
    scaled[0, 1, 300] *= 1 + 1e-4
    verdict = judge(case, golden, baseline, replace(observed, grads=dict(observed.grads,
                                                                         **{name: scaled})))
    assert f"{name}:row" in verdict.metrics["failed_rules"]
    assert verdict.metrics[name]["worst_row_margin"] > 4


def test_delta_carries_the_roundings_of_p_as_well_as_those_of_o(monkeypatch):
    """In a row of a few keys (ALiBi, fp16, inputs x4: two keys hold 95% and 4.5% of it),
    eager's O is off by its P's roundings (P V is not renormalized after them) as much as by
    its own rounding: delta's rounding sized from O's alone (REFERENCE_VERSION 14:
    2 sqrt(sum_d (dO_id O_id)^2)) failed a dQ row of this correct backward at 1.01x."""
    case = Case(v.alibi(), Shape(2, 4, 2, 129, 200, 16), "fp16", "fwd+bwd", input_scale=4)
    golden, baseline, observed = correct_backward(case, 1)
    verdict = judge(case, golden, baseline, observed)
    assert verdict.passed, verdict.summary

    def of_o_only(t, dtype):
        return 2.0 * (t.d_out * t.out).square().sum(-1, keepdim=True).sqrt()

    monkeypatch.setattr(row_noise, "_delta_rounding", of_o_only)
    o_only, _ = reference_pair(case, make_inputs(case, 1), make_grad_output(case, 1))
    o_only = replace(o_only, row_only_noise=None)  # nor the operands' roundings (version 35)
    assert "dq:row" in judge(case, o_only, baseline, observed).metrics["failed_rules"]


def test_rows_that_cancel_pass_under_a_score_mod_that_scales_the_score():
    """delta's rounding moves dS_ij by the mod's slope times P_ij: a fuzzed mod that scales
    the score by 3 failed correct float16 backwards at up to 1.49x while the cancelling sizes
    left the slope out (a review's case, b2-h4x2-s48x48-d32); for this mod the slope is 3
    everywhere, so the old sizes are a third of the new ones."""
    variant = composed(And(Atom("causal", 0), Not(Atom("win", 8))),
                       [Atom("scale", 3.0), Atom("alibi", 8)])
    failed_without_slope = 0
    for input_scale, seed in itertools.product((1, 4), range(2)):
        case = Case(variant, Shape(2, 4, 2, 48, 48, 32), "fp16", "fwd+bwd", input_scale)
        golden, baseline, observed = correct_backward(case, seed)
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, f"x{input_scale} seed {seed}: {verdict.summary}"
        inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
        cancelling = cancelling_magnitudes(case, inputs, build_mods(variant, case.shape),
                                           golden.out, golden.lse, grad_out)
        without_slope = replace(golden, row_noise=dict(golden.row_noise, **{
            name: golden.row_noise[name] - cancelling[name] * 2 / 3 for name in cancelling}))
        failed_without_slope += not judge(case, without_slope, baseline, observed).passed
    assert failed_without_slope, "expected a correct backward to fail with the slope left out"


def test_a_head_leaves_out_its_noisiest_rows_error_up_to_its_allowance(monkeypatch):
    """One key's dK row, within its row limit by its noise, dominated its head's mean error and
    failed the head rule at 1.55x (a correct backward, softcap 5, fp16, inputs x4, seed 4):
    the head's mean leaves out its noisiest row's error up to that row's allowance."""
    case = Case(v.softcap(5.0), Shape(2, 4, 4, 7, 300, 64), "fp16", "fwd+bwd", input_scale=4)
    golden, baseline, observed = correct_backward(case, 4)
    verdict = judge(case, golden, baseline, observed)
    assert verdict.passed, verdict.summary
    monkeypatch.setattr(verdict_module, "NOISE_SHARE", 0.0)
    without = judge(case, golden, baseline, observed)
    assert without.metrics["failed_rules"] == ["dk:head"], without.summary


def test_a_noisy_row_lends_nothing_to_a_head_one_percent_off():
    """Only the noisiest row's own error is left out of its head's mean: a head 1% off, whose
    noisiest row is 10-2,000x rms(G) in noise, is still caught (a review: an allowance added
    to the head's limit instead let it pass at 0.73)."""
    case = Case(v.causal(), Shape(2, 4, 4, 7, 300, 64), "fp16", "fwd+bwd", input_scale=4)
    golden, baseline, observed = correct_backward(case, 1)
    assert judge(case, golden, baseline, observed).passed
    off = observed.grads["dk"].float().clone()
    off[0, 1] *= 1.01
    broken = replace(observed, grads=dict(observed.grads, dk=off.to(observed.grads["dk"].dtype)))
    caught = judge(case, golden, baseline, broken)
    assert caught.metrics["failed_rules"] == ["dk:head"]
    assert "its noisiest row's" in caught.summary, caught.summary  # the mean is net of it


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_broken_gradients_are_still_caught(dtype):
    case = Case(v.causal(), SHAPE, dtype, "fwd+bwd")
    golden, baseline, observed = correct_backward(case, 0)
    grads = observed.grads
    broken = {
        "dq scaled twice": dict(grads, dq=grads["dq"] * 0.25),
        "dq without its scale": dict(grads, dq=grads["dq"] * 4),
        "dk of one key/value head from the other": dict(grads, dk=grads["dk"][:, [0, 0]]),
        "one dq row zeroed": dict(grads, dq=grads["dq"].index_fill(2, torch.tensor([64]), 0)),
        "one dk row zeroed": dict(grads, dk=grads["dk"].index_fill(2, torch.tensor([5]), 0)),
        "dv rows shifted by one key": dict(grads, dv=grads["dv"].roll(1, dims=2)),
    }
    for name, bad in broken.items():
        verdict = judge(case, golden, baseline, replace(observed, grads=bad))
        assert not verdict.passed, f"{name} was not caught"


@pytest.mark.parametrize("name", ["dq", "dk"])
def test_a_row_three_percent_off_is_caught_where_rows_see_many_keys(name):
    """The cancelling magnitudes must not blunt the row rule where nothing cancels: at S512 a
    row of dQ or dK scaled by 1.03 (about 8 bf16 ulps) fails, as it did without them. (The
    dK magnitude was once a worst-case sum over query rows, 4-25x |dK| at S1024, which let
    a dK row 8% off pass.)"""
    case = Case(v.causal(), Shape(1, 4, 2, 512, 512, 64), "bf16", "fwd+bwd")
    golden, baseline, observed = correct_backward(case, 0)
    assert judge(case, golden, baseline, observed).passed
    scaled = observed.grads[name].float().clone()
    scaled[0, 1, 300] *= 1.03
    broken = dict(observed.grads, **{name: scaled.to(observed.grads[name].dtype)})
    verdict = judge(case, golden, baseline, replace(observed, grads=broken))
    assert not verdict.passed and f"{name}:row" in verdict.metrics["failed_rules"]
