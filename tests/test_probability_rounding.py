"""The rounding of P for the P V product in 16-bit forwards (reference/probability_rounding.py):
its size is what rounding P at a kernel's scale moves each output row by; correct kernels that
round P at other scales than the baseline pass where rows are held by a few keys, and kernels
that keep fewer bits of P than the dtype are still caught."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from cases import variants
from cases.composed import variant_from_token
from cases.inputs import make_inputs, torch_dtype
from cases.model import Case, Shape
from cases.variants import build_mods
from reference.golden import Reference, reference_pair
from reference.kernel import chunked_attention
from reference.pair_terms import pair_terms
from reference.probability_rounding import P_DRAWS_COVERED
from reference.row_noise import float32_rounding_magnitudes
from reference.verdict import judge
from tests.fa_style_backward import block_mask_of

#: ``scale2`` at D 8 with 31 keys: most rows are held by two to five keys (as in the fuzzed
#: case eager failed, docs/oracle.md), and the scores are q k^T * 2 / sqrt(8), easy to write.
_SCALED = "composed-scale2"
_SHAPE = "b2-h4x1-s257x31-d8"


def _case(dtype: str) -> Case:
    return Case(variant_from_token(_SCALED), Shape.parse(_SHAPE), dtype, mode="fwd")


def _probabilities(case: Case, inputs) -> torch.Tensor:
    """[B, Hq, Sq, Skv] float64: softmax(2 q k^T / sqrt(D)), the one key/value head shared."""
    q, k = inputs.q.double(), inputs.k.double()
    return torch.softmax(q @ k.transpose(-1, -2) * (2.0 / math.sqrt(case.shape.D)), dim=-1)


def _round_short(values: torch.Tensor, dtype: torch.dtype, bits_short: int) -> torch.Tensor:
    """``values`` rounded to nearest with ``bits_short`` fewer significand bits than ``dtype``
    (0: the dtype itself); normal numbers only, as P is here."""
    if bits_short == 0:
        return values.to(dtype).double()
    mantissa, exponent = torch.frexp(values)
    step = torch.finfo(dtype).eps / 2 * 2.0 ** bits_short  # for mantissas in [1/2, 1)
    return torch.ldexp(torch.round(mantissa / step) * step, exponent)


def _kernel_output(case: Case, inputs, probs: torch.Tensor, generator: torch.Generator,
                   bits_short: int = 0) -> torch.Tensor:
    """A kernel that rounds P at its own scale c per row (as FlashAttention rounds exp(s - m)
    at its running maximum: c in [1, 2) drawn per row), to the case dtype or ``bits_short``
    bits less, takes the normalizer unrounded, sums P V exactly and rounds O to the dtype."""
    dtype = torch_dtype(case.dtype)
    scales = 1.0 + torch.rand(*probs.shape[:-1], 1, generator=generator, dtype=torch.float64)
    rounded = _round_short(probs * scales, dtype, bits_short) / scales
    return (rounded @ inputs.v.double()).to(dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_size_is_two_rms_of_rounding_a_rows_largest_term_at_any_scale(dtype):
    """The size over P_DRAWS_COVERED against the RMS over 48 draws of the rounding scale of
    what rounding the row's largest term P_ij V_j alone moves the row by: the model's u /
    sqrt(3) relative RMS bounds a rounding at any scale (a scale uniform in log gives about
    0.74 of it), so no row's measured RMS is above it, and the median row's is near 0.74. A
    size twice too small or too large fails."""
    case = _case(dtype)
    inputs = make_inputs(case, 7)
    golden, _ = reference_pair(case, inputs)
    unit = torch.finfo(torch_dtype(dtype)).eps / 2
    model = golden.row_only_noise["out"].double() * unit / P_DRAWS_COVERED  # one RMS, per row
    probs, values = _probabilities(case, inputs), inputs.v.double()
    rms_v = values.square().mean(-1).sqrt()  # [B, 1, Skv]
    largest = (probs * rms_v.unsqueeze(-2)).argmax(-1, keepdim=True)  # [B, Hq, Sq, 1]
    generator = torch.Generator().manual_seed(3)
    squares = torch.zeros_like(model)
    draws = 48
    for _ in range(draws):
        scales = torch.exp2(torch.rand(*probs.shape[:-1], 1, generator=generator,
                                       dtype=torch.float64))
        p = probs.gather(-1, largest)
        moved = (_round_short(p * scales, torch_dtype(dtype), 0) / scales - p)
        shift = torch.zeros_like(probs).scatter_(-1, largest, moved)
        squares += (shift @ values).square().mean(-1)
    ratio = (squares / draws).sqrt() / model
    assert float(ratio.max()) < 1.0
    assert 0.6 < float(ratio.median()) < 0.9


def _judged_kernel(dtype: str, seed: int, bits_short: int = 0):
    """The golden, the baseline and _kernel_output's (its scales drawn from ``seed``)."""
    case = _case(dtype)
    inputs = make_inputs(case, seed)
    golden, baseline = reference_pair(case, inputs)
    observed = _kernel_output(case, inputs, _probabilities(case, inputs),
                              torch.Generator().manual_seed(seed), bits_short)
    return case, golden, baseline, Reference(observed)


