"""The extended matrix: its axes, the log-sum-exp and gradient references, and the verdict on
them in both directions (eager flex_attention passes; broken lse and gradients are caught)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases import variants as v
from cases.catalog import matrix
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
from conformance import compat
from reference.faults import FAULTS
from reference.golden import Reference, reference_pair
from reference.verdict import judge
from tests.fa_style_backward import block_mask_of


def eager(case: Case, inputs) -> Reference:
    s = case.shape
    out, lse = compat.attention(flex_attention, inputs.q, inputs.k, inputs.v,
                                build_mods(case.variant, s).score_mod, block_mask_of(case),
                                enable_gqa=s.Hq != s.Hkv, return_lse=True)
    return Reference(out, lse)


def test_extended_matrix_covers_every_axis_with_stable_distinct_ids():
    for profile in ("full", "smoke"):
        cases = matrix(profile, "extended")
        assert len({c.id for c in cases}) == len(cases)
        axes = {tag for c in cases for tag in c.tags} - {"extended", profile}
        assert axes == {"dtype", "gqa", "head_dim", "odd_length", "cross", "kv_broadcast",
                        "large_inputs", "masked_rows", "lse", "backward", "activation"}
    full = {c.id for c in matrix("full", "extended")}
    assert "causal/b2-h8x2-s2048x2048-d128/bf16/fwd" in full
    assert "full/b4x1-h8x8-s1x8192-d128/bf16/fwd" in full
    assert "softcap-cap50/b2-h8x8-s2048x2048-d128/bf16/fwd/x4" in full
    assert "alibi/b1-h8x8-s1024x1024-d128/bf16/fwd+bwd" in full
    assert all(c.shape.Sq % 128 for c in matrix("full", "extended") if "odd_length" in c.tags)
    assert len(matrix("full", "all")) == 96 + len(matrix("full", "extended"))


@pytest.mark.slow
def test_eager_flex_attention_passes_one_case_of_every_forward_axis():
    picked = {}
    for case in matrix("smoke", "extended"):
        axis = next(iter(case.tags - {"extended", "smoke"}))
        if case.mode != "fwd+bwd":
            picked.setdefault((axis, case.variant.name == "full"), case)
    assert len(picked) >= 9
    for case in picked.values():
        inputs = make_inputs(case, 1)
        golden, baseline = reference_pair(case, inputs)
        verdict = judge(case, golden, baseline, eager(case, inputs))
        assert verdict.passed, f"{case.id}: {verdict.summary}"


def test_fully_masked_rows_need_zero_output_and_minus_inf_lse():
    case = Case(v.padded_causal(48), Shape(1, 2, 2, 64, 64, 32), "bf16", "fwd+lse")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    assert torch.isneginf(golden.lse[..., 48:]).all() and (golden.out[..., 48:, :] == 0).all()
    good = eager(case, inputs)
    assert judge(case, golden, baseline, good).passed
    finite_lse = good.lse.clone()
    finite_lse[..., 50] = 0.0  # a padded row that claims an lse
    verdict = judge(case, golden, baseline, replace(good, lse=finite_lse))
    assert not verdict.passed and "lse = -inf" in verdict.summary
    assert "lse:masked_rows" in verdict.metrics["failed_rules"]


def test_lse_sees_a_window_off_by_one_that_the_output_rules_may_not():
    case = Case(v.sliding_window(1024), Shape(1, 2, 2, 2048, 2048, 64), "bf16", "fwd+lse")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    wider = Case(v.sliding_window(1025), case.shape, "bf16", "fwd+lse")
    off_by_one, _ = reference_pair(wider, inputs)  # the float64 answer of the wrong mask
    verdict = judge(case, golden, baseline,
                    Reference(off_by_one.out.to(torch.bfloat16), off_by_one.lse.float()))
    assert not verdict.passed
    assert "lse:row" in verdict.metrics["failed_rules"]


def test_missing_lse_is_a_mismatch():
    case = Case(v.causal(), Shape(1, 2, 2, 32, 32, 16), "bf16", "fwd+lse")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    verdict = judge(case, golden, baseline, Reference(baseline.out))
    assert not verdict.passed and "no log-sum-exp" in verdict.summary


def test_large_inputs_make_soft_capping_observable():
    shape = Shape(1, 4, 4, 256, 256, 128)
    ignored, _ = FAULTS["score_mod_ignored"]
    caught = {}
    for scale in (1, 4):
        case = Case(v.softcap(50.0), shape, "bf16", input_scale=scale)
        inputs = make_inputs(case, 0)
        golden, baseline = reference_pair(case, inputs)
        caught[scale] = not judge(case, golden, baseline,
                                  ignored(case, inputs, baseline.out)).passed
    assert caught == {1: False, 4: True}


def test_gradient_reference_matches_dense_autograd_in_float64():
    for variant in (v.causal(), v.alibi(), v.rel_bias(8), v.document()):
        for shape in (Shape(2, 4, 2, 100, 100, 16), Shape(2, 4, 4, 64, 64, 8, 1)):
            _assert_gradients_match_dense_autograd(variant, shape)


def test_gradient_reference_matches_dense_autograd_over_many_chunks(monkeypatch):
    """Several chunks per batch, as every catalog backward case has (S1024 at H8 is 8 Mi
    scores): each chunk's autograd runs through its own graph, K and V accumulate."""
    import reference.chunk_plan as chunk_plan

    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", 4 * 128 * 9)  # 9-row chunks
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)
    for variant in (v.full(), v.causal(), v.alibi(), v.document(), v.sliding_window(20)):
        for shape in (Shape(2, 4, 2, 128, 128, 16), Shape(2, 4, 4, 128, 128, 8, 1)):
            _assert_gradients_match_dense_autograd(variant, shape)


