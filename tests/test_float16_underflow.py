"""float16 backward: dS and P below float16's normal range. Every backward rounds dS to the
case dtype before its dQ and dK products, fused kernels dS itself and eager flex_attention dS
times the softmax scale, and the normalized P for dV; where that is below 2^-14 the rounding
is to a fixed spacing, an error that reference/underflow_noise.py's underflow_magnitudes sizes
(with inputs x4 for dS; for P, where a key is attended by no row). Both conventions must
pass, and broken gradients must still be caught."""
from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from cases import variants as v
from cases.composed import Atom, composed
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
from reference.kernel import chunked_attention
from reference import row_noise
from reference.pair_terms import pair_terms
from reference.partial_sums import partial_sum_magnitudes
from reference.row_noise import cancelling_magnitudes
from reference.underflow_noise import subnormal_rounding_variance, underflow_magnitudes
from reference.verdict import judge
from tests.test_gradient_verdict import correct_backward

#: Shapes where eager's dK failed the row rule with inputs x4 before the underflow sizes: keys
#: that no query row attends, GQA, D 32 to 128, and a decoding-like pair of rows.
SHAPES = [Shape(2, 2, 2, 64, 64, 32), Shape(1, 4, 1, 5, 64, 128), Shape(1, 8, 2, 2, 513, 64)]
FP16_TINY = torch.finfo(torch.float16).tiny
FP16_U = 2.0 ** -11


def _without_underflow(case: Case, seed: int, golden):
    """The golden with the underflow sizes taken out of its row noise again, and the partial
    sums' sizes where heads are shared (in float16 those are rounded at the fixed spacing
    too, so on GQA shapes they cover the same rows: tests/test_shared_heads.py), and nothing
    unshared added to the global and head rules."""
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    mods = build_mods(case.variant, case.shape)
    lost = underflow_magnitudes(case, inputs, mods, golden.out, golden.lse, grad_out)
    shared = partial_sum_magnitudes(case, inputs, mods, golden.out, golden.lse, grad_out)
    noise = dict(golden.row_noise, **{
        k: golden.row_noise[k] - lost[k] - shared.get(k, 0.0) for k in lost})
    return replace(golden, row_noise=noise, unshared_noise=None)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"s{s.Sq}x{s.Skv}-d{s.D}")
def test_eager_and_fused_roundings_of_ds_pass_with_large_inputs(shape):
    failed_without = 0
    for variant in (v.full(), v.causal()):
        case = Case(variant, shape, "fp16", "fwd+bwd", input_scale=4)
        for seed in range(2):
            for ds_scaled in (False, True):
                golden, baseline, observed = correct_backward(case, seed, ds_scaled=ds_scaled)
                verdict = judge(case, golden, baseline, observed)
                assert verdict.passed, f"{variant.token} seed {seed} ds_scaled={ds_scaled}: " \
                    f"{verdict.summary}"
            # eager's rounding (the last one above) without the sizes
            without = judge(case, _without_underflow(case, seed, golden), baseline, observed)
            failed_without += not without.passed
    assert failed_without, "expected eager's dS rounding to fail a dK row without the sizes"


#: ALiBi with slopes on k - q both ways: keys past a row weigh most, so the keys that few rows
#: attend have dV rows made of P below float16's normal range.
ALIBI_BOTH_WAYS = composed(None, [Atom("alibi", 8)])


@pytest.mark.parametrize("variant, input_scale", [(v.alibi(), 4), (ALIBI_BOTH_WAYS, 1)],
                         ids=["alibi-x4", "alibi-both-ways-x1"])
