"""The float32 rounding magnitudes of the golden (reference/row_noise.py), of the output's
rows and of the gradients', and the sizes of what cancels in gradient rows, equal the same formula evaluated densely over every query-key pair at once, on the shapes where the chunked
evaluation has the most to get wrong: grouped heads, a key/value batch shared by all batches,
kept keys given as an index tensor, many small chunks, rows that see nothing, and score mods
that return -inf or ignore the score."""
from __future__ import annotations

import math

import pytest
import torch

from cases import variants as v
from cases.inputs import make_grad_output, make_inputs, torch_dtype
from cases.model import Case, Shape
from cases.pointwise import evaluate_mask, evaluate_score
from cases.variants import Mods, build_mods
from reference import chunk_plan, row_noise, row_sizes
from reference.kernel import chunked_attention
from tests.where_variants import NAMES as WHERE_NAMES  # registers its variants


def dense_magnitudes(case: Case, inputs, mods: Mods, grad_out, out, lse) -> dict:
    """docs/oracle.md's formula over the whole [B, Hq, Sq, Skv] grid, in float64."""
    s = case.shape
    group, scale, kappa = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D), row_sizes.DRAWS_COVERED

    def per_query_head(x):  # [Bkv, Hkv, Skv, D] -> [B, Hq, Skv, D]
        return x.double().expand(s.B, -1, -1, -1).repeat_interleave(group, 1)

    q, k, val, d_out = inputs.q.double(), per_query_head(inputs.k), per_query_head(inputs.v), \
        grad_out.double()
    index = [torch.arange(n) for n in (s.B, s.Hq, s.Sq, s.Skv)]
    scores = (q * scale @ k.transpose(-1, -2)).requires_grad_()
    slope = torch.ones_like(scores)
    modded = scores.detach()
    if mods.score_mod is not None:
        with torch.enable_grad():
            out_mod = evaluate_score(mods.score_mod, scores, *index).double()
            grad = torch.autograd.grad(out_mod, scores, torch.ones_like(out_mod),
                                       allow_unused=True)[0] if out_mod.requires_grad else None
        modded, slope = out_mod.detach(), torch.zeros_like(scores) if grad is None else grad
    seen = torch.ones_like(modded, dtype=torch.bool) if mods.mask_mod is None else \
        evaluate_mask(mods.mask_mod, *index).expand(modded.shape)
    row_lse = lse.double().unsqueeze(-1)
    live = seen & torch.isfinite(modded) & torch.isfinite(row_lse)
    probs = torch.where(live, (modded - row_lse).exp(), 0.0)
    slope = torch.where(live, slope, 0.0)

    def mean_square(x):
        return x.square().mean(-1)

    def per_kv_head(x):  # [B, Hq, Skv] -> [Bkv, Hkv, Skv]
        x = x.unflatten(1, (s.Hkv, group)).sum(2)
        return x.sum(0, keepdim=True) if s.Bkv != s.B else x

    def dot_rounding(a, b, dots):  # D/6 t^2 + D/9 s^2, t^2 the sum of the squared terms
        return (s.D / 6 * (a.square() @ b.square().transpose(-1, -2)) + s.D / 9 * dots ** 2).sqrt()

    score_rounding = kappa * dot_rounding(q * scale, k, scores.detach()) * slope.abs() \
        + torch.where(live, modded, 0.0).abs()
    finite_lse = torch.where(torch.isfinite(row_lse), row_lse, 0.0)
    in_p = score_rounding + finite_lse.abs() + 2
    # the forward: exp(s' - m) normalized, so the subtraction's rounding, not the stored lse's
    in_p_forward = score_rounding + (torch.where(live, modded, 0.0) - finite_lse).abs() + 2
    out_var = ((in_p_forward * probs) ** 2
               * (val.unsqueeze(2) - out.double().unsqueeze(3)).square().mean(-1)).sum(-1)
    d_probs = d_out @ val.transpose(-1, -2)
    in_dp = kappa * dot_rounding(d_out, val, d_probs)
    d_scores = slope * probs * (d_probs - (d_out * out.double()).sum(-1, keepdim=True))
    var_ds = (in_p * d_scores) ** 2 + (in_dp * slope * probs) ** 2

    # what cancels: delta's rounding w_i moves dS_ij by slope P_ij w_i; w_i from O's own
    # rounding (the dtype's spacing at O / sqrt(12) per element) and P's for its P V product
    info = torch.finfo(torch_dtype(case.dtype))
    u, tiny = info.eps / 2, info.tiny
    o = out.double()
    spacing = (2.0 ** o.abs().log2().floor() * 2 * u).clamp_min(tiny * 2 * u).where(o != 0, 0.0)
    var_p = probs ** 2 / 3  # in units of u^2; float16 P below 2^-14: what its spacing adds
    if tiny > torch.finfo(torch.float32).tiny:
        fixed = (probs.clamp_max(tiny * 2 * u / math.sqrt(12)) ** 2 - (probs * 2 * u) ** 2 / 12)
        var_p = var_p + torch.where(probs < tiny, fixed.clamp_min(0.0), 0.0) / u ** 2
    var_delta = (d_out * spacing).square().sum(-1) / (12 * u * u) + (var_p * d_probs ** 2).sum(-1)
    if case.dtype == "fp32":  # a float32 kernel's own arithmetic, in units of u^2
        delta = (d_out * o).sum(-1, keepdim=True)
        live_modded = torch.where(live, modded, 0.0)
        of_p = (dot_rounding(q * scale, k, scores.detach()) ** 2 + scores.detach() ** 2 / 3) \
            * slope ** 2 + ((live_modded - finite_lse) ** 2
                             + (1 if mods.score_mod is None else 2) * live_modded ** 2) / 3 + 4
        keys = (probs > 0).sum(-1, keepdim=True)
        of_sum = keys * ((probs ** 2) @ val ** 2 / 6 + o ** 2 / 9)  # per element of O
        var_delta = var_delta + (of_p * ((d_probs - delta) * probs) ** 2).sum(-1) \
            + (of_sum * d_out ** 2).sum(-1) \
            + s.D / 6 * ((d_out * o) ** 2).sum(-1) + s.D / 9 * delta.squeeze(-1) ** 2
    weight = row_noise._DELTA_DRAWS_COVERED * var_delta.sqrt()
    moved = slope * probs
    cancel_dq = scale * weight * mean_square(moved @ k).sqrt()
    cancel_dk = per_kv_head(scale ** 2 * ((moved * weight.unsqueeze(-1)) ** 2
                                          * mean_square(q).unsqueeze(-1)).sum(-2)).sqrt()
    dq = scale ** 2 * (var_ds * mean_square(k).unsqueeze(-2)).sum(-1)
    dk = per_kv_head(scale ** 2 * (var_ds * mean_square(q).unsqueeze(-1)).sum(-2))
    dv = per_kv_head(((in_p * probs) ** 2 * mean_square(d_out).unsqueeze(-1)).sum(-2))
    units = torch.finfo(torch.float32).eps / torch.finfo(torch_dtype(case.dtype)).eps
    sizes = {name: units * var.sqrt() for name, var in
             (("out", out_var), ("dq", dq), ("dk", dk), ("dv", dv))}
    return dict(sizes, cancel_dq=cancel_dq, cancel_dk=cancel_dk)


