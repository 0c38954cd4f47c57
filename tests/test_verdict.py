"""The verdict in both directions: correct outputs (eager and compiled flex_attention on the
CPU) pass on several seeds for every variant; deliberately broken outputs are caught."""
from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from cases import variants as v
from cases.inputs import make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
from reference.faults import FAULTS
from reference.golden import Reference, baseline_attention, golden_attention
from reference.verdict import TOLERANCES, judge

SHAPE = Shape(1, 4, 4, 256, 256, 128)
VARIANTS = [v.full(), v.causal(), v.sliding_window(64), v.prefix_lm(64), v.document(),
            v.alibi(), v.softcap(50.0), v.rel_bias(32)]
SEEDS = range(5)


def _flex_runner(case: Case, compiled: bool):
    mods = build_mods(case.variant, case.shape)
    block_mask = None
    if mods.mask_mod is not None:
        block_mask = create_block_mask(mods.mask_mod, None, None, case.shape.Sq,
                                       case.shape.Skv, "cpu")
    fn = torch.compile(flex_attention, fullgraph=True, dynamic=False) if compiled else flex_attention

    def run(inputs):
        return fn(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod, block_mask=block_mask)

    return run


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda var: var.token)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "inductor"])
def test_correct_flex_attention_passes_on_five_seeds(variant, compiled):
    case = Case(variant, SHAPE, "bf16")
    torch._dynamo.reset()
    run = _flex_runner(case, compiled)
    for seed in SEEDS:
        inputs = make_inputs(case, seed)
        verdict = judge(case, golden_attention(case, inputs), baseline_attention(case, inputs),
                        run(inputs))
        assert verdict.passed, f"seed {seed}: {verdict.summary}"
        # a real margin, not a scrape past the thresholds
        assert verdict.metrics["worst_row_margin"] < 0.7
        assert verdict.metrics["worst_head_margin"] < 0.7


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_correct_eager_passes_in_other_dtypes(dtype):
    for variant in (v.causal(), v.alibi()):
        case = Case(variant, Shape(2, 2, 2, 128, 128, 64), dtype)
        run = _flex_runner(case, compiled=False)
        for seed in range(3):
            inputs = make_inputs(case, seed)
            verdict = judge(case, golden_attention(case, inputs),
                            baseline_attention(case, inputs), run(inputs))
            assert verdict.passed, f"{case.id} seed {seed}: {verdict.summary}"


# softcap at cap 50 barely acts on N(0, 1) scores (|s| < 5): ignoring it moves the output by
# less than bf16 resolves, so it is rightly not a mismatch there (docs/oracle.md). Cap 5 acts.
FAULT_CASES = [Case(var if var.name != "softcap" else v.softcap(5.0), SHAPE, "bf16")
               for var in VARIANTS]


@pytest.mark.parametrize("fault_name", sorted(FAULTS))
def test_every_fault_is_caught_on_every_variant_it_applies_to(fault_name):
    fault, applies = FAULTS[fault_name]
    checked = 0
    for case in FAULT_CASES:
        if not applies(case):
            continue
        inputs = make_inputs(case, 7)
        base = baseline_attention(case, inputs)
        verdict = judge(case, golden_attention(case, inputs), base, fault(case, inputs, base))
        assert not verdict.passed, f"{fault_name} on {case.id} was not caught"
        assert verdict.summary
        checked += 1
    assert checked >= 2


def test_pytorch_global_rule_alone_misses_what_the_local_rules_catch():
    """anchors.md: a row ignoring the mask, a head scaled by 1.01 and a zeroed last row all
    pass a mean-over-everything rule; each must fail here, and by a local rule."""
    case = Case(v.causal(), Shape(1, 8, 8, 512, 512, 64), "bf16")
    inputs = make_inputs(case, 0)
    gold, base = golden_attention(case, inputs), baseline_attention(case, inputs)
    for name in ("row_ignores_mask", "head_scaled", "last_row_zeroed"):
        verdict = judge(case, gold, base, FAULTS[name][0](case, inputs, base))
        assert verdict.metrics["global_margin"] <= 1.0, name  # PyTorch's rule would pass it
        assert not verdict.passed, name
        assert set(verdict.metrics["failed_rules"]) & {"row", "head"}, name


def test_nan_is_a_mismatch_that_says_so_and_where():
    case = Case(v.causal(), Shape(1, 2, 2, 64, 64, 32), "bf16")
    inputs = make_inputs(case, 0)
    base = baseline_attention(case, inputs)
    broken = base.clone()
    broken[0, 1, 9, 4] = math.nan
    verdict = judge(case, golden_attention(case, inputs), base, broken)
    assert not verdict.passed
    assert "1 NaN" in verdict.summary and "b=0 h=1 q=9 d=4" in verdict.summary
    assert verdict.metrics["nan_count"] == 1
    # the errors the NaN makes are not numbers to quote ("mean error nan is nanx")
    assert "nanx" not in verdict.summary and "nan is" not in verdict.summary, verdict.summary
    assert set(verdict.metrics["failed_rules"]) >= {"nonfinite"}
    inf = base.clone()
    inf[0, 0, 3] = math.inf
    verdict = judge(case, golden_attention(case, inputs), base, inf)
    assert not verdict.passed and "Inf where the golden is finite" in verdict.summary
    assert "infx" not in verdict.summary and "inf is" not in verdict.summary, verdict.summary