def test_the_sizes_are_four_rms_of_the_rounding_they_model(variant, input_scale):
    """Rounded as eager rounds them (dS times the scale, and the normalized P, to float16),
    the dS and P below float16's normal range move each dQ, dK and dV row by about 1/4 of the
    size (one RMS of four), never more than all of it. The size is what that rounding adds to
    a relative one (which the verdict's dtype term covers): here the two are put together
    again, 4 RMS of a relative rounding of the same values beside the size, in quadrature."""
    case = Case(variant, Shape(2, 4, 2, 129, 200, 16), "fp16", "fwd+bwd",
                input_scale=input_scale)
    s = case.shape
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    mods = build_mods(case.variant, s)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    sizes = underflow_magnitudes(case, inputs, mods, out, lse, grad_out)
    scale, group = 1.0 / math.sqrt(s.D), s.Hq // s.Hkv
    err = {"dq": torch.zeros(s.B, s.Hq, s.Sq, s.D, dtype=torch.float64),
           "dk": torch.zeros(s.Bkv, s.Hkv, s.Skv, s.D, dtype=torch.float64)}
    err["dv"] = torch.zeros_like(err["dk"])
    relative = {name: torch.zeros(e.shape[:-1], dtype=torch.float64) for name, e in err.items()}

    def add_key_rows(acc, t, per_query_head):
        full = torch.zeros_like(acc[t.kv_batch])
        full[:, t.keys] = per_query_head.unflatten(0, (-1, group)).sum(1)
        acc[t.kv_batch] += full

    def mean_square(x):
        return x.square().mean(-1, keepdim=True)

    for t in pair_terms(case, inputs, mods, out, lse, grad_out):
        scaled = t.d_scores * scale
        lost_ds, rel_ds = _subnormal_rounding(scaled), _relative_variance(scaled)
        err["dq"][t.b, :, t.rows] = lost_ds @ t.k.repeat_interleave(group, 0)
        relative["dq"][t.b, :, t.rows] = \
            (rel_ds @ mean_square(t.k).repeat_interleave(group, 0)).squeeze(-1)
        add_key_rows(err["dk"], t, lost_ds.transpose(1, 2) @ t.q)
        add_key_rows(relative["dk"], t, (rel_ds.transpose(1, 2) @ mean_square(t.q)).squeeze(-1))
        add_key_rows(err["dv"], t, _subnormal_rounding(t.probs).transpose(1, 2) @ t.d_out)
        add_key_rows(relative["dv"], t, (_relative_variance(t.probs).transpose(1, 2)
                                         @ mean_square(t.d_out)).squeeze(-1))
    checked = {"dq": 0, "dk": 0, "dv": 0}
    for name, e in err.items():
        size = (sizes[name].double() * FP16_U).square() + 16 * relative[name]
        size = size.sqrt()
        assert (sizes[name] > 0).any(), name
        rows = size > 0
        if rows.sum() < 100:
            continue
        ratio = e.pow(2).mean(-1).sqrt()[rows] / size[rows]
        assert float(ratio.max()) < 1.0, name
        assert 0.15 < float(ratio.median()) < 0.4, name
        checked[name] = int(rows.sum())
    assert checked["dv"] if variant is ALIBI_BOTH_WAYS else checked["dq"] and checked["dk"], \
        checked


def _relative_variance(values: torch.Tensor) -> torch.Tensor:
    """Where the value is below float16's normal range, the variance of a rounding relative to
    it, (|x| eps)^2 / 12 (0 above)."""
    return (values * 2 * FP16_U).square().div(12).masked_fill_(values.abs() >= FP16_TINY, 0.0)


def _subnormal_rounding(values: torch.Tensor) -> torch.Tensor:
    """What rounding to float16 loses where the value is below its normal range (0 above)."""
    return (values.half().double() - values).masked_fill_(values.abs() >= FP16_TINY, 0.0)


@pytest.mark.slow
def test_dv_rows_made_of_p_below_the_normal_range_pass_and_broken_ones_are_caught():
    """Where no row attends a key, its dV row is made of normalized P below 2^-14, which every
    backward rounds at float16's fixed spacing; the baseline's forward rounds the unnormalized
    P, up to its row's normalizer finer. Correct backwards failed those rows by up to 1.93x
    without the sizes; dV rows 3% off, or P rounded to bf16, must still be caught."""
    case = Case(ALIBI_BOTH_WAYS, Shape(2, 4, 2, 129, 200, 16), "fp16", "fwd+bwd")
    failed_without = 0
    for seed in range(2):
        for ds_scaled in (False, True):
            golden, baseline, observed = correct_backward(case, seed, ds_scaled=ds_scaled)
            assert judge(case, golden, baseline, observed).passed, f"seed {seed}"
            without = judge(case, _without_underflow(case, seed, golden), baseline, observed)
            if "dv:row" in without.metrics["failed_rules"]:
                failed_without += 1
                assert "dv: " in without.summary and "key row(s) off" in without.summary
    assert failed_without, "expected dV rows to fail without the sizes"
    grads = observed.grads
    rows = golden.grads["dv"].pow(2).mean(-1)
    off = grads["dv"].float().clone()
    off[torch.unravel_index(rows.argmax(), rows.shape)] *= 1.03
    quiet = grads["dv"].float().clone()
    quiet[torch.unravel_index(rows.argmin(), rows.shape)] *= 1.5  # a row of P below 2^-14
    broken = {"the busiest dv row 3% off": dict(grads, dv=off.half()),
              "the quietest dv row 50% off": dict(grads, dv=quiet.half()),
              "dv of one head from the other": dict(grads, dv=grads["dv"][:, [0, 0]])}
    for name, bad in broken.items():
        assert not judge(case, golden, baseline, replace(observed, grads=bad)).passed, name
    _, _, p_bf16 = correct_backward(case, 1, loss="p_bf16")
    assert "dv:row" in judge(case, golden, baseline, p_bf16).metrics["failed_rules"]


