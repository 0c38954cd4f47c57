"""Score mods that add to the score (cases/score_addend.py): which mods count, and that the
golden's product accumulating their addend gives what the mod's own add gives (and what eager
flex_attention gives), forward and backward."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import reference.chunks as chunks_module
from cases import variants as v
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.score_addend import adds_to_score, score_addend
from cases.variants import Mods, build_mods
from conformance import compat
from reference.kernel import chunked_attention, chunked_gradients
from tests import gym_variants
from tests.eager_flex import as_eager_runs_it

SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
#: The grid sizes (B, Hq, Sq, Skv) the probe may index: the unit tests' tables cover them.
SIZES = (2, 4, 16, 16)
TABLE = torch.randn(4, 33, generator=torch.Generator().manual_seed(3))


def alibi_like(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def addend_first(score, b, h, q_idx, kv_idx):
    return TABLE[h, (q_idx - kv_idx).clamp(-16, 16) + 16] + score


def through_torch_add(score, b, h, q_idx, kv_idx):
    bias = torch.where(kv_idx > q_idx, -math.inf, 0.0)  # a mask written as a score mod
    return torch.add(score, bias.to(score.dtype))


def int_addend(score, b, h, q_idx, kv_idx):
    return score + (kv_idx - q_idx) // 4


def bool_addend(score, b, h, q_idx, kv_idx):
    return score + (kv_idx % 3 == 0)


def padding_as_finfo_min(score, b, h, q_idx, kv_idx):
    """An HF-style additive mask: the first 6 keys are padding, plus causal; rows 0-5 see no
    key, so every score of theirs is finfo.min (not -inf): eager flex_attention averages V
    there, and log2 e times finfo.min would be -inf, a fully masked row."""
    hidden = (kv_idx > q_idx) | (kv_idx < 6)
    return score + hidden.to(score.dtype) * torch.finfo(score.dtype).min


def reads_metadata(score, b, h, q_idx, kv_idx):
    bias = (SLOPES[h] * (kv_idx - q_idx)).to(score.dtype)
    assert score.shape == () and score.dim() == 0
    return score + bias.to(score.device)


ADDING = [alibi_like, addend_first, through_torch_add, int_addend, bool_addend,
          padding_as_finfo_min, reads_metadata]


def scaled(score, b, h, q_idx, kv_idx):
    return score * 2 + SLOPES[h]


def doubled(score, b, h, q_idx, kv_idx):
    return score + score


def with_alpha(score, b, h, q_idx, kv_idx):
    return torch.add(score, SLOPES[h], alpha=2)


def in_place_first(score, b, h, q_idx, kv_idx):
    score.mul_(2)
    return score + SLOPES[h]


def op_after(score, b, h, q_idx, kv_idx):
    return (score + SLOPES[h]) * 1.0


def in_place_after(score, b, h, q_idx, kv_idx):
    out = score + SLOPES[h]
    out.mul_(2)
    return out


def returns_addend(score, b, h, q_idx, kv_idx):
    bias = SLOPES[h] * q_idx
    _ = score + bias
    return bias


def addend_reads_score(score, b, h, q_idx, kv_idx):
    return score + torch.where(score > 0, SLOPES[h], 0.0)


def hidden_read(score, b, h, q_idx, kv_idx):
    """Reads the score where no TorchFunctionMode sees it: only the addend's dependence on
    the score, read off vmap, tells (the fifth check)."""
    with torch._C.DisableTorchFunction():
        bias = score * 0.5 + SLOPES[h]
    return score + bias


def hidden_in_place_on_score(score, b, h, q_idx, kv_idx):
    with torch._C.DisableTorchFunction():
        score.mul_(2)
    return score + SLOPES[h] * (kv_idx - q_idx)


def hidden_in_place_on_output(score, b, h, q_idx, kv_idx):
    out = score + SLOPES[h] * (kv_idx - q_idx)
    with torch._C.DisableTorchFunction():
        out.mul_(2)
    return out


def hidden_in_place_on_addend_after(score, b, h, q_idx, kv_idx):
    """The add's result is right, but the addend changes after it: only the values on a grid
    whose addend is not zero tell."""
    bias = SLOPES[h] * (kv_idx - q_idx)
    out = score + bias
    with torch._C.DisableTorchFunction():
        bias.mul_(3)
    return out


class _AddsTwice(torch.Tensor):
    """A tensor subclass whose "+" is not an add."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__):
            with torch._C.DisableTorchFunctionSubclass():
                return args[0] * 2 + args[1]
        return super().__torch_function__(func, types, args, kwargs or {})


