"""The float64 golden agrees with SDPA on independent dense masks and with eager
flex_attention in float64; it is exact about masking, GQA, broadcast and chunking."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import reference.chunks as chunks_module
import reference.kernel as kernel_module
from cases import variants as v
from cases.inputs import Inputs, make_inputs, torch_dtype
from cases.model import Case, Shape
from cases.pointwise import evaluate_mask, evaluate_score
from cases.variants import Mods, build_mods
from conformance import compat
from reference.golden import baseline_attention, chunked_attention, golden_attention
from tests.dense_reference import dense_attention, dense_mask, dense_score_transform


def small_variants(seq: int) -> list:
    return [v.full(), v.causal(), v.sliding_window(max(1, seq // 3)), v.prefix_lm(seq // 4),
            v.document(), v.alibi(), v.softcap(5.0), v.rel_bias(8)]


def sdpa_dense(case: Case, inputs: Inputs) -> torch.Tensor:
    """SDPA in float64 with the independent dense mask and bias as an additive float mask."""
    s = case.shape
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    group = s.Hq // s.Hkv
    k = k.repeat_interleave(group, 1).expand(s.B, -1, -1, -1)
    vv = vv.repeat_interleave(group, 1).expand(s.B, -1, -1, -1)
    zero = np.zeros((s.Hq, s.Sq, s.Skv))
    bias = torch.from_numpy(dense_score_transform(case, zero))
    mask = torch.from_numpy(dense_mask(case))
    attn_bias = torch.where(mask, bias, torch.tensor(-math.inf, dtype=torch.float64))
    if case.variant.name == "softcap":  # a non-additive score mod: apply it to full scores
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(s.D)
        scores = torch.from_numpy(dense_score_transform(case, scores.numpy()))
        scores = scores.masked_fill(~mask, -math.inf)
        return torch.softmax(scores, -1) @ vv
    return torch.nn.functional.scaled_dot_product_attention(q, k, vv, attn_mask=attn_bias)


shapes = st.builds(
    lambda b, hkv, group, s, d, bkv1: Shape(b, hkv * group, hkv, s, s, d, 1 if bkv1 else b),
    st.integers(1, 2), st.integers(1, 2), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 7, 64, 100, 129, 200]), st.sampled_from([8, 17, 64]), st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, index=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_golden_matches_sdpa_with_independent_dense_mask(shape, index, seed):
    case = Case(small_variants(shape.Sq)[index], shape, "fp32")
    inputs = make_inputs(case, seed)
    got = golden_attention(case, inputs).out
    want = sdpa_dense(case, inputs)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(shape=shapes, index=st.integers(0, 7), seed=st.integers(0, 2**16))
def test_golden_matches_eager_flex_attention_in_float64(shape, index, seed):
    case = Case(small_variants(shape.Sq)[index], shape, "bf16")
    inputs = make_inputs(case, seed)
    mods = build_mods(case.variant, shape)
    block_mask = None
    if mods.mask_mod is not None:
        block_mask = create_block_mask(mods.mask_mod, None, None, shape.Sq, shape.Skv, "cpu")
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    if shape.Bkv != shape.B:
        k, vv = k.expand(shape.B, -1, -1, -1), vv.expand(shape.B, -1, -1, -1)
    want, want_lse = compat.attention(flex_attention, q, k, vv, mods.score_mod, block_mask,
                                      enable_gqa=shape.Hq != shape.Hkv, return_lse=True)
    ref = golden_attention(case, inputs)
    torch.testing.assert_close(ref.out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref.lse, want_lse, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    case = Case(v.full(), Shape(1, 2, 2, 16, 16, 8), "fp32")
    inputs = make_inputs(case, 0)

    def rows_from_5_see_nothing(b, h, q_idx, kv_idx):
        return (q_idx < 5) & (kv_idx <= q_idx)

    for dtype in (torch.float64, torch.float32):  # the golden and the baseline (its flush)
        out, lse = chunked_attention(case, inputs, Mods(rows_from_5_see_nothing, None), dtype)
        assert torch.all(out[:, :, 5:] == 0)
        assert torch.all(lse[:, :, 5:] == -math.inf)
        assert torch.all(torch.isfinite(lse[:, :, :5]))
        assert torch.allclose(out[0, :, 0], inputs.v[0, :, 0].to(dtype))  # row 0: key 0 only


def test_gqa_maps_query_head_to_kv_head_by_integer_division():
    case = Case(v.causal(), Shape(1, 4, 2, 32, 32, 16), "fp32")
    inputs = make_inputs(case, 1)
    out = golden_attention(case, inputs).out
    for h in range(4):
        single = Inputs(inputs.q[:, h:h + 1], inputs.k[:, h // 2:h // 2 + 1],
                        inputs.v[:, h // 2:h // 2 + 1])
        one = Case(v.causal(), Shape(1, 1, 1, 32, 32, 16), "fp32")
        torch.testing.assert_close(out[:, h:h + 1], golden_attention(one, single).out,
                                   rtol=0, atol=1e-14)


def _assert_equals_dense(case: Case, inputs: Inputs, mods: Mods, mask=None) -> None:
    got_out, got_lse = chunked_attention(case, inputs, mods, torch.float64)
    q, k, vv = (t.double().numpy() for t in (inputs.q, inputs.k, inputs.v))
    want_out, want_lse = dense_attention(case, q, k, vv, mask)
    torch.testing.assert_close(got_out, torch.from_numpy(want_out), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(got_lse, torch.from_numpy(want_lse), rtol=1e-12, atol=1e-13)


def test_the_golden_gets_the_normalizer_from_a_column_of_ones_in_its_p_v_product():
    """The golden's V carries a column of ones and zero columns up to a multiple of
    _PV_COLUMN_MULTIPLE; the output is still exactly V's width, and equals a dense
    float64 evaluation at every head size tried here."""
    for d in (1, 8, 23, 64, 71):
        values = torch.randn(2, 5, d)
        v_ones = chunks_module._with_ones_column(values, torch.float64)
        assert v_ones.dtype == torch.float64 and torch.equal(v_ones[..., :d], values.double())
        assert v_ones.shape[-1] % chunks_module._PV_COLUMN_MULTIPLE == 0
        assert v_ones.shape[-1] >= d + 1
        assert torch.all(v_ones[..., d] == 1) and torch.all(v_ones[..., d + 1:] == 0)
        case = Case(v.causal(), Shape(1, 2, 2, 40, 40, d), "fp32")
        inputs = make_inputs(case, d)
        got = golden_attention(case, inputs)
        assert got.out.shape == (1, 2, 40, d)
        _assert_equals_dense(case, inputs, build_mods(case.variant, case.shape))


def test_reference_never_calls_flex_attention_or_sdpa(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the reference must be independent of flex_attention and SDPA")

    import torch.nn.attention.flex_attention as flex_module
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", forbidden)
    monkeypatch.setattr(flex_module, "flex_attention", forbidden)
    monkeypatch.setattr(torch.ops.higher_order, "flex_attention", forbidden, raising=False)
    case = Case(v.alibi(), Shape(1, 2, 2, 64, 64, 16), "bf16")
    inputs = make_inputs(case, 0)
    assert torch.isfinite(golden_attention(case, inputs).out).all()
    assert torch.isfinite(baseline_attention(case, inputs).float()).all()


def test_baseline_is_in_the_case_dtype_and_close_to_golden():
    case = Case(v.causal(), Shape(1, 2, 2, 128, 128, 64), "bf16")
    inputs = make_inputs(case, 0)
    base = baseline_attention(case, inputs)
    assert base.dtype == torch.bfloat16
    err = (base.double() - golden_attention(case, inputs).out).abs().max()
    assert 0 < err < 2 ** -6  # a bf16 result: not exact, but within a few ulps


def test_inputs_are_deterministic_and_depend_on_id_and_seed():
    case = Case(v.causal(), Shape(1, 2, 2, 16, 16, 8), "bf16")
    a, b, c = make_inputs(case, 0), make_inputs(case, 0), make_inputs(case, 1)
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v)
    assert not torch.equal(a.q, c.q)
    other = Case(v.full(), case.shape, "bf16")
    assert not torch.equal(make_inputs(other, 0).q, a.q)
    assert a.q.dtype == torch.bfloat16


def test_masks_that_ignore_kv_idx_or_return_a_constant_cover_every_key():
    """A mask of q_idx (or h) alone, or a plain bool, must hide or show whole rows."""
    case = Case(v.full(), Shape(2, 2, 2, 64, 64, 16), "fp32")
    inputs = make_inputs(case, 0)
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    masks = {
        "rows_below_40": lambda b, h, q_idx, kv_idx: q_idx < 40,
        "head_0_only": lambda b, h, q_idx, kv_idx: h == 0,
        "constant": lambda b, h, q_idx, kv_idx: torch.tensor(True),
    }
    for name, mask_mod in masks.items():
        got, got_lse = chunked_attention(case, inputs, Mods(mask_mod, None), torch.float64)
        block_mask = create_block_mask(mask_mod, 2, 2, 64, 64, "cpu")
        want, want_lse = compat.attention(flex_attention, q, k, vv, block_mask=block_mask,
                                          return_lse=True)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
        torch.testing.assert_close(got_lse, want_lse, rtol=1e-12, atol=1e-12, msg=name)


_HEAP_PROBE = """
import ctypes, sys, torch
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    from reference.heap import keep_freed_heap
    assert keep_freed_heap()