def test_nothing_is_added_where_nothing_underflows():
    """bf16 has float32's exponent range: its rows carry the cancelling sizes alone. fp16 with
    inputs x1 gets sizes far below each row's own magnitude."""
    bf16 = Case(v.causal(), SHAPES[0], "bf16", "fwd+bwd", input_scale=4)
    golden, _, _ = correct_backward(bf16, 0)
    inputs, grad_out = make_inputs(bf16, 0), make_grad_output(bf16, 0)
    cancelling = cancelling_magnitudes(bf16, inputs, build_mods(bf16.variant, bf16.shape),
                                       golden.out, golden.lse, grad_out)
    assert all(torch.equal(golden.row_noise[k], cancelling[k]) for k in ("dq", "dk"))
    assert "dv" not in golden.row_noise
    fp16 = Case(v.causal(), SHAPES[0], "fp16", "fwd+bwd")
    golden, _, _ = correct_backward(fp16, 0)
    without = _without_underflow(fp16, 0, golden).row_noise
    for name in ("dk", "dv"):
        lost = golden.row_noise[name] - without.get(name, 0.0)
        magnitude = golden.grads[name].pow(2).mean(-1).sqrt()
        assert float(lost.max()) > 0 or name == "dv", name  # (no P below 2^-14 here)
        assert float((lost * FP16_U / magnitude).max()) < 1e-3, name


def test_only_what_the_fixed_spacing_adds_to_a_relative_rounding_is_sized():
    """Just below float16's smallest normal number its fixed spacing is a relative rounding's
    (nothing to add); further down it adds up to all of the rounding (min(|x|, 2^-24 /
    sqrt(12)) RMS); normal numbers get nothing."""
    spacing = FP16_TINY * 2 * FP16_U
    x = torch.tensor([0.999, 0.5, 0.1, 1e-3, 1e-6, 1.0, 2.0], dtype=torch.float64) * FP16_TINY
    var = subnormal_rounding_variance(x, 1.0, FP16_TINY, spacing, 2 * FP16_U)
    full = x.clamp_max(spacing / math.sqrt(12)).square()
    assert float(var[0]) < 0.01 * float(full[0])
    assert float(var[1]) == pytest.approx(0.75 * float(full[1]))
    assert float(var[3]) == pytest.approx(float(full[3]), rel=1e-5)
    assert float(var[4]) == pytest.approx(float(full[4]) - float((x[4] * 2 * FP16_U) ** 2 / 12))
    assert var[-2:].tolist() == [0.0, 0.0]


def test_delta_counts_the_fixed_spacing_of_p_below_the_normal_range():
    """delta's rounding (what cancels in dQ and dK rows) carries the forward's rounding of each
    P_ij for P V: u P / sqrt(3) RMS for a normal number, the fixed spacing's share beside it
    below 2^-14 (P about 2^-16 everywhere: a row over 65,536 keys), 15x more there."""
    p = torch.full((1, 1, 4), 2.0 ** -16, dtype=torch.float64)
    d_probs = torch.tensor([[[1.0, -2.0, 0.5, 3.0]]], dtype=torch.float64)
    terms = SimpleNamespace(probs=p, d_probs=d_probs, out=torch.zeros(1, 1, 8, dtype=torch.float64),
                            d_out=torch.ones(1, 1, 8, dtype=torch.float64))
    spacing = FP16_TINY * 2 * FP16_U
    fixed = (spacing ** 2 - (p * 2 * FP16_U) ** 2) / 12 / FP16_U ** 2  # in units of u^2
    relative = p ** 2 / 3
    want = row_noise._DELTA_DRAWS_COVERED * ((relative + fixed) * d_probs ** 2).sum().sqrt()
    got = row_noise._delta_rounding(terms, torch.float16)
    assert float(got) == pytest.approx(float(want), rel=1e-9)
    assert float(fixed.min()) > 10 * float(relative.max())
    bf16 = row_noise._delta_rounding(terms, torch.bfloat16)  # float32's range: relative only
    want_bf16 = row_noise._DELTA_DRAWS_COVERED * (relative * d_probs ** 2).sum().sqrt()
    assert float(bf16) == pytest.approx(float(want_bf16), rel=1e-9)


@pytest.mark.parametrize("ds_scaled", [False, True])
def test_broken_float16_gradients_are_still_caught_with_large_inputs(ds_scaled):
    case = Case(v.causal(), SHAPES[0], "fp16", "fwd+bwd", input_scale=4)
    golden, baseline, observed = correct_backward(case, 0, ds_scaled=ds_scaled)
    grads = observed.grads
    busiest_key = int(golden.grads["dk"][0, 0].pow(2).sum(-1).argmax())
    off = grads["dk"].float().clone()
    off[0, 0, busiest_key] *= 1.03
    broken = {
        "dq without its scale": dict(grads, dq=grads["dq"] * 4),
        "dk of one head from the other": dict(grads, dk=grads["dk"][:, [0, 0]]),
        "one dq row zeroed": dict(grads, dq=grads["dq"].index_fill(2, torch.tensor([40]), 0)),
        "the busiest dk row 3% off": dict(grads, dk=off.half()),
        "dv rows shifted by one key": dict(grads, dv=grads["dv"].roll(1, dims=2)),
    }
    for name, bad in broken.items():
        verdict = judge(case, golden, baseline, replace(observed, grads=bad))
        assert not verdict.passed, f"{name} was not caught"
