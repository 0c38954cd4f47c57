"""Rows a score mod hides whole with a huge finite constant (tests/padding_variants.py: HF-style
padding as a score mod): where flex_attention's log2 units overflow, correct implementations
give either the exact softmax or a fully masked row, and the verdict takes either, in those
rows alone (reference/overflow_rows.py), for the output, the lse and the gradients; the noise
the golden sizes there stays finite and small, so a wrong answer in them is still caught."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases.inputs import make_grad_output, make_inputs
from cases.variants import build_mods
from records.results import Label
from reference.golden import Reference, reference_pair
from reference.overflow_rows import masking_hidden_rows, rows_hidden_by_overflow
from reference.verdict import judge
from tests import padding_variants as pv
from tests.fa_style_backward import eager_backward, fa_style_gradients
from tests.test_backends_cpu import execute

CASES = pv.cases("smoke")
MODULES = ("tests.padding_variants",)
#: (fill, dtype) whose padded rows are beyond the dtype's range in log2 units
OVERFLOWS = {(fill, dtype) for fill in ("f32min", "dtypemin")
             for dtype in ("bf16", "fp16", "fp32")} | {("1e30", "fp16")}


def _case(fill: str, dtype: str, mode: str = "fwd+lse", form: str = "where"):
    return next(c for c in CASES if c.variant.param("fill") == fill and c.dtype == dtype
                and c.variant.param("form") == form and c.mode == mode)


def _eager(case, inputs) -> Reference:
    """eager flex_attention's output and log-sum-exp, in the case dtype."""
    mods = build_mods(case.variant, case.shape)
    out, lse = flex_attention(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod,
                              enable_gqa=True, return_lse=True)
    return Reference(out, lse)


def _as_fully_masked(observed: Reference, rows: torch.Tensor) -> Reference:
    """What the Triton template and the CPU Inductor template's 16-bit cases return in rows
    they hold as -inf: output 0, lse -inf."""
    return Reference(observed.out.masked_fill(rows.unsqueeze(-1), 0.0),
                     observed.lse.masked_fill(rows, -float("inf")))