before = libc.mallinfo2()
blocks = [torch.empty(3 * 1024 * 1024, dtype=torch.float64).fill_(1.0) for _ in range(3)]
held = libc.mallinfo2()
del blocks
freed = libc.mallinfo2()
print((held.hblkhd - before.hblkhd) >> 20, (freed.arena - before.arena) >> 20)
"""


def _glibc_version() -> tuple[int, ...]:
    """(major, minor) of this process's glibc; () elsewhere."""
    name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    return tuple(int(part) for part in version.split(".")[:2]) if name == "glibc" else ()


@pytest.mark.skipif(_glibc_version() < (2, 33), reason="glibc's malloc, mallinfo2 (2.33+)")
def test_the_golden_keeps_freed_chunk_memory_in_its_heap_for_the_next_chunk():
    """Three chunk-sized blocks (24 MiB each), held then freed: by default glibc serves them
    with mmap and gives them back on free (the next chunk page-faults them in again); after
    keep_freed_heap they come from the heap, which keeps them when they are freed."""
    import subprocess
    import sys

    def probe(mode: str) -> tuple[int, int]:
        """(MiB the blocks took from mmap, MiB the heap grew by and kept after the free)"""
        out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True,
                             text=True, check=True, cwd=str(Path(__file__).parents[1])).stdout
        mmapped_mb, heap_kept_mb = map(int, out.split())
        return mmapped_mb, heap_kept_mb

    mmapped, heap_kept = probe("default")
    assert mmapped >= 72 and heap_kept < 24
    mmapped, heap_kept = probe("keep")
    assert mmapped < 24 and heap_kept >= 48  # most of the 72 MiB (some fit in free heap)