def test_gradients_do_not_rest_on_the_gradient_of_clamp_at_its_bound(monkeypatch):
    """torch 2.14 gives clamp's gradient 0 at its bound (2.13 and older: 1). The kernel
    divided by its normalizer clamped at 1, which a row of one term (causal's first row sees
    one key) has exactly: on 2.14 that row's score got dO . v as its gradient, not 0, and its
    dQ and dK were off, in the golden and the baseline alike (found by the suite's tests on torch 2.14.1). Here clamp
    gets 2.14's rule on any release, and both must still match dense autograd."""
    real_clamp_min = torch.Tensor.clamp_min

    class ZeroAtTheBound(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, bound):
            ctx.save_for_backward(x)
            ctx.bound = bound
            return real_clamp_min(x, bound)

        @staticmethod
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            return grad * (x > ctx.bound), None

    def clamp_min(x, bound):
        return ZeroAtTheBound.apply(x, bound) if x.requires_grad else real_clamp_min(x, bound)

    monkeypatch.setattr(torch.Tensor, "clamp_min", clamp_min)
    for variant in (v.causal(), v.alibi()):
        _assert_gradients_match_dense_autograd(variant, Shape(2, 4, 2, 40, 40, 16),
                                               baseline_atol=1e-4)


def _assert_gradients_match_dense_autograd(variant, shape: Shape,
                                           baseline_atol: float | None = None) -> None:
    case = Case(variant, shape, "fp32", "fwd+bwd")
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    golden, baseline = reference_pair(case, inputs, grad_out)
    want = _dense_gradients(case, inputs, grad_out, build_mods(variant, shape))
    for name in ("dq", "dk", "dv"):
        torch.testing.assert_close(golden.grads[name], want[name], rtol=1e-12, atol=1e-12)
        if baseline_atol is not None:  # the float32 baseline's, to its rounding
            torch.testing.assert_close(baseline.grads[name].double(), want[name], rtol=0,
                                       atol=baseline_atol)


