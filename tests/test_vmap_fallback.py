"""Mods with an operation vmap has no batching rule for: the same values as one point at a
time and as eager flex_attention, batched where the operation has an out-of-place twin
(cases/pointwise.py), including mods that change their score in place before it (the change
must not be made twice), their gradients, and mods that flex_attention refuses."""
from __future__ import annotations

import itertools
import threading
import warnings
from functools import partial

import pytest
import torch
from torch._C import _functorch
from torch.nn.attention.flex_attention import flex_attention

import cases.pointwise as pointwise
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape, Variant
from cases.pointwise import PointwiseModError, check_mods, evaluate_mask, evaluate_score
from cases.variants import Mods, build_mods, builder
from conformance import compat
from reference.golden import reference_pair
from tests.eager_flex import REFUSAL, refuses_score_mutation
from tests.test_pointwise_mods import assert_golden_equals_eager_flex

GRID = [torch.arange(n) for n in (2, 3, 5, 7)]
CAP = 0.75
TABLE = torch.tensor([[1.0, 2.0], [4.0, 8.0]], dtype=torch.float64)


def clamp_in_place(score, b, h, q_idx, kv_idx):
    """torch.clamp_ has no batching rule (torch 2.13); torch.clamp has one."""
    return score.float().clamp_(min=-CAP, max=CAP) + kv_idx


def clamp_or_zero(score, b, h, q_idx, kv_idx):
    """Catches what clamp_ raised with the fallback off: its except branch must not be taken."""
    try:
        return score.clone().clamp_(min=-CAP, max=CAP)
    except RuntimeError:
        return score * 0


def doubled_then_clamped(score, b, h, q_idx, kv_idx):
    """Changes its score in place before the operation with no rule (an outside review: an
    evaluation started again doubled it twice)."""
    return score.mul_(2).clamp_(-CAP, CAP)


def biased_then_clamped(score, b, h, q_idx, kv_idx):
    score += (kv_idx - q_idx) * 0.01
    score.clamp_(-CAP, CAP)
    return score


def doubled_then_indexed_with_ints(score, b, h, q_idx, kv_idx):
    """An int index before torch's rule for ints is known: asking it started the evaluation
    again too, so the first evaluation of a process doubled the score twice."""
    score.mul_(2)
    return score + TABLE[1, 0]


def doubled_then_log_ndtr(score, b, h, q_idx, kv_idx):
    """special.log_ndtr has no batching rule even out of place: evaluated per point, after an
    in-place change that must be made once."""
    return torch.special.log_ndtr(score.mul_(2)) - q_idx


NEG = torch.tensor(-1e4, dtype=torch.float64)


def masked_fill_with_a_tensor(score, b, h, q_idx, kv_idx):
    """masked_fill_ with a 0-d tensor value: its twin has no batching rule either (an outside
    review: the golden blamed the mod)."""
    return score.masked_fill_(kv_idx > q_idx, NEG)


def masked_fill_with_a_tensor_or_zero(score, b, h, q_idx, kv_idx):
    try:
        return score.clone().masked_fill_(kv_idx > q_idx, NEG)
    except RuntimeError:
        return score * 0


def set_unseen(score, b, h, q_idx, kv_idx):
    """Tensor.set_ never reaches a TorchFunctionMode, and has no batching rule."""
    return score.clone().set_(score.clone()) * 2


MODS = [clamp_in_place, clamp_or_zero, doubled_then_clamped, biased_then_clamped,
        doubled_then_indexed_with_ints, doubled_then_log_ndtr, masked_fill_with_a_tensor,
        masked_fill_with_a_tensor_or_zero, set_unseen]
PER_POINT = {doubled_then_log_ndtr, set_unseen}  # vmap's fallback runs these, point by point,
if compat.torch_version() < (2, 14):  # and these too before torch 2.14, which batches them
    PER_POINT |= {masked_fill_with_a_tensor, masked_fill_with_a_tensor_or_zero}


def score_mod_point_by_point(mod, score):
    out = torch.empty(score.shape, dtype=torch.float64)
    for point in itertools.product(*(range(len(g)) for g in GRID)):
        out[point] = mod(score[point].clone(), *(torch.tensor(i) for i in point))
    return out