def _fused_kernel_rounding(case: Case, inputs: Inputs) -> torch.Tensor:
    """The baseline's rounding model written out head by head on whole rows: float32 scores
    scaled after the product, the score mod, -inf where masked, exp(s - rowmax) in float32, the
    row sums before rounding, the probabilities rounded to the case dtype for P V, the output
    divided after the product and rounded to the dtype."""
    s = case.shape
    dtype = torch_dtype(case.dtype)
    mods = build_mods(case.variant, s)
    rows, cols = torch.arange(s.Sq), torch.arange(s.Skv)
    out = torch.empty(s.B, s.Hq, s.Sq, s.D, dtype=dtype)
    for b in range(s.B):
        for h in range(s.Hq):
            kb, kh = (b if s.Bkv == s.B else 0), h // (s.Hq // s.Hkv)
            q, k, vv = (t.float() for t in (inputs.q[b, h], inputs.k[kb, kh], inputs.v[kb, kh]))
            at = (torch.tensor([b]), torch.tensor([h]), rows, cols)
            scores = (q @ k.T) * (1.0 / math.sqrt(s.D))
            if mods.score_mod is not None:
                scores = evaluate_score(mods.score_mod, scores[None, None], *at)[0, 0].float()
            if mods.mask_mod is not None:
                scores = scores.masked_fill(~evaluate_mask(mods.mask_mod, *at)[0, 0], -math.inf)
            shift = torch.nan_to_num(scores.amax(-1, keepdim=True), neginf=0.0)
            probs = (scores - shift).exp()
            denom = probs.sum(-1, keepdim=True)
            out[b, h] = ((probs.to(dtype).float() @ vv) / denom.clamp_min(1.0)).to(dtype)
    return out


