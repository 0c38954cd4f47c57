"""Rows a score mod hides whole with a huge finite constant (tests/padding_variants.py: HF-style
padding as a score mod): where flex_attention's log2 units overflow, correct implementations
give either the exact softmax or a fully masked row, and the verdict takes either, in those
rows alone (reference/overflow_rows.py); the noise the golden sizes there stays finite and
small, so a wrong answer in them is still caught."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases.inputs import make_grad_output, make_inputs
from cases.variants import build_mods
from records.results import Label
from reference.golden import Reference, reference_pair
from reference.overflow_rows import rows_hidden_by_overflow
from reference.verdict import judge
from tests import padding_variants as pv
from tests.test_backends_cpu import execute

CASES = pv.cases("smoke")
MODULES = ("tests.padding_variants",)
#: (fill, dtype) whose padded rows are beyond the dtype's range in log2 units
OVERFLOWS = {(fill, dtype) for fill in ("f32min", "dtypemin") for dtype in ("bf16", "fp16", "fp32")} \
    | {("1e30", "fp16")}


def _case(fill: str, dtype: str, mode: str = "fwd+lse"):
    return next(c for c in CASES if c.variant.param("fill") == fill and c.dtype == dtype
                and c.mode == mode)


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