ODD_SLOPES = SLOPES.clone().as_subclass(_AddsTwice)


def subclass_addend(score, b, h, q_idx, kv_idx):
    return score + ODD_SLOPES[h] * (kv_idx - q_idx)


def python_number(score, b, h, q_idx, kv_idx):
    return score + 1.5


def complex_addend(score, b, h, q_idx, kv_idx):
    return score + torch.complex(SLOPES[h], SLOPES[h])


def softcapped(score, b, h, q_idx, kv_idx):
    return 20.0 * torch.tanh(score / 20.0)


#: Mods that hide what they do from the calls a TorchFunctionMode sees, or make "+" another
#: operation: the checks on vmap's dimensions and on values refuse them.
HIDING = [hidden_read, hidden_in_place_on_score, hidden_in_place_on_output,
          hidden_in_place_on_addend_after, subclass_addend]
NOT_ADDING = [scaled, doubled, with_alpha, in_place_first, op_after, in_place_after,
              returns_addend, addend_reads_score, *HIDING, python_number, complex_addend,
              softcapped]


@pytest.mark.parametrize("mod", ADDING, ids=lambda m: m.__name__)
def test_mods_that_add_a_score_free_addend_are_recognised(mod):
    assert adds_to_score(mod, torch.float64, SIZES)


@pytest.mark.parametrize("mod", NOT_ADDING, ids=lambda m: m.__name__)
def test_mods_that_do_not_just_add_are_evaluated_with_their_scores(mod):
    assert not adds_to_score(mod, torch.float64, SIZES)


@pytest.mark.parametrize("mod", HIDING, ids=lambda m: m.__name__)
def test_a_golden_with_a_mod_that_only_seems_to_add_matches_eager_flex_attention(mod):
    case = _case("b1-h4x2-s24x24-d8")
    inputs = make_inputs(case, 0)
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    want = compat.attention(flex_attention, q, k, vv, as_eager_runs_it(mod), None,
                            enable_gqa=True)
    out, _ = chunked_attention(case, inputs, Mods(None, mod), torch.float64)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


def test_the_catalogs_and_third_party_biases_are_recognised_and_softcap_is_not():
    shape = Shape.parse("b2-h4x2-s64x64-d16")
    sizes = (shape.B, shape.Hq, shape.Sq, shape.Skv)
    found = {variant.token: adds_to_score(build_mods(variant, shape).score_mod, torch.float64,
                                          sizes)
             for variant in (v.alibi(), v.rel_bias(8), v.softcap(5.0),
                             gym_variants.t5_bias(32, 128),
                             gym_variants.softcap_window(30, 16))}
    assert found == {"alibi": True, "rel_bias-nb8": True, "softcap-cap5": False,
                     "t5_bias-nb32-md128": True, "softcap_window-cap30-w16": False}


def test_the_probe_indexes_only_what_the_case_has_so_a_dimension_of_one_still_adds():
    one_head_table = torch.tensor([0.75])

    def per_head_bias(score, b, h, q_idx, kv_idx):  # a table sized to the case's one head
        return score + one_head_table[h] * (kv_idx - q_idx)

    assert adds_to_score(per_head_bias, torch.float64, (1, 1, 8, 8))
    assert adds_to_score(per_head_bias, torch.float64, (1, 1, 1, 1))
    assert not adds_to_score(per_head_bias, torch.float64, (1, 2, 8, 8))  # index 1: refused


def test_the_addend_is_what_the_mod_adds_at_each_point_with_expanded_dimensions():
    heads, rows, keys = torch.arange(4), torch.arange(3, 9), torch.arange(10)
    addend = score_addend(alibi_like, torch.float64, torch.tensor([0, 1]), heads, rows, keys)
    assert addend.dtype == torch.float32  # cast as the mod's add casts it, by the caller
    want = SLOPES[:, None, None] * (keys[None, None, :] - rows[None, :, None])
    assert torch.equal(addend[0], want) and torch.equal(addend[1], want)
    assert addend.stride(0) == 0  # b: no operation reached it
    assert score_addend(softcapped, torch.float64, torch.tensor([0]), heads, rows, keys) is None


def _case(shape: str, mode: str = "fwd") -> Case:
    return Case(v.alibi(), Shape.parse(shape), "bf16", mode=mode)


def _unfused(monkeypatch):
    """The kernel as if no mod added to the score: every mod evaluated on its scores."""
    monkeypatch.setattr(chunks_module, "adds_to_score", lambda *args: False)