def test_worst_place_points_at_the_broken_row():
    case = Case(v.full(), Shape(2, 4, 4, 64, 64, 32), "bf16")
    inputs = make_inputs(case, 0)
    base = baseline_attention(case, inputs)
    broken = base.clone()
    broken[1, 2, 17] = broken[1, 2, 17] * -1
    verdict = judge(case, golden_attention(case, inputs), base, broken)
    assert not verdict.passed
    assert verdict.metrics["worst_place"] == {"b": 1, "h": 2, "q": 17}
    assert verdict.metrics["failing_rows"] == 1


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4, 1, 6, 5)])
def test_flat_place_is_torchs_unravel_index(shape):
    from reference.verdict import flat_place

    size = math.prod(shape)
    for flat in (0, 1, size // 2, size - 1):
        assert flat_place(flat, shape) == tuple(
            int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def test_wrong_shape_and_non_tensor_are_mismatches():
    case = Case(v.full(), Shape(1, 2, 2, 16, 16, 8), "bf16")
    inputs = make_inputs(case, 0)
    gold, base = golden_attention(case, inputs), baseline_attention(case, inputs)
    assert "shape" in judge(case, gold, base, base[:, :, :8]).summary
    assert not judge(case, gold, base, None).passed


def test_baseline_itself_passes_and_tolerances_cover_every_dtype():
    assert set(TOLERANCES) == {"bf16", "fp16", "fp32"}
    case = Case(v.alibi(), Shape(1, 2, 2, 64, 64, 32), "bf16")
    inputs = make_inputs(case, 0)
    base = baseline_attention(case, inputs)
    verdict = judge(case, golden_attention(case, inputs), base, base)
    assert verdict.passed and verdict.metrics["error_ratio"] == pytest.approx(1.0)


def test_a_baseline_at_the_absolute_floor_gives_a_readable_message_not_a_huge_ratio():
    """A query that sees one key has out = v in every dtype: the baseline's error is 0, or
    float64 rounding where the golden divides P V by its normalizer unshifted (see
    reference/kernel.py), far below the floor, which then sets the limit."""
    case = Case(v.full(), Shape(1, 2, 2, 4, 1, 8), "bf16")
    inputs = make_inputs(case, 0)
    golden, baseline = golden_attention(case, inputs), baseline_attention(case, inputs)
    assert torch.allclose(baseline.double(), golden.out, rtol=2.0 ** -51, atol=0)
    exact = Reference(baseline.double())  # a golden that the baseline matches bit for bit
    rounded = Reference(baseline.double() * (1 + 2.0 ** -52))  # one float64 ulp off
    for gold, says in ((exact, "is 0 (exact; limit 0.00"),
                       (rounded, "(below the floor; limit 0.00")):
        verdict = judge(case, gold, baseline, baseline + 0.0625)
        assert not verdict.passed
        assert "mean error 0.0625 where the baseline's is " in verdict.summary
        assert "head b=0 h=0: mean error 0.0625 where its baseline's is " in verdict.summary
        assert verdict.summary.count(says) == 2, verdict.summary
        assert "x (limit" not in verdict.summary
        assert max(len(word) for word in verdict.summary.split()) < 20  # no 300-digit number
    assert judge(case, exact, baseline, baseline + 0.0625).metrics["error_ratio"] is None


def test_a_nan_baseline_error_is_never_called_below_the_absolute_floor():
    """NaN compares false with everything: the message must not read as if a NaN baseline
    error were a tiny one."""
    from reference.verdict import _against_baseline

    said = _against_baseline(0.1, math.nan, 1e-7, TOLERANCES["bf16"], "the baseline's")
    assert "below the floor" not in said and "exact" not in said
    assert "nan" in said


#: Decoding: one query row, so a head is one row of 8 values, and under prefix_lm(3) the row
#: sees 3 keys: every value's error comes from the same few rounded probabilities.
DECODE = Shape(4, 8, 8, 1, 200, 8)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_correct_eager_passes_heads_of_one_row_that_failed_without_the_sampling_floor(
        dtype, monkeypatch):
    """Eager flex_attention rounds its scores to the dtype, so on a row that sees 3 keys its
    error is a few roundings larger than the fused-kernel baseline's; the mean error of a head
    of one row is that one row's, and the head rule's factor 2.1 alone failed it on most seeds
    (56 of 60 in bf16 at this shape with GQA). The sampling floor (reference/verdict.py) gives
    a head of one row the row rule's allowance."""
    import reference.verdict as verdict_module

    case = Case(v.prefix_lm(3), DECODE, dtype)
    run = _flex_runner(case, compiled=False)
    seeds = [(golden_attention(case, inputs), baseline_attention(case, inputs), run(inputs))
             for inputs in (make_inputs(case, seed) for seed in range(8))]
    for seed, (gold, base, out) in enumerate(seeds):
        verdict = judge(case, gold, base, out)
        assert verdict.passed, f"seed {seed}: {verdict.summary}"
    monkeypatch.setattr(verdict_module, "SAMPLING_FLOOR_ULPS", 0.0)  # the rule before
    failed = [seed for seed, (gold, base, out) in enumerate(seeds)
              if not judge(case, gold, base, out).passed]
    assert failed, "without the floor some seed should fail the head rule"


def test_faults_are_still_caught_on_heads_of_one_row():
    """The floor is the row rule's allowance: what changes a decoding row by more than a few
    roundings is still caught (a head scaled by 1%, 2.6 bf16 ulps, is below that there)."""
    case = Case(v.prefix_lm(3), DECODE, "bf16")
    for seed in range(3):
        inputs = make_inputs(case, seed)
        gold, base = golden_attention(case, inputs), baseline_attention(case, inputs)
        for name in ("row_ignores_mask", "mask_off_by_one", "heads_swapped", "wrong_scale",
                     "last_row_zeroed", "single_nan", "single_inf"):
            fault, applies = FAULTS[name]
            assert applies(case), name
            verdict = judge(case, gold, base, fault(case, inputs, base))
            assert not verdict.passed, f"{name} on seed {seed} was not caught"
