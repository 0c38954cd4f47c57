"""A score mod reads its score's dtype as flex_attention traces it, the query's
(cases/score_dtype.py): in the golden's float64 and the baseline's float32 evaluations alike,
so mods written as third-party code writes them (``torch.finfo(score.dtype).min`` as padding,
``.to(score.dtype)`` after a float32 soft-cap) are judged as the function flex_attention
computes, and a backend that computes another one is caught."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import cases.pointwise as pointwise
import cases.score_addend as score_addend
import cases.score_dtype as score_dtype
from cases.catalog import core_matrix
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape, Variant
from cases.pointwise import PointwiseModError, check_mods, evaluate_score
from cases.variants import Mods, build_mods
from records.results import Label
from reference.golden import Reference, reference_pair
from reference.golden import _pair as golden_and_baseline  # of mods that are no variant
from reference.pair_terms import pair_terms
from reference.verdict import judge
from tests import dtype_reading_variants as dv
from tests.eager_flex import as_eager_runs_it
from tests.test_backends_cpu import execute

GRID = [torch.arange(n) for n in (1, 2, 3, 4)]
SCORES = torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
CASES = dv.cases("smoke")
MODULES = ("tests.dtype_reading_variants",)
SIXTEEN_BITS = (torch.bfloat16, torch.float16)


def _case(kind: str, dtype: str, mode: str = "fwd+lse"):
    return next(c for c in CASES if c.variant.param("kind") == kind and c.dtype == dtype
                and c.mode == mode)


def _flex(case, inputs, score_mod) -> Reference:
    out, lse = flex_attention(inputs.q, inputs.k, inputs.v, score_mod=as_eager_runs_it(score_mod),
                              enable_gqa=True, return_lse=True)
    return Reference(out, lse)


@pytest.mark.parametrize("traced", [torch.bfloat16, torch.float16, torch.float32, None])
def test_the_score_reads_as_the_traced_dtype(traced):
    def plus_eps(score, b, h, q_idx, kv_idx):
        return score + torch.finfo(score.dtype).eps

    zeros = torch.zeros_like(SCORES)
    got = evaluate_score(plus_eps, zeros, *GRID, traced_dtype=traced)
    assert torch.all(got == torch.finfo(traced or torch.float64).eps)


@pytest.mark.parametrize("traced", [torch.bfloat16, torch.float16, torch.float32])
def test_tensors_made_from_the_score_read_as_the_trace_gives_them(traced):
    buffer32 = torch.tensor([0.5], dtype=torch.float32)
    buffer_bf16 = torch.tensor([0.5], dtype=torch.bfloat16)
    seen = {}

    def reads(score, b, h, q_idx, kv_idx):
        seen.update(score=score.dtype, doubled=(score * 2).dtype, float=score.float().dtype,
                    plus_float32=(score + buffer32[0]).dtype,
                    plus_bfloat16=(score + buffer_bf16[0]).dtype,
                    where=torch.where(q_idx > 0, score, -1.0).dtype,
                    chained=((score * 2).clone() - 1).dtype, double=score.double().dtype,
                    buffer=buffer32.dtype, index=q_idx.dtype)
        return score

    evaluate_score(reads, SCORES, *GRID, traced_dtype=traced)
    assert seen == dict(score=traced, doubled=traced, float=torch.float32,
                        plus_float32=torch.promote_types(traced, torch.float32),
                        plus_bfloat16=torch.promote_types(traced, torch.bfloat16),
                        where=traced, chained=traced, double=torch.float64,
                        buffer=torch.float32, index=torch.int64)


def test_the_golden_keeps_16_bit_arithmetic_in_float64_and_the_baseline_rounds_as_eager():
    def rounded_third(s, b, h, q_idx, kv_idx):
        return (s / 3).to(s.dtype)

    golden = evaluate_score(rounded_third, SCORES, *GRID, traced_dtype=torch.bfloat16)
    assert golden.dtype == torch.float64 and torch.equal(golden, SCORES / 3)
    baseline = evaluate_score(rounded_third, SCORES.float(), *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(baseline, (SCORES.float() / 3).to(torch.bfloat16))

    def constant_slope(s, b, h, q_idx, kv_idx):  # a 16-bit constant times an index
        return s + torch.tensor(0.3, dtype=s.dtype) * (kv_idx - q_idx)

    distance = (GRID[3].view(1, 1, 1, -1) - GRID[2].view(1, 1, -1, 1)).double()
    constant = torch.tensor(0.3, dtype=torch.bfloat16).double()  # the constant as named
    golden = evaluate_score(constant_slope, SCORES, *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(golden, SCORES + constant * distance)
    baseline = evaluate_score(constant_slope, SCORES.float(), *GRID, traced_dtype=torch.bfloat16)
    eager_product = (torch.tensor(0.3, dtype=torch.bfloat16) * distance.long()).float()
    assert torch.equal(baseline, SCORES.float() + eager_product)

    def like_slope(s, b, h, q_idx, kv_idx):  # eager bakes new_tensor's constant in as traced
        return s + s.new_tensor(0.3) * (kv_idx - q_idx)

    golden = evaluate_score(like_slope, SCORES, *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(golden, SCORES + constant * distance)
    baseline = evaluate_score(like_slope, SCORES.float(), *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(baseline, SCORES.float() + eager_product)

    def halved_float32(s, b, h, q_idx, kv_idx):  # a float32 value converted to 16 bits
        return (s.float() / 3).half()

    golden = evaluate_score(halved_float32, SCORES, *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(golden, SCORES / 3)
    baseline = evaluate_score(halved_float32, SCORES.float(), *GRID, traced_dtype=torch.bfloat16)
    assert torch.equal(baseline, (SCORES.float() / 3).half())


_BUFFER32 = torch.tensor([0.5], dtype=torch.float32)
_TO_FLOAT32 = {
    "type_name": lambda s: s.type("torch.FloatTensor"),
    "float": lambda s: s.float(),
    "to": lambda s: s.to(torch.float32),
    "to_dtype": lambda s: s.to(dtype=torch.float32),
    "type": lambda s: s.type(torch.float32),
    "type_as": lambda s: s.type_as(_BUFFER32),
    "to_other": lambda s: s.to(_BUFFER32),
}


@pytest.mark.parametrize("traced", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("form", sorted(_TO_FLOAT32))
def test_a_float32_conversion_of_the_score_keeps_the_golden_in_float64(form, traced):
    """flex_attention's scores are float32 already (Gemma's ``score.float()`` soft-cap): the
    golden does that arithmetic in float64, as it does 16-bit arithmetic, and does not round
    its scores to float32 (it did, by about one float32 rounding of each score)."""
    convert = _TO_FLOAT32[form]

    def third_of_float32(s, b, h, q_idx, kv_idx):  # reads no dtype: the lens may be skipped
        return convert(s) / 3

    for _ in range(2):  # the second evaluation too: not cached as a mod the lens can skip
        golden = evaluate_score(third_of_float32, SCORES, *GRID, traced_dtype=traced)
        assert golden.dtype == torch.float64 and torch.equal(golden, SCORES / 3)
    if traced in SIXTEEN_BITS:  # the baseline's own lens: float32 scores that read 16-bit
        baseline = evaluate_score(third_of_float32, SCORES.float(), *GRID, traced_dtype=traced)
        assert torch.equal(baseline, SCORES.float() / 3)
        # ... which must not let the golden skip its lens thereafter (it rounded again)
        golden = evaluate_score(third_of_float32, SCORES, *GRID, traced_dtype=traced)
        assert golden.dtype == torch.float64 and torch.equal(golden, SCORES / 3)


def test_float32_values_made_from_the_score_stay_float64_in_the_golden():
    table32 = torch.linspace(-1, 1, 4, dtype=torch.float32)
    kv = GRID[3].view(1, 1, 1, -1)

    def round_trip(s, b, h, q_idx, kv_idx):  # exact in flex_attention's float32
        return s.double().float() / 3

    def lerped(s, b, h, q_idx, kv_idx):  # lerp takes one dtype: float64 beside float32 raised
        return torch.lerp(s.float(), table32[kv_idx], 0.25)

    def named_bfloat16(s, b, h, q_idx, kv_idx):  # a 16-bit conversion by its type name
        return s.type("torch.BFloat16Tensor") / 3

    def float32_constant(s, b, h, q_idx, kv_idx):  # the constant as named: float32's 0.1
        return s + torch.full_like(s, 0.1, dtype=torch.float32) * kv_idx

    constant = torch.tensor(0.1, dtype=torch.float32).double()
    for traced in (torch.float32, torch.bfloat16):
        assert torch.equal(evaluate_score(round_trip, SCORES, *GRID, traced_dtype=traced),
                           SCORES / 3)
        assert torch.equal(evaluate_score(named_bfloat16, SCORES, *GRID, traced_dtype=traced),
                           SCORES / 3)
        assert torch.equal(evaluate_score(lerped, SCORES, *GRID, traced_dtype=traced),
                           torch.lerp(SCORES, table32.double()[kv], 0.25))
        assert torch.equal(evaluate_score(float32_constant, SCORES, *GRID, traced_dtype=traced),
                           SCORES + constant * kv)


def test_an_operation_the_trace_refuses_is_refused_in_the_golden_too():
    table32 = torch.linspace(-1, 1, 4, dtype=torch.float32)

    def lerped(s, b, h, q_idx, kv_idx):  # bfloat16 beside float32: flex_attention raises
        return torch.lerp(s * 2, table32[kv_idx], 0.25)

    with pytest.raises(PointwiseModError, match="lerp|dtype"):
        check_mods(None, lerped, "lerped", traced_dtype=torch.bfloat16)
    check_mods(None, lerped, "lerped", traced_dtype=torch.float32)  # float32 beside float32


def test_in_place_is_told_from_its_name():
    assert score_dtype._in_place(torch.Tensor.add_, {})
    assert score_dtype._in_place(torch.ops.aten.add_.Tensor, {})
    assert score_dtype._in_place(torch.Tensor.__iadd__, {})
    assert score_dtype._in_place(torch.add, {"out": None})
    assert score_dtype._in_place(torch.nn.functional.relu, {"inplace": True})
    assert not score_dtype._in_place(torch.Tensor.__getitem__, {})
    assert not score_dtype._in_place(torch.ops.aten.add.Tensor, {})


@pytest.mark.parametrize("traced", [torch.float32, torch.bfloat16])
def test_a_conversion_that_eager_copies_leaves_the_score_alone(traced):
    def doubled_copies(s, b, h, q_idx, kv_idx):  # eager: float32 scores, new tensors
        return s + s.double().mul_(2) + s.bfloat16().mul_(2)

    def doubled_copy(s, b, h, q_idx, kv_idx):  # no 16 bits: the copy alone keeps the lens
        return s + s.double().mul_(2)

    for _ in range(2):  # not cached as a mod the lens may skip (it would alias the score)
        golden = evaluate_score(doubled_copies, SCORES.clone(), *GRID, traced_dtype=traced)
        assert torch.equal(golden, SCORES + 2 * SCORES + 2 * SCORES)
        golden = evaluate_score(doubled_copy, SCORES.clone(), *GRID, traced_dtype=traced)
        assert torch.equal(golden, SCORES + 2 * SCORES)


@pytest.mark.parametrize("traced", [torch.bfloat16, torch.float16])
def test_a_conversion_that_names_16_bits_is_a_new_tensor_in_a_16_bit_case_too(traced):
    # eager's scores are float32 when it runs: .bfloat16() in a bfloat16 case makes a new one
    name = {torch.bfloat16: "torch.BFloat16Tensor", torch.float16: "torch.HalfTensor"}[traced]
    table = torch.zeros(4, dtype=traced)  # a captured 16-bit table
    convert = {"named": lambda s: s.to(traced), "method": lambda s: s.type(name),
               "type_as": lambda s: s.type_as(table)}
    for form, conversion in convert.items():
        def doubled_copy(s, b, h, q_idx, kv_idx):
            return s + conversion(s).mul_(2)

        golden = evaluate_score(doubled_copy, SCORES.clone(), *GRID, traced_dtype=traced)
        assert torch.equal(golden, 3 * SCORES), form


def _to_the_device_doubled(s, b, h, q_idx, kv_idx):  # eager: .to(device) is the score itself
    return s + s.to(s.device).mul_(2)


def _like_itself_doubled(s, b, h, q_idx, kv_idx):  # eager: float32 like float32, itself
    return s + s.type_as(s * 1).mul_(2)


def test_a_conversion_that_eager_does_not_copy_aliases_in_every_order_of_cases():
    # a bfloat16 case after a float32 one, with one function object (a module-level mod)
    for traced in (torch.float32, torch.bfloat16, torch.float32):
        for doubled in (_to_the_device_doubled, _like_itself_doubled):
            golden = evaluate_score(doubled, SCORES.clone(), *GRID, traced_dtype=traced)
            assert torch.equal(golden, 4 * SCORES), (doubled.__name__, traced)


@pytest.mark.parametrize("traced", [torch.float32, torch.bfloat16])
def test_a_conversion_in_place_changes_the_score_as_in_eager(traced):
    # eager flex_attention's float32 score.float() is the score itself, so clamp_ clamps both
    def clamped_twice(s, b, h, q_idx, kv_idx):
        converted = s.float()
        converted.clamp_(-0.5, 0.5)
        return s + converted

    golden = evaluate_score(clamped_twice, SCORES.clone(), *GRID, traced_dtype=traced)
    assert torch.equal(golden, 2 * SCORES.clamp(-0.5, 0.5))


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_gemmas_float32_soft_cap_has_the_golden_of_the_same_cap_without_the_conversion(dtype):
    """Output, lse and gradients (computed after the baseline, which runs the same mod)."""
    case = Case(Variant("full"), Shape(B=1, Hq=2, Hkv=2, Sq=64, Skv=64, D=32), dtype, "fwd+bwd",
                input_scale=4)
    inputs, grad_out = make_inputs(case, 0), make_grad_output(case, 0)
    converted, _ = golden_and_baseline(case, inputs, Mods(
        None, lambda s, b, h, q, k: torch.tanh(s.float() / 10) * 10), grad_out)
    plain, _ = golden_and_baseline(case, inputs,
                                   Mods(None, lambda s, b, h, q, k: torch.tanh(s / 10) * 10),
                                   grad_out)
    assert torch.equal(converted.out, plain.out) and torch.equal(converted.lse, plain.lse)
    assert converted.grads.keys() == plain.grads.keys() == {"dq", "dk", "dv"}
    for name, grad in plain.grads.items():
        assert torch.equal(converted.grads[name], grad), name


def _shared_constant_slope(s, b, h, q_idx, kv_idx):
    return s + s.new_tensor(0.3) * (kv_idx - q_idx)


def test_a_mod_that_makes_a_constant_in_the_score_dtype_is_not_cached_as_untouched():
    # one function object for every case, evaluated first by a float32 case's golden (no
    # 16-bit value touched): it must still make bfloat16's constant in a bfloat16 case
    evaluate_score(_shared_constant_slope, SCORES, *GRID, traced_dtype=torch.float32)
    golden = evaluate_score(_shared_constant_slope, SCORES, *GRID, traced_dtype=torch.bfloat16)
    distance = (GRID[3].view(1, 1, 1, -1) - GRID[2].view(1, 1, -1, 1)).double()
    constant = torch.tensor(0.3, dtype=torch.bfloat16).double()
    assert torch.equal(golden, SCORES + constant * distance)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_a_mod_autograd_cannot_run_back_through_is_judged_with_its_slope_from_a_difference(dtype):
    """Rows of -1e4 make 16-bit cases size float32's roundings, which need the mod's slope;
    autograd refuses this in-place mod (it was a HARNESS_ERROR in float32 before)."""
    case = Case(dv.inplace_softcap_padded(), Shape.parse("b1-h2x2-s128x128-d32"), dtype,
                "fwd+lse")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    assert golden.row_noise is not None  # the float32 roundings were sized
    mods = build_mods(case.variant, case.shape)
    assert judge(case, golden, baseline, _flex(case, inputs, mods.score_mod)).passed
    wrong_cap = lambda s, b, h, q, k: (torch.tanh(s / 25.0) * 25.0  # noqa: E731
                                       + torch.where(q >= 96, -1e4, 0.0))
    assert not judge(case, golden, baseline, _flex(case, inputs, wrong_cap)).passed


def test_a_mod_that_changes_its_score_in_place_is_judged_with_its_exact_slope():
    """``score.mul_(2)``: autograd refuses it on its leaf; the golden's slope is taken through
    a copy (was a HARNESS_ERROR in float32 cases)."""
    case = Case(dv.doubled_in_place(), Shape.parse("b1-h2x2-s128x128-d32"), "fp32", "fwd+lse")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    mods = build_mods(case.variant, case.shape)
    slopes = [t.slope for t in pair_terms(case, inputs, mods, golden.out, golden.lse)]
    assert slopes and all(torch.all(slope == 2.0) for slope in slopes)
    assert judge(case, golden, baseline, _flex(case, inputs, mods.score_mod)).passed
    off_by_half_a_percent = lambda s, b, h, q, k: s * 2.01  # noqa: E731
    assert not judge(case, golden, baseline, _flex(case, inputs, off_by_half_a_percent)).passed


@pytest.mark.parametrize("traced", [torch.bfloat16, torch.float16, torch.float32])
def test_a_fill_from_the_score_dtype_is_a_mod_in_every_case_dtype(traced):
    case = _case("pad_add_dtypemin", "bf16")
    mods = build_mods(case.variant, case.shape)
    check_mods(None, mods.score_mod, "pad_add_dtypemin", "cpu", traced)
    # read as float64, its min does not fit the float32 of torch.where(cond, min, 0.0)
    with pytest.raises(PointwiseModError, match="cannot be converted"):
        check_mods(None, mods.score_mod, "pad_add_dtypemin", "cpu", None)


@pytest.mark.slow
def test_cpu_eager_passes_the_mods_that_read_the_score_dtype_on_two_seeds():
    # Not the lse of a mod that returns a 16-bit score: eager then runs its softmax in 16 bits
    # (docs/findings.md, finding 6), tested below with a float32 softmax instead
    cases = [c for c in CASES
             if not (c.mode == "fwd+lse" and c.variant.param("kind") in dv.RETURNS_SCORE_DTYPE
                     and c.dtype != "fp32")]
    records = execute("cpu-eager", cases, seeds=range(2), cases_modules=MODULES)
    assert len(records) == 2 * len(cases) == 40
    failed = [(r.case_id, r.label, r.message) for r in records if r.label is not Label.PASS]
    assert not failed, failed


def _verdicts(case, score_mod, seeds=range(3)):
    """The verdict on eager flex_attention running ``score_mod`` for ``case``, seed by seed."""
    for seed in seeds:
        inputs = make_inputs(case, seed)
        golden, baseline = reference_pair(case, inputs)
        observed = _flex(case, inputs, score_mod)
        assert observed.lse.dtype == torch.float32  # a float32 softmax (finding 6 aside)
        yield seed, judge(case, golden, baseline, observed)


@pytest.mark.parametrize("kind", dv.RETURNS_SCORE_DTYPE)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_float32_softmax_of_the_traced_mod_passes_on_three_seeds(kind, dtype):
    case = _case(kind, dtype)
    mods = build_mods(case.variant, case.shape)
    for seed, verdict in _verdicts(case, lambda *point: mods.score_mod(*point).float()):
        assert verdict.passed, (seed, verdict.summary)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_soft_cap_without_its_rounding_passes_as_compiled_flex_attention_runs_it(dtype):
    # Inductor does not emulate the cast to 16 bits (cases/score_dtype.py)
    unrounded = lambda s, b, h, q, k: torch.tanh(s.float() / 20.0) * 20.0  # noqa: E731
    for seed, verdict in _verdicts(_case("softcap_to_dtype", dtype), unrounded):
        assert verdict.passed, (seed, verdict.summary)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_soft_cap_with_another_cap_is_caught(dtype):
    another_cap = lambda s, b, h, q, k: torch.tanh(s.float() / 25.0) * 25.0  # noqa: E731
    for seed, verdict in _verdicts(_case("softcap_to_dtype", dtype), another_cap):
        assert not verdict.passed, seed


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_slope_from_float64s_eps_is_caught(dtype):
    # a backend that reads the score's dtype as float64: eps 2.2e-16, no slope at all
    case = _case("eps_slope", dtype, "fwd")
    inputs = make_inputs(case, 0)
    golden, baseline = reference_pair(case, inputs)
    observed = _flex(case, inputs, lambda s, b, h, q, k: s + 2.0 ** -52 * (k - q))
    verdict = judge(case, golden, baseline, Reference(observed.out))
    assert not verdict.passed


def test_an_lse_rounded_to_16_bits_fails_and_says_so():
    case = _case("softcap_to_dtype", "bf16")
    golden, baseline = reference_pair(case, make_inputs(case, 0))
    out = golden.out.to(torch.bfloat16)
    assert judge(case, golden, baseline, Reference(out, golden.lse.float())).passed
    verdict = judge(case, golden, baseline, Reference(out, golden.lse.to(torch.bfloat16)))
    assert not verdict.passed
    assert "the lse came back as bfloat16" in verdict.summary


def test_mods_that_read_no_dtype_have_the_same_golden_with_the_lens_or_without(monkeypatch):
    first_of = {}
    for case in core_matrix("smoke"):
        if case.variant.name in ("alibi", "softcap") and case.dtype == "bf16":
            first_of.setdefault(case.variant.name, case)
    picked = list(first_of.values())
    assert len(picked) == 2
    with_lens = [reference_pair(c, make_inputs(c, 0))[0] for c in picked]

    def without_lens(score_mod, traced_dtype, score_dtype):
        return contextlib.nullcontext(), score_mod
    monkeypatch.setattr(pointwise, "with_traced_dtype", without_lens)
    monkeypatch.setattr(score_addend, "with_traced_dtype", without_lens)
    for case, golden in zip(picked, with_lens):
        again = reference_pair(case, make_inputs(case, 0))[0]
        assert torch.equal(golden.out, again.out), case.id