def striped(b, h, q_idx, kv_idx):  # kept keys that are not one range: an index tensor
    return (kv_idx % 3 != 1) & (kv_idx <= q_idx + 2)


def first_rows_only(b, h, q_idx, kv_idx):  # rows 5 and on see nothing
    return (q_idx < 5) & (kv_idx <= q_idx)


def some_scores_minus_inf(score, b, h, q_idx, kv_idx):
    return torch.where((kv_idx + q_idx) % 4 == 0, -float("inf"), score * 0.5)


def score_ignored(score, b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).float() * 0.1


def score_negated(score, b, h, q_idx, kv_idx):  # slopes of both signs in a row: -0.5 and 1
    return score * ((kv_idx % 2) * 1.5 - 0.5)


CASES = {
    "causal, shared kv batch": (v.causal(), Shape(3, 4, 2, 9, 13, 8, Bkv=1), None),
    "alibi, one kv head": (v.alibi(), Shape(2, 4, 1, 9, 13, 8), None),
    "softcap": (v.softcap(5.0), Shape(2, 4, 2, 9, 13, 8), None),
    "striped keys": (v.full(), Shape(2, 4, 2, 9, 13, 8, Bkv=1), Mods(striped, None)),
    "-inf scores, empty rows": (v.full(), Shape(2, 2, 1, 9, 13, 8, Bkv=1),
                                Mods(first_rows_only, some_scores_minus_inf)),
    "score ignored": (v.full(), Shape(2, 4, 2, 9, 13, 8), Mods(None, score_ignored)),
    "score negated": (v.causal(), Shape(2, 4, 2, 9, 13, 8), Mods(None, score_negated)),
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_chunked_magnitudes_equal_a_dense_evaluation_of_the_formula(monkeypatch, name, dtype):
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", 40)  # many chunks, key ranges cut
    variant, shape, mods = CASES[name]
    # float16 with inputs x4: scores of tens, P below 2^-14 in every case
    case = Case(variant, shape, dtype, "fwd+bwd", input_scale=4 if dtype == "fp16" else 1)
    mods = mods or build_mods(variant, shape)
    inputs, grad_out = make_inputs(case, 1), make_grad_output(case, 1)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    got = row_noise.float32_rounding_magnitudes(case, inputs, mods, out, lse, grad_out)
    want = dense_magnitudes(case, inputs, mods, grad_out, out, lse)
    for name in ("out", "dq", "dk", "dv"):
        assert got[name].shape == want[name].shape
        assert torch.isfinite(got[name]).all()
    for name in ("dq", "dk", "dv"):
        torch.testing.assert_close(got[name].double(), want[name], rtol=1e-6, atol=0.0)
    # the output's mean square of V_j - O_i is taken apart in float64 (ms V - 2 V.O/D + ms O),
    # which leaves ~1e-8 of the row's own size (rms(G), which the verdict adds it to) where it
    # cancels to 0 (a row of one key): each row is held to that size
    row_size = out.double().square().mean(-1).sqrt() + want["out"]
    off = (got["out"].double() - want["out"]).abs()
    assert (off <= 1e-6 * want["out"] + 1e-6 * row_size).all(), float((off / row_size).max())
    assert (want["dv"] > 0).any() and (want["out"] > 0).any()  # (dQ and dK are 0 where the
    # mod ignores the score)
    cancelling = row_noise.cancelling_magnitudes(case, inputs, mods, out, lse, grad_out)
    for name in ("dq", "dk"):
        torch.testing.assert_close(cancelling[name].double(), want["cancel_" + name],
                                   rtol=1e-6, atol=0.0)
    forward_only = row_noise.float32_rounding_magnitudes(case, inputs, mods, out, lse)
    assert list(forward_only) == ["out"] and torch.equal(forward_only["out"], got["out"])


@pytest.mark.parametrize("name", WHERE_NAMES)
def test_a_mod_whose_autograd_slope_is_nan_where_its_value_is_finite_gets_finite_limits(name):
    """torch.where's branch not taken gave autograd 0 * inf = NaN at visible pairs: every
    noise limit was NaN, and eager flex_attention's correct fp32 output a MISMATCH (an outside
    audit). The slope there is the branch taken's; a wrong output is still caught."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cases.model import Variant
    from reference.golden import reference_pair
    from reference.verdict import judge

    case = Case(Variant(name), Shape(1, 2, 2, 64, 64, 16), "fp32")
    inputs = make_inputs(case, 0)
    mods = build_mods(case.variant, case.shape)
    block_mask = create_block_mask(mods.mask_mod, None, None, 64, 64, "cpu")
    observed = flex_attention(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod,
                              block_mask=block_mask)
    golden, baseline = reference_pair(case, inputs)
    assert torch.isfinite(golden.row_noise["out"]).all()
    verdict = judge(case, golden, baseline.out, observed)
    assert verdict.passed, verdict.metrics
    wrong = observed.clone()
    wrong[0, 1] *= 1.01  # one head 1% off
    assert not judge(case, golden, baseline.out, wrong).passed