#: Of seeds 0-299 per dtype, those where the kernel that rounds P at its own scale failed the
#: row rule before its rounding was sized (1.06x; 1.15x and 1.02x); 0.53-0.71 now, and 0.71
#: the worst of all 300 in fp16 (0.61 in bf16).
_FAILED_BEFORE = [("bf16", 12), ("fp16", 226), ("fp16", 261)]


@pytest.mark.parametrize("dtype, seed", _FAILED_BEFORE)
def test_a_kernel_that_rounds_p_at_another_scale_passes_where_it_failed(dtype, seed):
    case, golden, baseline, observed = _judged_kernel(dtype, seed)
    verdict = judge(case, golden, baseline, observed)
    assert verdict.passed, verdict.summary
    assert verdict.metrics["worst_row_margin"] < 0.75
    unsized = judge(case, replace(golden, row_only_noise=None), baseline, observed)
    assert not unsized.passed and unsized.metrics["failed_rules"] == ["row"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_kernels_that_round_p_at_other_scales_pass_on_every_seed(dtype):
    """12 more seeds of that correct kernel (neither the baseline nor eager)."""
    for seed in range(12):
        case, golden, baseline, observed = _judged_kernel(dtype, seed)
        verdict = judge(case, golden, baseline, observed)
        assert verdict.passed, (seed, verdict.summary)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_kernels_that_keep_two_bits_less_of_p_are_caught_on_every_seed(dtype):
    """P rounded with two significand bits fewer than the dtype (4x the rounding) fails the row
    rule on 6 of 6 seeds, where the size allows 2 RMS of the dtype's own rounding."""
    for seed in range(6):
        case, golden, baseline, observed = _judged_kernel(dtype, seed, bits_short=2)
        verdict = judge(case, golden, baseline, observed)
        assert not verdict.passed and "row" in verdict.metrics["failed_rules"], seed


def test_float32_outputs_carry_no_size_of_it():
    """A float32 kernel multiplies P unrounded: a float32 output's rows carry a float32
    kernel's own roundings and nothing more; a bfloat16 output's carry this size."""
    case = _case("fp32")
    inputs = make_inputs(case, 1)
    golden, _ = reference_pair(case, inputs)
    own = float32_rounding_magnitudes(case, inputs, build_mods(case.variant, case.shape),
                                      golden.out, golden.lse)["out"]
    assert torch.equal(golden.row_noise["out"], own)
    bf16_golden, _ = reference_pair(_case("bf16"), make_inputs(_case("bf16"), 1))
    assert not golden.row_only_noise
    assert bool((bf16_golden.row_only_noise["out"] > 0).all())


@pytest.mark.parametrize("token, shape", [
    ("composed-and.causal0-not.prefix40-alibi8", "b2-h4x2-s96x80-d16"),  # rows 0-39: no key
    ("composed-win5-scale4-cap20", "b1-h2x1-s200x200-d8"),
    ("composed-prefix1000-bias1", "b2-h4x4-s33x300-d32"),  # Bkv = B, every key seen
])
def test_the_goldens_largest_terms_are_those_of_its_pair_terms(token, shape):
    """The golden's pass writes max_j P_ij^2 ms(V_j) per row (reference/kernel.py); the same
    from the pair terms (reference/pair_terms.py: P from the stored lse, every pair masked,
    dead or alive written out) agrees to float64 rounding, fully masked rows at 0."""
    case = Case(variant_from_token(token), Shape.parse(shape), "bf16", mode="fwd")
    inputs = make_inputs(case, 2)
    mods = build_mods(case.variant, case.shape)
    largest = torch.full((case.shape.B, case.shape.Hq, case.shape.Sq), -1.0,
                         dtype=torch.float64)
    out, lse = chunked_attention(case, inputs, mods, torch.float64, largest_pv_terms=largest)
    want = torch.zeros_like(largest)
    group = case.shape.Hq // case.shape.Hkv
    for t in pair_terms(case, inputs, mods, out, lse):
        ms_v = t.v.square().mean(-1).repeat_interleave(group, 0).unsqueeze(1)  # [Hq, 1, m]
        want[t.b, :, t.rows] = (t.probs.square() * ms_v).amax(-1)
    torch.testing.assert_close(largest, want, rtol=1e-10, atol=0.0)
    assert bool((largest == 0).any()) == token.startswith("composed-and")


@pytest.mark.parametrize("seed", range(4))
def test_a_float16_kernel_that_rounds_p_to_bfloat16_is_caught_when_decoding(seed):
    """One query row per head (decoding), a prefix of 3 keys: P rounded to bfloat16 in a
    float16 case (a P cast to the wrong 16-bit dtype) fails, as before P's rounding was
    sized: the row rule alone carries the size, and a head of one row is judged by the head
    rule's own floor (an outside review: with the size in the head rule too, 3 of these 4
    seeds passed)."""
    case = Case(variant_from_token("composed-prefix3"), Shape.parse("b4-h8x2-s1x200-d8"),
                "fp16", mode="fwd")
    inputs = make_inputs(case, seed)
    golden, baseline = reference_pair(case, inputs)
    out, _ = chunked_attention(case, inputs, build_mods(case.variant, case.shape),
                               torch.float32, probs_dtype=torch.bfloat16)
    verdict = judge(case, golden, baseline, Reference(out.to(torch.float16)))
    assert not verdict.passed


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("variant", ["alibi", "document"])
def test_rows_of_many_keys_one_and_a_half_percent_off_are_caught(variant):
    """The size joins the row rule in quadrature with 4 times the baseline's row error, which
    is a stable draw where many keys hold a row: eager's correct bfloat16 output passes, and
    of 40 of its rows (5 per head) scaled by 1.015, 40 fail (ALiBi) and 38 (document, whose
    first rows see a few keys). Added on top of it, the size let 22 and 23 of them pass."""
    case = Case(getattr(variants, variant)(), Shape.parse("b1-h8x8-s256x256-d128"), "bf16",
                mode="fwd")
    inputs = make_inputs(case, 5)
    golden, baseline = reference_pair(case, inputs)
    out = flex_attention(inputs.q, inputs.k, inputs.v,
                         score_mod=build_mods(case.variant, case.shape).score_mod,
                         block_mask=block_mask_of(case))
    assert judge(case, golden, baseline, out).metrics["failing_rows"] == 0
    rows = torch.randperm(256, generator=torch.Generator().manual_seed(1))[:40]
    faulty = out.clone()
    for h in range(8):
        picked = rows[5 * h:5 * h + 5]
        faulty[0, h, picked] = (out[0, h, picked].double() * 1.015).to(out.dtype)
    assert judge(case, golden, baseline, faulty).metrics["failing_rows"] >= 36
