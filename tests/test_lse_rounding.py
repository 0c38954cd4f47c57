"""The lse rule of fwd+lse cases allows, per row, for a float32 kernel's roundings of the
scores that make it (reference/row_noise.py, _LseRounding; reference/lse_verdict.py): eager
flex_attention's correct lse failed the rule (1.13x, 1.43x) where a row is held by one key
whose dot product cancels (an outside fuzzing run), and faults of the usual cases are caught
as before."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from torch.nn.attention.flex_attention import flex_attention

from cases import variants as v
from cases.inputs import make_inputs
from cases.model import Case, Shape, Variant
from cases.variants import build_mods
from conformance import compat
from reference.golden import Reference, reference_pair
from reference.verdict import judge
from tests.fa_style_backward import block_mask_of

#: What the fuzzer's grammar can draw: a prefix of one key, scores times 4, inputs x8.
CANCELLING = Case(Variant("composed", (("prefix", 1), ("scale", 4))), Shape(1, 8, 2, 255, 255, 64),
                  "fp32", "fwd+lse", input_scale=8)


def _eager(case: Case, seed: int):
    """The golden, the baseline and eager flex_attention's output and lse."""
    inputs = make_inputs(case, seed)
    golden, baseline = reference_pair(case, inputs)
    s = case.shape
    out, lse = compat.attention(flex_attention, inputs.q, inputs.k, inputs.v,
                                build_mods(case.variant, s).score_mod, block_mask_of(case),
                                enable_gqa=s.Hq != s.Hkv, return_lse=True)
    return golden, baseline, Reference(out, lse)


@pytest.mark.parametrize("seed", [0, 1])
def test_eager_lse_passes_where_one_key_holds_a_row_and_its_dot_product_cancels(seed):
    golden, baseline, eager = _eager(CANCELLING, seed)
    verdict = judge(CANCELLING, golden, baseline, eager)
    assert verdict.passed, verdict.summary
    assert golden.row_noise["lse"].shape == golden.lse.shape


def test_lse_faults_are_caught_as_before():
    case = Case(v.causal(), Shape(2, 4, 2, 129, 200, 16), "fp32", "fwd+lse")
    golden, baseline, eager = _eager(case, 0)
    assert judge(case, golden, baseline, eager).passed
    lse = eager.lse
    busiest = int(golden.lse.abs().argmax())
    one_row = lse.flatten().clone()
    one_row[busiest] += 1e-3
    for name, wrong in (("all rows +1e-4", lse + 1e-4), ("one row +1e-3", one_row.view_as(lse)),
                        ("all rows x(1+1e-5)", lse * (1 + 1e-5)),
                        ("log2 units", lse / math.log(2))):
        verdict = judge(case, golden, baseline, replace(eager, lse=wrong))
        assert not verdict.passed and "lse:row" in verdict.metrics["failed_rules"], name
    golden, baseline, eager = _eager(CANCELLING, 0)  # a wrong unit is caught there too
    verdict = judge(CANCELLING, golden, baseline, replace(eager, lse=eager.lse / math.log(2)))
    assert not verdict.passed, verdict.summary