@pytest.mark.parametrize("variant", [v.full(), v.causal(), v.alibi(), v.softcap(5.0),
                                     v.document(), v.sliding_window(20)],
                         ids=lambda var: var.name)
def test_the_baseline_is_the_fused_kernels_rounding_bit_for_bit(variant):
    """The verdict's limits are calibrated on this baseline, so its rounding is pinned: exp,
    not exp2, and the scale applied to the float32 scores, not folded into q (either change
    moves bits here). One chunk of all keys per batch, and one head per key/value head, so both
    sides run products of the same sizes and the comparison can be exact (with grouped heads
    the baseline's products stack them, and float32 results differ in the last bit)."""
    for shape in (Shape(1, 2, 2, 64, 64, 16), Shape(2, 4, 4, 48, 48, 8),
                  Shape(1, 2, 2, 96, 96, 32)):
        for dtype in ("bf16", "fp16", "fp32"):
            case = Case(variant, shape, dtype)
            inputs = make_inputs(case, 1)
            mods = build_mods(variant, shape)
            chunks = list(chunks_module.query_chunks(case, inputs, mods, torch.float32))
            assert [c.keys for c in chunks] == [slice(0, shape.Skv)] * shape.B  # one each
            assert torch.equal(baseline_attention(case, inputs),
                               _fused_kernel_rounding(case, inputs)), (shape.token, dtype)


def test_the_baseline_flushes_no_output_bit_where_its_terms_underflow(monkeypatch):
    """ALiBi made steep (slopes 4 and 1/2): at S96 a row's distant terms fall through float32's
    subnormal range (e^-87 to e^-104) and below the baseline's flush floor (2^-100), yet the
    output is bit for bit the fused kernels' rounding model, which takes exp of every term."""
    monkeypatch.setattr(v, "alibi_slopes", lambda num_heads: [4.0, 0.5][:num_heads])
    shape = Shape(1, 2, 2, 96, 96, 32)
    for dtype in ("bf16", "fp16", "fp32"):
        case = Case(v.alibi(), shape, dtype)
        inputs = make_inputs(case, 2)
        assert torch.equal(baseline_attention(case, inputs),
                           _fused_kernel_rounding(case, inputs)), dtype


def test_terms_far_below_the_row_maximum_are_flushed_to_exact_zeros():
    """The golden's exp2 and the baseline's exp give 0 for terms below their floors (2^-600,
    2^-100 of the row's largest), where they would make subnormal numbers, and the true value
    above them; -inf gives 0 and NaN stays NaN."""
    exponents = torch.tensor([0.0, -1.5, -599.0, -600.5, -1030.0, -math.inf, math.nan],
                             dtype=torch.float64)
    assert 0 < torch.exp2(exponents[4]) < 2.0 ** -1022  # subnormal, without the flush
    flushed = kernel_module._exp2_flushed(exponents.clone())
    assert torch.equal(flushed[:3], torch.exp2(exponents[:3]))
    assert torch.equal(flushed[3:6], torch.zeros(3, dtype=torch.float64))
    assert flushed[6].isnan()
    shifted = torch.tensor([0.0, -1.5, -60.0, -69.5, -90.0, -math.inf, math.nan])
    assert 0 < torch.exp(shifted[4]) < 2.0 ** -126  # subnormal in float32
    flushed = kernel_module._exp_flushed(shifted.clone())
    assert torch.equal(flushed[:3], torch.exp(shifted[:3]))  # float32 exp, bit for bit
    assert torch.equal(flushed[3:6], torch.zeros(3))
    assert flushed[6].isnan()