def evaluated(mod, score):
    """evaluate_score's values on a copy of ``score``, and whether vmap's per-point fallback
    ran (its warning, which torch gives at every fallback: warnings.simplefilter("always"))."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = evaluate_score(mod, score.clone(), *GRID)
    assert _functorch._is_vmap_fallback_enabled()  # set back
    fell_back = any("batching rule" in str(w.message) for w in seen)
    return out, fell_back


@pytest.mark.parametrize("mod", MODS, ids=lambda mod: mod.__name__)
def test_a_mod_vmap_cannot_batch_gets_its_values_point_by_point(monkeypatch, mod):
    monkeypatch.setattr(pointwise, "_takes_ints", None)  # as in a process that never asked
    score = torch.randn(*(len(g) for g in GRID), dtype=torch.float64,
                        generator=torch.Generator().manual_seed(3))
    want = score_mod_point_by_point(mod, score)
    first, fell_back = evaluated(mod, score)
    torch.testing.assert_close(first.double(), want, rtol=0, atol=0)
    assert fell_back is (mod in PER_POINT)
    again, _ = evaluated(mod, score)  # the int rule known now: the same values
    assert torch.equal(again, first)


# -- through the golden: eager flex_attention's values, and gradients -------------------------
@builder("test_doubled_then_clamped")
def _doubled_then_clamped(variant, shape, device):
    return Mods(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, doubled_then_clamped)


@builder("test_biased_then_clipped")
def _biased_then_clipped(variant, shape, device):
    def score_mod(score, b, h, q_idx, kv_idx):
        score += (kv_idx - q_idx) * 0.01
        return score.clip_(-CAP, CAP) * 3  # clip_ has no batching rule either
    return Mods(None, score_mod)


VARIANTS = ["test_doubled_then_clamped", "test_biased_then_clipped"]
SHAPE = Shape(1, 2, 2, 24, 24, 8)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", VARIANTS)
def test_the_golden_of_an_in_place_mod_equals_eager_flex_attention(name, dtype):
    """Eager flex_attention runs the mod as it is where the running torch does (2.6 to 2.14),
    on a copy of its score where it refuses the change in place (tests/eager_flex.py)."""
    assert_golden_equals_eager_flex(Case(Variant(name), SHAPE, dtype))


def test_which_releases_refuse_a_score_mod_that_changes_its_score_in_place():
    """torch 2.15.0's eager flex_attention refuses such a mod, in Dynamo's words; 2.6 to 2.14
    run it (docs/findings.md, finding 11). Pinned for each release up to the newest one the
    suite has checked (conformance/compat.py): a newer torch may lift the rule, and the
    tests' judge then finds it so (tests/eager_flex.py)."""
    version = compat.torch_version()
    if version > compat.NEWEST_CHECKED_TORCH:
        pytest.skip(f"torch {version} is newer than the releases checked")
    assert refuses_score_mutation() is (version >= (2, 15))
    case = Case(Variant("test_doubled_then_clamped"), SHAPE, "fp32")
    mod = build_mods(case.variant, SHAPE).score_mod
    inputs = make_inputs(case, 0)
    as_it_is = partial(flex_attention, inputs.q, inputs.k, inputs.v, enable_gqa=True)
    if refuses_score_mutation():
        with pytest.raises(Exception, match=REFUSAL):
            as_it_is(score_mod=mod)
    else:  # where both run, the copy that the judge runs it on elsewhere changes no value
        on_a_copy = as_it_is(score_mod=lambda s, b, h, q, kv: mod(s.clone(), b, h, q, kv))
        torch.testing.assert_close(as_it_is(score_mod=mod), on_a_copy, rtol=0, atol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_the_golden_gradients_of_an_in_place_mod_equal_eager_flex_attentions(name):
    """A fwd+bwd case's golden: its gradients were a harness error when the mod's in-place
    change was written back over a tensor autograd had saved (an outside review)."""
    case = Case(Variant(name), SHAPE, "fp32", "fwd+bwd")
    inputs = make_inputs(case, 0)
    grad_out = make_grad_output(case, 0)
    golden, _ = reference_pair(case, inputs, grad_out)
    leaves = [t.detach().double().requires_grad_() for t in (inputs.q, inputs.k, inputs.v)]
    out = dense_attention_point_by_point(build_mods(case.variant, SHAPE), *leaves)
    want = torch.autograd.grad(out, leaves, grad_out.double())
    for key, expected in zip(("dq", "dk", "dv"), want):
        torch.testing.assert_close(golden.grads[key], expected, rtol=1e-10, atol=1e-10)


def dense_attention_point_by_point(mods: Mods, q, k, v):
    """Attention in float64 with each mod called at one point at a time (flex_attention's
    definition; eager flex_attention has no backward on the CPU): autograd gives dQ/dK/dV."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    points = list(itertools.product(*(range(n) for n in scores.shape)))
    index = [[torch.tensor(i) for i in point] for point in points]
    modded = torch.stack([mods.score_mod(scores[p].clone(), *i) if mods.score_mod else scores[p]
                          for p, i in zip(points, index)]).view(scores.shape)
    if mods.mask_mod is not None:
        keep = torch.stack([mods.mask_mod(*i) for i in index])
        modded = modded.masked_fill(~keep.view(scores.shape), -float("inf"))
    return torch.softmax(modded, -1) @ v


# -- what flex_attention refuses stays refused ------------------------------------------------
def test_an_in_place_result_that_cannot_be_written_back_is_refused_as_vmap_refuses_it():
    """clamp_ of an int index to a float bound: torch refuses to write a float result into
    the int tensor; the out-of-place twin would compute it, so it is refused the same way."""
    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx.clone().clamp_(max=2.5) <= kv_idx

    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        torch.vmap(lambda q: mask_mod(q, q, q, q))(torch.arange(3))  # torch, fallback on
    with pytest.raises(PointwiseModError, match="can't be cast to the desired output type"):
        check_mods(mask_mod, None, "clamp_to_a_float")


@pytest.mark.parametrize("mod", [
    lambda s, b, h, q, k: s.float().float_power_(2),
    lambda s, b, h, q, k: s.float().heaviside_(torch.tensor(0.5, dtype=torch.float64)),
    lambda s, b, h, q, k: s.view(1)[0].detach_(),
], ids=["float_power_", "heaviside_", "detach_"])
def test_an_in_place_operation_torch_refuses_stays_refused(mod):
    """Their out-of-place twins compute what the in-place operation refuses (an outside
    review): these run per point, as vmap runs them, and are refused as torch refuses them."""
    score = torch.zeros(1, 1, 2, 3, dtype=torch.float64)
    grid = [torch.arange(n) for n in (1, 1, 2, 3)]
    with pytest.raises(RuntimeError):
        torch.vmap(lambda s: mod(s, *(g[0] for g in grid)))(score.view(-1))  # torch's own
    with pytest.raises(PointwiseModError):
        evaluate_score(mod, score, *grid)


def test_the_fallback_switch_is_set_back_when_the_mod_raises_and_masks_still_evaluate():
    def raising(score, b, h, q_idx, kv_idx):
        score.clamp_(min=0)  # has no rule: taken on the way
        raise ValueError("the mod's own error")

    with pytest.raises(Exception, match="the mod's own error"):
        evaluate_score(raising, torch.zeros(2, 3, 5, 7, dtype=torch.float64), *GRID)
    assert _functorch._is_vmap_fallback_enabled()
    mask = evaluate_mask(lambda b, h, q_idx, kv_idx: kv_idx.clone().clamp_(max=3) <= q_idx,
                         *GRID)
    assert torch.equal(mask[0, 0], torch.arange(7).clamp(max=3) <= torch.arange(5)[:, None])


def test_evaluations_in_two_threads_take_turns_with_the_switch():
    """The golden's thread and the executor's main thread evaluate mods at once: each gets its
    own mod's values while the other holds the process-wide switch."""
    score = torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    want = score_mod_point_by_point(clamp_in_place, score)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(torch.equal(evaluate_score(clamp_in_place, score, *GRID).double(),
                                           want))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [True] * 40
    assert _functorch._is_vmap_fallback_enabled()
