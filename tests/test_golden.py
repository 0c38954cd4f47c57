"""The float64 golden agrees with SDPA on independent dense masks and with eager
flex_attention in float64; it is exact about masking, GQA, broadcast and chunking."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import reference.golden as golden_module
from cases import variants as v
from cases.inputs import Inputs, make_inputs
from cases.model import Case, Shape
from cases.variants import Mods, build_mods
from reference.golden import baseline_attention, chunked_attention, golden_attention
from tests.dense_reference import dense_mask, dense_score_transform


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
    want, want_lse = flex_attention(q, k, vv, score_mod=mods.score_mod, block_mask=block_mask,
                                    enable_gqa=shape.Hq != shape.Hkv, return_lse=True)
    ref = golden_attention(case, inputs)
    torch.testing.assert_close(ref.out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ref.lse, want_lse, rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_give_zero_output_and_minus_inf_lse():
    case = Case(v.full(), Shape(1, 2, 2, 16, 16, 8), "fp32")
    inputs = make_inputs(case, 0)

    def rows_from_5_see_nothing(b, h, q_idx, kv_idx):
        return (q_idx < 5) & (kv_idx <= q_idx)

    ref = chunked_attention(case, inputs, Mods(rows_from_5_see_nothing, None), torch.float64)
    out, lse = ref
    assert torch.all(out[:, :, 5:] == 0)
    assert torch.all(lse[:, :, 5:] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, :, :5]))
    assert torch.allclose(out[0, :, 0], inputs.v[0, :, 0].double())  # row 0 sees only key 0


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


def test_chunking_and_key_skipping_do_not_change_the_result(monkeypatch):
    case = Case(v.document(), Shape(2, 2, 2, 192, 192, 16), "fp32")
    inputs = make_inputs(case, 2)
    whole = golden_attention(case, inputs)
    monkeypatch.setattr(golden_module, "_CHUNK_SCORE_ELEMENTS", 2 * 192 * 7)  # 7-row chunks
    chunked = golden_attention(case, inputs)
    torch.testing.assert_close(chunked.out, whole.out, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(chunked.lse, whole.lse, rtol=1e-13, atol=1e-14)


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
        want, want_lse = flex_attention(q, k, vv, block_mask=block_mask, return_lse=True)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
        torch.testing.assert_close(got_lse, want_lse, rtol=1e-12, atol=1e-12, msg=name)