def _dense_gradients(case: Case, inputs, grad_out, mods) -> dict[str, torch.Tensor]:
    """dQ, dK, dV of dense float64 attention (mods on broadcast grids: the test's mods allow
    it), by autograd; zeros where the output does not depend on a tensor."""
    shape = case.shape
    q, k, val = (t.double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    group = shape.Hq // shape.Hkv
    kk = k.repeat_interleave(group, 1).expand(shape.B, -1, -1, -1)
    vv = val.repeat_interleave(group, 1).expand(shape.B, -1, -1, -1)
    b = torch.arange(shape.B).view(-1, 1, 1, 1)
    h = torch.arange(shape.Hq).view(1, -1, 1, 1)
    qi, ki = torch.arange(shape.Sq).view(-1, 1), torch.arange(shape.Skv)
    scores = q @ kk.transpose(-1, -2) / math.sqrt(shape.D)
    if mods.score_mod:
        scores = mods.score_mod(scores, b, h, qi, ki)
    if mods.mask_mod:
        scores = scores.masked_fill(~mods.mask_mod(b, h, qi, ki), -math.inf)
    out = torch.softmax(scores, -1) @ vv
    grads = torch.autograd.grad(out, (q, k, val), grad_out.double(), allow_unused=True)
    return {name: torch.zeros_like(t) if g is None else g
            for name, t, g in zip(("dq", "dk", "dv"), (q, k, val), grads)}


@pytest.mark.parametrize("score_mod", [
    lambda score, b, h, q_idx, kv_idx: torch.tanh(score),  # autograd saves what tanh returns
    lambda score, b, h, q_idx, kv_idx: torch.exp(score / 4),  # and what exp returns
    lambda score, b, h, q_idx, kv_idx: (q_idx - kv_idx).to(score.dtype) / 4,  # no score at all
], ids=["tanh", "exp", "position_only"])
@pytest.mark.parametrize("mask_mod", [None, v._causal], ids=["unmasked", "causal"])
def test_gradients_of_a_score_mod_that_returns_a_saved_tensor_or_ignores_the_score(
        score_mod, mask_mod):
    """The golden's softmax works in place on the scores: on the score mod's own output it
    would change what autograd saved for the mod's backward ('modified by an inplace
    operation'). A score mod that ignores the score gives no gradient to Q or K (autograd
    returns None for them): dQ and dK are zero, and dV is still accumulated. Golden and
    baseline both."""
    from cases.variants import Mods
    from reference.golden import chunked_gradients

    case = Case(v.full(), Shape(2, 4, 2, 48, 40, 8), "fp32", "fwd+bwd")
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    mods = Mods(mask_mod, score_mod)
    want = _dense_gradients(case, inputs, grad_out, mods)
    golden = chunked_gradients(case, inputs, mods, grad_out, torch.float64)
    baseline = chunked_gradients(case, inputs, mods, grad_out, torch.float32, torch.float32)
    for name in ("dq", "dk", "dv"):
        torch.testing.assert_close(golden[name], want[name], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(baseline[name].double(), want[name], rtol=1e-4, atol=1e-5)
    assert want["dv"].abs().max() > 0


def test_gradient_verdict_passes_the_baseline_and_catches_broken_gradients():
    case = Case(v.causal(), Shape(1, 4, 4, 128, 128, 64), "bf16", "fwd+bwd")
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    golden, baseline = reference_pair(case, inputs, grad_out)
    assert judge(case, golden, baseline, baseline).passed
    broken_dk = dict(baseline.grads, dk=baseline.grads["dk"].clone())
    broken_dk["dk"][0, 1, 5] = 0  # one key row of dK never written
    verdict = judge(case, golden, baseline, replace(baseline, grads=broken_dk))
    assert not verdict.passed and "dk:row" in verdict.metrics["failed_rules"]
    scaled_dv = dict(baseline.grads, dv=baseline.grads["dv"].clone())
    scaled_dv["dv"][0, 2] = (scaled_dv["dv"][0, 2].float() * 1.02).to(torch.bfloat16)
    verdict = judge(case, golden, baseline, replace(baseline, grads=scaled_dv))
    assert not verdict.passed and "dv:head" in verdict.metrics["failed_rules"]
    missing = judge(case, golden, baseline, Reference(baseline.out))
    assert not missing.passed and "dq" in missing.summary


@pytest.mark.parametrize("shape, seed", [(Shape(2, 4, 2, 96, 96, 32), 0),
                                         (Shape(1, 2, 1, 33, 70, 16), 5)])
def test_activation_gelu_golden_is_the_written_out_formula_and_eager_passes(shape, seed):
    """The extended matrix's activation variant: the golden equals log(gelu(s) + 1) written out
    with math.erf, point by point in float64 (lse too); eager flex_attention passes in each
    dtype (the compiled CPU kernel does not in 16-bit: docs/findings.md, finding 13), and a
    backend that drops the score mod (plain softmax attention) is caught."""
    from tests.test_golden import _assert_equals_dense

    for dtype in ("bf16", "fp16", "fp32"):
        case = Case(v.activation_gelu(), shape, dtype, "fwd+lse")
        inputs = make_inputs(case, seed)
        _assert_equals_dense(case, inputs, build_mods(case.variant, shape))
        golden, baseline = reference_pair(case, inputs)
        verdict = judge(case, golden, baseline, eager(case, inputs))
        assert verdict.passed, f"{case.id}: {verdict.summary}"
        plain = Reference(*compat.attention(flex_attention, inputs.q, inputs.k, inputs.v, None,
                                            None, enable_gqa=True, return_lse=True))
        assert not judge(case, golden, baseline, plain).passed, case.id
