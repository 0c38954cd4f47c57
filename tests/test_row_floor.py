"""The row rule's dtype term (reference/verdict.py, _row_floor): the larger of u * rms(G) and one
unit in the last place of the case dtype at the row's largest element, over sqrt(D). A correct
kernel may round any element the other way, which u * rms(G) alone did not allow where a row's
size is in one element: eager flex_attention's correct fp16 output failed there (a fuzzed case,
below). Rows whose size is spread keep u * rms(G)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases import variants as v
from cases.composed import variant_from_token
from cases.inputs import make_inputs, torch_dtype
from cases.model import Case, Shape
from cases.variants import build_mods
from conformance import compat
from reference.golden import Reference, reference_pair
from reference.verdict import TOLERANCES, _row_floor, _ulps, judge

_INT_VIEW = {"fp16": torch.int16, "bf16": torch.int16, "fp32": torch.int32}


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_an_ulp_is_the_gap_to_the_next_value_of_the_dtype(dtype):
    torch_type = torch_dtype(dtype)
    info = torch.finfo(torch_type)
    draws = torch.randn(4000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    values = torch.cat([draws * 10.0 ** torch.arange(-6, 6).repeat(334)[:4000],
                        torch.tensor([0.0, info.tiny, info.tiny / 8, 1.0, 2.0, -0.5,
                                      info.max / 4])]).to(torch_type)
    finite = values[torch.isfinite(values)].abs()
    finite = finite[finite < info.max]
    following = (finite.view(_INT_VIEW[dtype]) + 1).view(torch_type)
    gap = following.double() - finite.double()
    assert torch.equal(_ulps(finite.double(), TOLERANCES[dtype]), gap)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_rows_whose_size_is_spread_keep_u_times_their_rms(dtype):
    rows = torch.randn(64, 128, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    tol = TOLERANCES[dtype]
    assert torch.equal(_row_floor(rows, tol), tol.unit_roundoff * rows.pow(2).mean(-1).sqrt())
    peaked = rows.clone()
    peaked[:, 0] = 40.0  # most of the row's size in one element
    assert torch.all(_row_floor(peaked, tol) > tol.unit_roundoff * peaked.pow(2).mean(-1).sqrt())


def _row_case() -> Case:
    return Case(v.full(), Shape(1, 1, 1, 4, 4, 8), "fp16")


def _judged(observed: torch.Tensor, golden: torch.Tensor, baseline: torch.Tensor):
    lse = torch.zeros(golden.shape[:-1], dtype=torch.float64)
    return judge(_row_case(), Reference(golden, lse), baseline, observed)


def _one_big_element(seed: int) -> torch.Tensor:
    """[1, 1, 4, 8] rows whose size is in one element of about 1.1 (as the fuzzed case's)."""
    rows = torch.randn(1, 1, 4, 8, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64) * 0.1
    rows[..., 6] = 1.1 + rows[..., 6] / 10
    return rows


def _moved(values: torch.Tensor, ulps: int) -> torch.Tensor:
    """fp16 values moved ``ulps`` units up (towards +inf for positive values)."""
    return (values.view(torch.int16) + ulps).view(torch.float16)


@pytest.mark.parametrize("seed", range(4))
def test_a_row_rounded_the_other_way_in_its_largest_element_passes(seed):
    golden = _one_big_element(seed)
    baseline = golden.to(torch.float16)  # rounded to nearest: the baseline's error at its least
    observed = baseline.clone()  # the largest element rounded to G's other neighbour
    above = baseline[..., 6].double() > golden[..., 6]
    observed[..., 6] = torch.where(above, _moved(baseline[..., 6], -1),
                                   _moved(baseline[..., 6], 1))
    assert torch.all((observed[..., 6].double() - golden[..., 6]).abs() <= _ulps(
        golden[..., 6], TOLERANCES["fp16"]))
    verdict = _judged(observed, golden, baseline)
    assert verdict.passed, verdict.summary


@pytest.mark.parametrize("seed", range(4))
def test_rows_off_by_more_than_the_baselines_error_and_an_ulp_fail_the_row_rule(seed):
    """The limit is 4x the baseline's RMS error (about 0.3 ulp, rounded to nearest) plus an
    ulp of the largest element over sqrt(D). On these four rows, 2 ulps off everywhere reach
    0.76-1.27x the limit (0.92-1.77x with u * rms(G) alone), 3 ulps 1.20-1.94x (1.47-2.70x)."""
    golden = _one_big_element(seed)
    baseline = golden.to(torch.float16)
    off_everywhere = baseline.clone()
    off_everywhere[0, 0, 2] = _moved(baseline[0, 0, 2], 3)  # three ulps in every element
    verdict = _judged(off_everywhere, golden, baseline)
    assert not verdict.passed and "row" in verdict.metrics["failed_rules"]
    assert verdict.metrics["worst_place"] == {"b": 0, "h": 0, "q": 2}
    off_big = baseline.clone()
    off_big[0, 0, 1, 6] = _moved(baseline[0, 0, 1, 6], 4)  # four ulps in its largest element
    verdict = _judged(off_big, golden, baseline)
    assert not verdict.passed and verdict.metrics["worst_place"]["q"] == 1


def _eager_on_the_fuzzed_case(dtype: str, seed: int, p_rounding_sized: bool = True):
    """The verdict on eager flex_attention's (correct) output of the fuzzed case these tests
    come from, ``composed-scale2-cap20-alibi8/b2-h4x1-s257x31-d8/<dtype>/fwd+lse``; with
    ``p_rounding_sized`` False, as before the output rows carried the size of P's rounding
    (reference/probability_rounding.py)."""
    case = Case(variant_from_token("composed-scale2-cap20-alibi8"),
                Shape.parse("b2-h4x1-s257x31-d8"), dtype, mode="fwd+lse")
    mods = build_mods(case.variant, case.shape)
    inputs = make_inputs(case, seed)
    golden, baseline = reference_pair(case, inputs)
    if not p_rounding_sized:
        golden = replace(golden, row_only_noise=None)
    out, lse = compat.attention(flex_attention, inputs.q, inputs.k, inputs.v, mods.score_mod,
                                None, enable_gqa=True, return_lse=True)
    return judge(case, golden, baseline, Reference(out, lse))


def test_eagers_correct_fp16_output_passes_where_it_failed_one_row():
    """Found by probing a near miss of a fuzzing run: eager flex_attention, seed 43 of 60, one
    row at 1.14x its limit before: its largest element (1.107) one ulp off, the baseline's
    rounded to nearest."""
    verdict = _eager_on_the_fuzzed_case("fp16", 43)
    assert verdict.passed, verdict.summary
    assert verdict.metrics["worst_row_margin"] < 0.9


@pytest.mark.parametrize("dtype, seed", [("bf16", 436), ("bf16", 303), ("fp16", 526)])
def test_eagers_rounding_of_p_passes_where_it_failed(dtype, seed):
    """Eager's correct output on the same fuzzed case failed one row on these seeds (1.27x,
    1.13x and 1.17x) until the rows carried the size of P's rounding: eager rounds the
    normalized P, the baseline exp(s - rowmax), two draws of one noise, and where two to five
    keys hold a row the baseline's was a tenth of eager's. 0.59-0.68 of their limits now."""
    verdict = _eager_on_the_fuzzed_case(dtype, seed)
    assert verdict.passed, verdict.summary
    assert verdict.metrics["worst_row_margin"] < 0.75
    assert not _eager_on_the_fuzzed_case(dtype, seed, p_rounding_sized=False).passed