def test_a_row_with_a_nan_score_stays_nan_and_the_others_match_a_dense_evaluation():
    """A steep additive bias (12 per key of distance, so the terms run from 1 through float64's
    subnormal range to 0) and one row whose score mod gives NaN: that row's output and lse are
    NaN in the golden and the baseline, as flex_attention's softmax makes them, and every other
    row equals a dense float64 evaluation that takes exp of every term."""
    case = Case(v.alibi(), Shape(1, 2, 2, 160, 160, 16), "fp32")
    inputs = make_inputs(case, 3)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def steep_with_a_nan_row(score, b, h, q_idx, kv_idx):
        steep = score + 12.0 * (kv_idx - q_idx)
        return torch.where(q_idx == 77, torch.full_like(steep, math.nan), steep)

    mods = Mods(causal, steep_with_a_nan_row)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    base, _ = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=torch.float32)
    assert out[0, :, 77].isnan().all() and lse[0, :, 77].isnan().all()
    assert base[0, :, 77].isnan().all()
    rows = torch.arange(160) != 77
    q, k, vv = (t[0].double() for t in (inputs.q, inputs.k, inputs.v))
    i, j = torch.arange(160)[:, None], torch.arange(160)[None, :]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(16) + 12.0 * (j - i)
    scores = scores.masked_fill(j > i, -math.inf)
    dense_lse = torch.logsumexp(scores, -1)
    dense = torch.exp(scores - dense_lse[..., None]) @ vv
    torch.testing.assert_close(out[0][:, rows], dense[:, rows], rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(lse[0][:, rows], dense_lse[:, rows], rtol=1e-13, atol=1e-13)
    assert torch.isfinite(base[0][:, rows]).all()



@pytest.mark.parametrize("value", [0.5, -math.inf])
@pytest.mark.parametrize("skv", [1, 40])
def test_a_score_mod_that_returns_a_captured_tensor_keeps_it_and_gets_its_answer(value, skv):
    """A mod that returns a captured 0-d tensor as is (a learned constant logit): where a
    chunk is one head by one row by one kept key, its output was a view of that tensor, and
    the softmax's in-place passes overwrote it (0.5 became 1.0, -inf became 0), so every later
    batch got another answer: a false MISMATCH on a correct backend (an outside audit). The
    float64 golden, the float32 baseline and the gradients' pass each keep it, and each
    batch's one key gets the score ``value``: lse = value and out = its v (0 where -inf)."""
    shape = Shape(3, 1, 1, 1, skv, 8)
    case = Case(v.full(), shape, "bf16", "fwd+lse")
    inputs = make_inputs(case, 0)
    key = 0 if skv == 1 else 7
    for dtype in (torch.float64, torch.float32):
        captured = torch.tensor(value, dtype=dtype)
        mods = Mods(None if skv == 1 else (lambda b, h, q_idx, kv_idx: kv_idx == key),
                    lambda score, b, h, q_idx, kv_idx: captured)
        out, lse = chunked_attention(case, inputs, mods, dtype)
        assert captured.item() == value, dtype
        torch.testing.assert_close(lse, torch.full_like(lse, value))
        want = inputs.v[:, :, key:key + 1].to(dtype) if value > -math.inf else torch.zeros_like(out)
        torch.testing.assert_close(out, want)
        kernel_module.chunked_gradients(case, inputs, mods, torch.ones_like(out), dtype)
        assert captured.item() == value, dtype