@pytest.mark.parametrize("mod", ADDING, ids=lambda m: m.__name__)
@pytest.mark.parametrize("shape", ["b2-h4x2-s70x90-d16", "b1-h4x4-s33x33-d8"])
def test_accumulating_the_addend_gives_the_mods_own_add_to_float64_rounding(
        mod, shape, monkeypatch):
    case = _case(shape)
    mods = Mods(None, mod)
    calls = []
    real = chunks_module.score_addend
    monkeypatch.setattr(chunks_module, "score_addend",
                        lambda *a: calls.append(1) or real(*a))
    for seed in (0, 1):
        inputs = make_inputs(case, seed)
        fused = chunked_attention(case, inputs, mods, torch.float64)
        assert calls, "the addend was not accumulated"
        with monkeypatch.context() as plain:
            _unfused(plain)
            want = chunked_attention(case, inputs, mods, torch.float64)
        for got, expected in zip(fused, want):
            torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mod", [alibi_like, through_torch_add, int_addend,
                                 padding_as_finfo_min], ids=lambda m: m.__name__)
def test_accumulated_golden_matches_eager_flex_attention_in_float64(mod):
    case = _case("b2-h4x2-s70x70-d16")
    inputs = make_inputs(case, 5)
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 20, None,
                                   None, 70, 70, "cpu")
    want, want_lse = compat.attention(flex_attention, q, k, vv, mod, block_mask,
                                      enable_gqa=True, return_lse=True)
    out, lse = chunked_attention(case, inputs,
                                 Mods(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 20, mod),
                                 torch.float64)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    # Rows whose every score is finfo.min: eager's log-sum-exp, made in log2 units, overflows
    # to -inf; the golden's is finfo.min (plus a log that it absorbs), as before this path:
    # bfloat16's min, the case's dtype, which the golden's mod reads as flex_attention traces
    # it (cases/score_dtype.py), where this eager call on float64 inputs reads float64's.
    overflowed = torch.isneginf(want_lse) & ~torch.isneginf(lse)
    assert torch.all(lse[overflowed] == torch.finfo(torch.bfloat16).min)
    assert (mod is padding_as_finfo_min) == bool(overflowed.any())
    torch.testing.assert_close(lse[~overflowed], want_lse[~overflowed], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mod", [alibi_like, addend_first], ids=lambda m: m.__name__)
def test_gradients_through_the_accumulated_addend_match_the_mods_own_add(mod, monkeypatch):
    case = _case("b2-h4x2-s48x40-d16", mode="fwd+bwd")
    inputs = make_inputs(case, 2)
    grad_out = make_grad_output(case, 2)
    mods = Mods(v._causal, mod)
    fused = chunked_gradients(case, inputs, mods, grad_out, torch.float64)
    _unfused(monkeypatch)
    want = chunked_gradients(case, inputs, mods, grad_out, torch.float64)
    for name in ("dq", "dk", "dv"):
        torch.testing.assert_close(fused[name], want[name], rtol=1e-12, atol=1e-12)


def test_a_chunk_whose_addend_cannot_be_had_falls_back_to_the_mod_on_its_scores(monkeypatch):
    case = _case("b2-h4x2-s40x40-d16")
    inputs = make_inputs(case, 0)
    mods = Mods(None, alibi_like)
    monkeypatch.setattr(chunks_module, "score_addend", lambda *args: None)
    fell_back = chunked_attention(case, inputs, mods, torch.float64)
    _unfused(monkeypatch)
    want = chunked_attention(case, inputs, mods, torch.float64)
    for got, expected in zip(fell_back, want):
        assert torch.equal(got, expected)


def test_telling_whether_a_mod_adds_draws_nothing_from_torchs_global_generator():
    state = torch.get_rng_state()
    assert adds_to_score(alibi_like, torch.float64, SIZES)
    assert torch.equal(torch.get_rng_state(), state)


def test_the_benchmarks_floor_runs_the_goldens_own_scores_with_and_without_the_mod():
    """benchmarks/golden_floor.py times the golden's products and mod through chunk_scores;
    it must keep up with that function's contract."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from golden_floor import products_and_score_mod

    case = _case("b1-h4x2-s64x64-d16")
    inputs = make_inputs(case, 0)
    with_mod, without = (products_and_score_mod(case, inputs, flag) for flag in (True, False))
    assert math.isfinite(with_mod) and math.isfinite(without) and with_mod != without
