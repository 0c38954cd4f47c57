"""The golden's batches sharing one evaluation of a score mod's addend (reference/kernel.py,
``query_chunks(..., addends_shared=True)``): span by span where the addend ignores b and one plan
serves every batch, with the same values as batch by batch; batch by batch wherever the addend
or the mask reads b, or the batches' K and V would take too much memory."""
from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import reference.chunk_plan as chunk_plan
import reference.chunks as chunks_module
from cases import variants as v
from cases.inputs import make_grad_output, make_inputs
from cases.model import Case, Shape
from cases.variants import Mods, build_mods
from conformance import compat
from reference.kernel import chunked_attention, chunked_gradients

SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
PER_BATCH = torch.tensor([[0.0, 1.5, -2.0, 0.25], [3.0, -1.0, 0.5, 2.0]])
#: Chunks of 16 full-width rows at Hq = 4, Skv = 96.
SMALL_CHUNKS = 4 * 96 * 16


def alibi_like(score, b, h, q_idx, kv_idx):
    return score + SLOPES[h] * (kv_idx - q_idx)


def per_batch_bias(score, b, h, q_idx, kv_idx):
    return score + PER_BATCH[b, h] * (kv_idx - q_idx) / 16


def reads_b_for_nothing(score, b, h, q_idx, kv_idx):
    return score + (SLOPES[h] + b * 0) * (kv_idx - q_idx)


def causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def every_other_batch_causal(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (b % 2 == 1)


def _case(shape: str = "b2-h4x2-s96x96-d16", mode: str = "fwd") -> Case:
    return Case(v.alibi(), Shape.parse(shape), "bf16", mode=mode)


@pytest.fixture
def addend_calls(monkeypatch) -> list:
    """The batch grid of every evaluation of an addend, with chunks of SMALL_CHUNKS."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", SMALL_CHUNKS)
    real, calls = chunks_module.score_addend, []

    def counted(mod, dtype, b, *rest):
        calls.append(b.tolist())
        return real(mod, dtype, b, *rest)
    monkeypatch.setattr(chunks_module, "score_addend", counted)
    return calls


def _batch_by_batch(monkeypatch) -> None:
    monkeypatch.setattr(chunks_module, "_plan_sharing_addends", lambda *args: None)


def _chunks(case: Case, mods: Mods) -> list:
    inputs = make_inputs(case, 0)
    return list(chunks_module.query_chunks(case, inputs, mods, torch.float64,
                                           addends_shared=True))


@pytest.mark.parametrize("shape", ["b2-h4x2-s96x96-d16", "b3x1-h4x4-s96x80-d8"])
def test_an_addend_that_ignores_b_is_evaluated_once_per_span_with_the_same_values(
        shape, addend_calls, monkeypatch):
    case = _case(shape)
    mods = Mods(causal, alibi_like)
    chunks = _chunks(case, mods)
    spans = len(chunks) // case.shape.B
    assert [c.b for c in chunks] == list(range(case.shape.B)) * spans
    assert all(c.addend is chunks[i - i % case.shape.B].addend is not None
               for i, c in enumerate(chunks))
    for seed in (0, 1):
        inputs = make_inputs(case, seed)
        addend_calls.clear()
        shared = chunked_attention(case, inputs, mods, torch.float64)
        # one probe of b (two batches), then one evaluation per span at b = 0
        assert addend_calls == [[0, 0]] + [[0]] * spans
        with monkeypatch.context() as patched:
            _batch_by_batch(patched)
            addend_calls.clear()
            want = chunked_attention(case, inputs, mods, torch.float64)
            assert len(addend_calls) == spans * case.shape.B
        for got, expected in zip(shared, want):
            assert torch.equal(got, expected)


@pytest.mark.parametrize("mod", [per_batch_bias, reads_b_for_nothing],
                         ids=lambda m: m.__name__)
def test_an_addend_that_reads_b_goes_batch_by_batch_and_matches_flex_attention(
        mod, addend_calls):
    case = _case()
    mods = Mods(causal, mod)
    chunks = _chunks(case, mods)
    assert [c.b for c in chunks] == sorted(c.b for c in chunks)
    assert all(c.addend is None for c in chunks)
    inputs = make_inputs(case, 4)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    assert [0] in addend_calls and [1] in addend_calls  # each batch evaluates its own
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    block_mask = create_block_mask(causal, None, None, 96, 96, "cpu")
    want, want_lse = compat.attention(flex_attention, q, k, vv, mod, block_mask,
                                      enable_gqa=True, return_lse=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_a_mask_that_reads_b_goes_batch_by_batch(addend_calls):
    case = _case()
    chunks = _chunks(case, Mods(every_other_batch_causal, alibi_like))
    assert [c.b for c in chunks] == sorted(c.b for c in chunks)
    assert all(c.addend is None for c in chunks)


def test_batches_whose_keys_and_values_take_too_much_memory_go_batch_by_batch(
        addend_calls, monkeypatch):
    monkeypatch.setattr(chunks_module, "_SPAN_BY_SPAN_EXTRA_BYTES", 0)
    mods = Mods(causal, alibi_like)
    own_keys = _chunks(_case("b2-h4x2-s96x96-d16"), mods)
    assert [c.b for c in own_keys] == sorted(c.b for c in own_keys)
    shared_keys = _chunks(_case("b2x1-h4x2-s96x96-d16"), mods)  # nothing more to hold
    assert [c.b for c in shared_keys[:2]] == [0, 1]


@pytest.mark.parametrize("shape", ["b2-h4x2-s96x80-d16", "b2x1-h4x4-s96x96-d8"])
def test_gradients_span_by_span_match_batch_by_batch(shape, addend_calls, monkeypatch):
    case = _case(shape, mode="fwd+bwd")
    inputs, grad_out = make_inputs(case, 2), make_grad_output(case, 2)
    mods = build_mods(case.variant, case.shape)
    shared = chunked_gradients(case, inputs, mods, grad_out, torch.float64)
    assert addend_calls[0] == [0, 0] and all(call == [0] for call in addend_calls[1:])
    _batch_by_batch(monkeypatch)
    want = chunked_gradients(case, inputs, mods, grad_out, torch.float64)
    for name in ("dq", "dk", "dv"):  # Bkv 1: dK and dV summed over the chunks in another order
        torch.testing.assert_close(shared[name], want[name], rtol=1e-12, atol=1e-12)