def _verdict(case, observed_from, seed: int = 0):
    inputs = make_inputs(case, seed)
    golden, baseline = reference_pair(case, inputs)
    return judge(case, golden, baseline, observed_from(_eager(case, inputs)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_overflowing_rows_are_the_padded_rows_where_the_fill_is_beyond_the_dtype(case):
    golden, _ = reference_pair(case, make_inputs(case, 0))
    hidden = rows_hidden_by_overflow(golden.lse, case.dtype)
    if (case.variant.param("fill"), case.dtype) in OVERFLOWS:
        assert torch.equal(hidden, pv.padded_rows(case))
    else:
        assert hidden is None


@pytest.mark.slow
def test_cpu_eager_passes_every_padding_case_on_two_seeds():
    records = execute("cpu-eager", CASES, seeds=range(2), cases_modules=MODULES)
    assert len(records) == 2 * len(CASES)
    failed = [(r.case_id, r.label, r.message) for r in records if r.label is not Label.PASS]
    assert not failed, failed
    minus_inf = {r.case_id for r in records
                 if r.metrics.get("lse", {}).get("overflow_rows_minus_inf")}
    assert minus_inf  # eager's ln(2) round trip: lse -inf where float32 overflows


@pytest.mark.parametrize("fill,dtype", sorted(OVERFLOWS))
def test_the_fully_masked_answer_passes_in_rows_hidden_by_overflow(fill, dtype):
    case = _case(fill, dtype)
    rows = pv.padded_rows(case)
    verdict = _verdict(case, lambda eager: _as_fully_masked(eager, rows))
    assert verdict.passed, verdict.summary
    assert verdict.metrics["overflow_rows_zero"] == int(rows.sum())
    assert verdict.metrics["lse"]["overflow_rows_minus_inf"] == int(rows.sum())


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_fully_masked_answer_fails_where_the_fill_is_within_range(dtype):
    case = _case("1e4", dtype)
    verdict = _verdict(case, lambda eager: _as_fully_masked(eager, pv.padded_rows(case)))
    assert not verdict.passed
    assert "output:row" in verdict.metrics["failed_rules"]


@pytest.mark.parametrize("fill,dtype", sorted(OVERFLOWS))
def test_a_zero_row_outside_the_hidden_rows_fails(fill, dtype):
    case = _case(fill, dtype)
    live = torch.zeros_like(pv.padded_rows(case))
    live[1, 2, 5] = True  # a real token's row
    verdict = _verdict(case, lambda eager: _as_fully_masked(eager, live))
    assert not verdict.passed
    assert {"output:row", "lse:nonfinite"} <= set(verdict.metrics["failed_rules"])


@pytest.mark.parametrize("fill,dtype", sorted(OVERFLOWS))
def test_a_wrong_mean_in_the_hidden_rows_fails(fill, dtype):
    """The hidden rows' answer is the mean of V over every key; a kernel that leaves one key
    out (the last block's last key, say) is off by about |V| / S there. Before the golden
    knew these rows' roundings cancel (tied rows), a float32 case sized their noise as inf
    and took any answer there."""
    case = _case(fill, dtype)
    rows = pv.padded_rows(case)
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    eager = _eager(case, inputs)
    group = case.shape.Hq // case.shape.Hkv
    v = inputs.v.float().repeat_interleave(group, 1)
    wrong_mean = v[..., :-1, :].mean(-2, keepdim=True).expand_as(eager.out)
    out = torch.where(rows.unsqueeze(-1), wrong_mean.to(eager.out.dtype), eager.out)
    verdict = judge(case, golden, baseline, Reference(out, eager.lse))
    assert not verdict.passed
    assert "output:row" in verdict.metrics["failed_rules"]


@pytest.mark.parametrize("fill,dtype", sorted(OVERFLOWS))
def test_minus_inf_lse_on_a_live_row_fails(fill, dtype):
    case = _case(fill, dtype)

    def one_live_row_minus_inf(eager):
        lse = eager.lse.clone()
        lse[0, 1, 3] = -float("inf")
        return Reference(eager.out, lse)

    verdict = _verdict(case, one_live_row_minus_inf)
    assert not verdict.passed
    assert "lse:nonfinite" in verdict.metrics["failed_rules"]


@pytest.mark.parametrize("fill,dtype", sorted(OVERFLOWS))
@pytest.mark.parametrize("value", [0.0, -1.0, 1e30])
def test_an_lse_within_range_on_a_hidden_row_fails(fill, dtype, value):
    """With float64's min as the fill the baseline's error is 1.8e308 and its limit inf: before
    the rule below, any finite lse passed there."""
    case = _case(fill, dtype)
    rows = pv.padded_rows(case)
    verdict = _verdict(case, lambda eager: Reference(eager.out, eager.lse.masked_fill(rows, value)))
    assert not verdict.passed
    assert verdict.metrics["failed_rules"] == ["lse:overflow_rows"]
    assert verdict.metrics["lse"]["overflow_rows_in_range"] == int(rows.sum())


@pytest.mark.parametrize("fill", pv.FILLS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_the_golden_sizes_finite_noise_on_padding_forward_and_backward(fill, dtype):
    """No NaN anywhere (a NaN size failed every row of a float32 case with float64's min), and
    the output's noise finite (an inf size took any answer in the padded rows)."""
    case = replace(_case(fill, dtype, "fwd"), mode="fwd+bwd")
    inputs = make_inputs(case, 0)
    golden, _ = reference_pair(case, inputs, make_grad_output(case, 0))
    for name, sizes in (golden.row_noise or {}).items():
        assert not torch.isnan(sizes).any(), name
    if dtype == "fp32":
        assert torch.isfinite(golden.row_noise["out"]).all()


@pytest.mark.slow
def test_cpu_inductor_returns_zero_rows_in_16_bit_cases_and_passes(tmp_path):
    """In a bfloat16 case the CPU Inductor template rounds the mod's float32 min to the query's
    dtype, where it is -inf, and returns those rows as fully masked (torch 2.13.0: before the
    verdict took that answer, a MISMATCH of 384 rows); either answer passes."""
    case = _case("f32min", "bf16", "fwd")
    records = execute("cpu-inductor", [case], cases_modules=MODULES, compile_cache="warm",
                      warm_cache_dir=str(tmp_path / "inductor-cache"))
    record = records[0]
    assert record.label is Label.PASS, record.message
    assert record.metrics["overflow_rows"] == int(pv.padded_rows(case).sum())


# -- gradients ------------------------------------------------------------------------------
BACKWARD = [(form, fill, dtype) for form, fill in pv.FORMS_AND_FILLS if fill != "1e4"
            for dtype in ("bf16", "fp16", "fp32")]


def _backward_case(form: str, fill: str, dtype: str):
    return replace(_case(fill, dtype, "fwd", form), mode="fwd+bwd")


def _pair(case):
    inputs = make_inputs(case, 0)
    return reference_pair(case, inputs, make_grad_output(case, 0))


def _eager_with_hidden_rows_masked(case) -> Reference:
    """Eager flex_attention's output and gradients with the rows hidden by overflow masked:
    what a kernel that holds them as -inf (the Triton template, for float32's min) returns."""
    mods = build_mods(case.variant, case.shape)
    return eager_backward(case, 0, masking_hidden_rows(mods, pv.padded_rows(case)).mask_mod)


@pytest.mark.parametrize("form,fill,dtype", [b for b in BACKWARD if b[1:] in OVERFLOWS
                                             and b[1:] != ("1e30", "fp16")])
def test_eager_backward_passes_where_the_fill_overflows(form, fill, dtype):
    """Eager flex_attention's own backward (its CPU device check lifted): on these rows torch
    2.13.0 gives the masked answer where its float32 lse overflows in log2 units and the exact
    one where it does not (float16's min in a float16 case); either passes. Not -1e30: there
    eager's backward recomputes P from a float32 lse that cannot hold log(n)
    (docs/findings.md, finding 4; test_p_recomputed_from_a_float32_lse... below)."""
    case = _backward_case(form, fill, dtype)
    golden, baseline = _pair(case)
    verdict = judge(case, golden, baseline, eager_backward(case, 0))
    assert verdict.passed, verdict.summary


@pytest.mark.parametrize("form,fill,dtype", [b for b in BACKWARD if b[1:] in OVERFLOWS])
def test_a_backward_that_masks_the_hidden_rows_passes_as_the_other_answer(form, fill, dtype):
    case = _backward_case(form, fill, dtype)
    golden, baseline = _pair(case)
    assert golden.masked_overflow is not None and baseline.masked_overflow is not None
    verdict = judge(case, golden, baseline, _eager_with_hidden_rows_masked(case))
    assert verdict.passed, verdict.summary
    assert verdict.metrics["overflow_rows_zero"] == int(pv.padded_rows(case).sum())
    assert verdict.metrics["dv"]["as_masked_overflow"]  # the padded rows' share of dV is gone


@pytest.mark.parametrize("form,fill", [b[:2] for b in BACKWARD if b[2] == "fp32"])
def test_p_recomputed_from_a_float32_lse_that_cannot_hold_log_n_fails_dv(form, fill):
    """A FlashAttention-style backward takes P = exp(s - lse) with lse in float32; beside a
    constant beyond 2^24 the lse cannot hold log(n), so P is 1 for each of a padded row's n
    keys and the row adds n times its share to dV: a wrong gradient, not a rounding (the
    golden's noise sized it as one before, and dV went unjudged in float32 cases)."""
    case = _backward_case(form, fill, "fp32")
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    golden, baseline = _pair(case)
    eager = eager_backward(case, 0)
    grads = fa_style_gradients(case, inputs, grad_out, eager.out)
    verdict = judge(case, golden, baseline, Reference(eager.out, None, grads))
    assert not verdict.passed
    assert any(rule.startswith("dv:") for rule in verdict.metrics["failed_rules"])
    assert "finding 4" in verdict.summary  # the message says why


@pytest.mark.parametrize("form,fill,dtype", BACKWARD)
@pytest.mark.parametrize("fault", ["dv_zero", "dv_x1.05", "dq_x1.05", "dk_x1.05"])
def test_a_wrong_gradient_fails_beside_the_hidden_rows(form, fill, dtype, fault):
    """dV scaled or zeroed, dQ or dK scaled (in the where form the padded rows feed dQ and dK
    nothing, so those are judged on the live rows alone): caught in every dtype. In float32
    cases they all passed before, dV's noise being inf or 1.6e31."""
    case = _backward_case(form, fill, dtype)
    golden, baseline = _pair(case)
    eager = eager_backward(case, 0)
    name, how = fault.split("_")
    grads = dict(eager.grads)
    grads[name] = torch.zeros_like(grads[name]) if how == "zero" else grads[name] * 1.05
    verdict = judge(case, golden, baseline, Reference(eager.out, None, grads))
    assert not verdict.passed
    assert any(rule.startswith(f"{name}:") for rule in verdict.metrics["failed_rules"])


def test_the_masked_answer_survives_the_reference_cache(tmp_path):
    """The workers take references from the cache (conformance/reference_cache.py), which
    stores them as plain tensors: the gradients' other answer must come back too."""
    from conformance.reference_cache import ReferenceCache

    case = _backward_case("where", "f32min", "fp32")
    cache = ReferenceCache(tmp_path, 1 << 30)
    first, _ = cache.get(case, 0)
    golden, baseline = cache.get(case, 0)
    assert any(tmp_path.iterdir())  # the second came from the file
    for ref in (golden, baseline):
        assert ref.masked_overflow is not None
        assert set(ref.masked_overflow.grads) == {"dq", "dk", "dv"}
    assert torch.equal(golden.masked_overflow.grads["dv"], first.masked_overflow.grads["dv"])
    assert golden.masked_overflow.row_noise is not None


def test_a_later_call_that_took_the_fully_masked_answer_is_noted(tmp_path):
    """A backend whose calls differ is judged on each: a pass where only a later call took the
    fully masked answer still gets the report's oracle note (masked_answer_calls)."""
    from conformance.decision import decide
    from conformance.protocol import Observation, Outcome, Phase, save_output
    from records.results import Record
    from records.metrics import took_masked_answer
    from reports.summary import masked_answer_cases

    case = _case("1e30", "fp16")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    exact = _eager(case, inputs)
    masked = _as_fully_masked(exact, pv.padded_rows(case))
    assert not took_masked_answer(judge(case, golden, baseline, exact).metrics)
    path = str(tmp_path / "output.pt")
    save_output(path, {"out": exact.out, "lse": exact.lse},
                [(3, {"out": masked.out, "lse": masked.lse})], 4)
    decision = decide(case, Observation(Outcome.OK, Phase.RUN, output_path=path),
                      (golden, baseline))
    assert decision.label is Label.PASS, decision.message
    assert decision.metrics["differing_calls"] == [3]
    assert decision.metrics["masked_answer_calls"] == [3]
    record = Record(case.id, Label.PASS, metrics=decision.metrics)
    assert masked_answer_cases([record]) == [case.id]
