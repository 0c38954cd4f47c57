"""The golden's chunk planning (reference/chunk_plan.py): chunks cut by key range, taller where
rows see few keys, key columns and whole chunks skipped exactly, one plan shared by the batches
of a mask that ignores b; each checked against a dense float64 evaluation."""
from __future__ import annotations

import math
import weakref

import numpy as np
import pytest
import torch

import reference.chunk_plan as chunk_plan
import reference.chunks as chunks_module
from cases import variants as v
from cases.inputs import Inputs, make_inputs
from cases.model import Case, Shape
from cases.variants import Mods, build_mods
from reference.golden import chunked_attention, golden_attention
from tests.test_golden import _assert_equals_dense


def test_chunking_and_key_skipping_do_not_change_the_result(monkeypatch):
    case = Case(v.document(), Shape(2, 2, 2, 192, 192, 16), "fp32")
    inputs = make_inputs(case, 2)
    whole = golden_attention(case, inputs)
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", 2 * 192 * 7)  # 7-row chunks
    chunked = golden_attention(case, inputs)
    torch.testing.assert_close(chunked.out, whole.out, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(chunked.lse, whole.lse, rtol=1e-13, atol=1e-14)


#: A chunk's score matrix of 16 full-width rows at Hq = 4, Skv = 256: a window is 64 rows, so
#: the first rows of a causal mask take chunks taller than 16 rows.
_SMALL_CHUNKS = 4 * 256 * 16


def _chunks_of(case: Case, inputs: Inputs, mods: Mods) -> list:
    return list(chunks_module.query_chunks(case, inputs, mods, torch.float64))


@pytest.mark.parametrize("variant", [v.causal(), v.alibi(), v.sliding_window(40),
                                     v.document(), v.prefix_lm(24), v.softcap(5.0),
                                     v.rel_bias(8), v.full()], ids=lambda var: var.name)
@pytest.mark.parametrize("shape", [Shape(2, 4, 2, 256, 256, 16),
                                   Shape(2, 4, 4, 256, 256, 8, Bkv=1)], ids=["gqa", "bkv1"])
def test_golden_equals_a_dense_float64_evaluation_with_small_chunks(monkeypatch, variant,
                                                                    shape):
    """Chunks cut by key range, taller where rows see few keys, with skipped key columns; the
    plan of a mask that ignores b shared by both batches."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)
    case = Case(variant, shape, "bf16")
    inputs = make_inputs(case, 3)
    _assert_equals_dense(case, inputs, build_mods(variant, shape))


def _row_span_calls(monkeypatch) -> list:
    """The batches whose masks the golden evaluates and scans (_row_spans is called once per
    batch that plans its own chunks)."""
    calls, row_spans = [], chunk_plan._row_spans
    monkeypatch.setattr(chunk_plan, "_row_spans",
                        lambda s, mods, batch, heads: calls.append(int(batch)) or
                        row_spans(s, mods, batch, heads))
    return calls


def test_a_mask_that_ignores_b_is_planned_once_and_one_that_reads_b_per_batch(monkeypatch):
    """Sharing the first batch's plan is right only when the mask ignores b: a mask that
    reads b (a length per batch) is planned batch by batch, and both equal a dense
    evaluation, as does a mask too large to hold (_SHARED_PLAN_BYTES)."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)
    shape = Shape(3, 4, 2, 256, 256, 16)
    case = Case(v.causal(), shape, "fp32")
    inputs = make_inputs(case, 5)
    lengths = torch.tensor([256, 90, 170])
    i, j = np.arange(256)[:, None], np.arange(256)[None, :]

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def causal_within_length(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (kv_idx < lengths[b])

    calls = _row_span_calls(monkeypatch)
    _assert_equals_dense(case, inputs, Mods(causal, None), mask=j <= i)
    assert calls == [0]
    calls.clear()
    per_batch = (j <= i) & (j < lengths.numpy()[:, None, None, None])
    _assert_equals_dense(case, inputs, Mods(causal_within_length, None), mask=per_batch)
    assert calls == [0, 1, 2]
    calls.clear()
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_BYTES", 256 * 256 - 1)
    _assert_equals_dense(case, inputs, Mods(causal, None), mask=j <= i)
    assert calls == [0, 1, 2]


def test_whether_a_mask_ignores_b_is_traced_once_per_reference_pair(monkeypatch):
    """The golden, the baseline and both gradients plan the same mods: one trace serves all."""
    from cases.inputs import make_grad_output
    from reference.golden import reference_pair

    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)
    monkeypatch.setattr(chunk_plan, "_MASK_DEPENDENCE", weakref.WeakKeyDictionary())
    traced = []
    monkeypatch.setattr(chunk_plan, "mask_dependence",
                        lambda mod, device: traced.append(mod) or frozenset({"q_idx", "kv_idx"}))
    case = Case(v.causal(), Shape(2, 2, 2, 64, 64, 8), "fp32", "fwd+bwd")
    reference_pair(case, make_inputs(case, 0), make_grad_output(case, 0))
    assert len(traced) == 1


def test_a_mask_mod_that_cannot_be_weakly_referenced_is_planned_without_the_cache(monkeypatch):
    """The traces are cached by a weak reference to the mask mod; a callable object that has
    none (__slots__ without __weakref__), which flex_attention accepts, is traced each time
    instead of raising TypeError."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)

    class Causal:
        __slots__ = ()

        def __call__(self, b, h, q_idx, kv_idx):
            return kv_idx <= q_idx

    case = Case(v.causal(), Shape(2, 4, 2, 256, 256, 16), "fp32")
    i, j = np.arange(256)[:, None], np.arange(256)[None, :]
    calls = _row_span_calls(monkeypatch)
    _assert_equals_dense(case, make_inputs(case, 5), Mods(Causal(), None), mask=j <= i)
    assert calls == [0]  # the mask ignores b: still planned once for both batches


def test_a_shared_plan_holds_its_masks_and_nothing_of_their_windows(monkeypatch):
    """_SHARED_PLAN_BYTES bounds what a shared plan holds: one byte per query-key pair of a
    batch, not the windows the chunks' masks were cut from."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    monkeypatch.setattr(chunk_plan, "_SHARED_PLAN_MIN_PAIRS", 0)
    shape = Shape(2, 4, 4, 256, 256, 16)
    mods = build_mods(v.causal(), shape)
    plans = list(chunk_plan.plan_batches(shape, mods, torch.arange(shape.Hq)))
    plan = plans[0][1]
    assert plans[1][1] is plan
    storages = {mask.untyped_storage().data_ptr(): mask.untyped_storage().nbytes()
                for _, mask, _ in plan}
    assert sum(storages.values()) == shape.Sq * shape.Skv


def test_key_ranges_are_skipped_and_chunks_grow_where_rows_see_few_keys(monkeypatch):
    """What the dense comparison above covers: the causal golden really skips key columns,
    and its first chunks are taller than a full-width chunk."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    shape = Shape(1, 4, 4, 256, 256, 16)
    for variant in (v.causal(), v.sliding_window(40)):
        case = Case(variant, shape, "bf16")
        chunks = _chunks_of(case, make_inputs(case, 0), build_mods(variant, shape))
        widths = [c.keys.stop - c.keys.start for c in chunks]
        heights = [c.rows.stop - c.rows.start for c in chunks]
        assert min(widths) < shape.Skv, variant.name  # key columns skipped
        assert max(heights) > _SMALL_CHUNKS // (shape.Hq * shape.Skv), variant.name
        assert all(c.q.shape[0] * h * w <= _SMALL_CHUNKS
                   for c, h, w in zip(chunks, heights, widths) if h > 1)
    assert widths[-1] == 40 + heights[-1] - 1  # a sliding window: the keys on both sides


def test_chunks_of_rows_that_see_nothing_give_zero_and_minus_inf_like_a_dense_evaluation(
        monkeypatch):
    """Rows 40.. see no key: whole chunks of them are skipped, the result is still the dense
    one (out = 0, lse = -inf there)."""
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", _SMALL_CHUNKS)
    shape = Shape(2, 4, 2, 256, 256, 16)
    case = Case(v.causal(), shape, "fp32")
    inputs = make_inputs(case, 4)

    def rows_from_40_see_nothing(b, h, q_idx, kv_idx):
        return (q_idx < 40) & (kv_idx <= q_idx)

    mods = Mods(rows_from_40_see_nothing, None)
    i, j = np.arange(256)[:, None], np.arange(256)[None, :]
    _assert_equals_dense(case, inputs, mods, mask=(i < 40) & (j <= i))
    empty = [c for c in _chunks_of(case, inputs, mods) if c.keys == slice(0, 0)]
    assert empty and all(c.rows.start >= 40 for c in empty)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    assert torch.all(out[:, :, 40:] == 0) and torch.all(lse[:, :, 40:] == -math.inf)


@pytest.mark.parametrize("multiple", [8, 16])
def test_chunks_cut_by_key_range_take_whole_blocks_of_rows(monkeypatch, multiple):
    """MKL runs a product's rows in blocks: each chunk a window is cut into has a multiple of
    CHUNK_ROW_MULTIPLE rows, all but the window's last; the chunks still cover the window's
    rows once, in order, each within CHUNK_SCORE_ELEMENTS (the dense comparisons above check
    the values, with the default multiple)."""
    monkeypatch.setattr(chunk_plan, "CHUNK_ROW_MULTIPLE", multiple)
    rows, keys, heads = 300, 512, 4
    monkeypatch.setattr(chunk_plan, "CHUNK_SCORE_ELEMENTS", heads * keys * 20)  # 20 full rows
    causal = torch.arange(keys)[None, :] <= torch.arange(rows)[:, None] + 100
    cuts = list(chunk_plan._cut_by_key_range(causal[None], rows, heads))
    assert [c[0] for c in cuts[1:]] == [c[1] for c in cuts[:-1]]
    assert cuts[0][0] == 0 and cuts[-1][1] == rows
    assert all((stop - start) % multiple == 0 for start, stop in cuts[:-1])
    assert len(cuts) > 3
    for start, stop in cuts[:-1]:  # every key up to the chunk's last row's is kept
        assert (stop - start) * min(keys, stop + 100) * heads <= chunk_plan.CHUNK_SCORE_ELEMENTS
    monkeypatch.setattr(chunk_plan, "CHUNK_ROW_MULTIPLE", 1)  # the rule is what aligns them
    unaligned = list(chunk_plan._cut_by_key_range(causal[None], rows, heads))
    assert any((stop - start) % multiple for start, stop in unaligned[:-1])


@pytest.mark.parametrize("layout", ["whole words", "ragged width", "offset view", "strided"])
def test_first_and_last_key_seen_match_their_definition_on_every_layout(layout):
    """The plan's scan of each row's first and last key seen, word by word where rows are
    whole 8-byte words and byte by byte elsewhere, against a plain loop over the rows; rows
    that see no key, one key, the first or the last key included."""
    gen = torch.Generator().manual_seed(3)
    keys = {"whole words": 64, "ragged width": 61, "offset view": 64, "strided": 64}[layout]
    seen = torch.rand(40, keys + 8, generator=gen) < 0.05
    seen[0] = False  # sees nothing
    seen[1] = False
    seen[1, 0] = True  # only the first key
    seen[2] = False
    seen[2, keys - 1] = True  # only the last key (of the rows as scanned, below)
    seen[3] = True
    counts = {"whole words": seen[:, :keys], "ragged width": seen[:, :keys],
              "offset view": seen[:, 3:keys + 3], "strided": seen[::2, :keys]}[layout]
    if layout == "offset view":
        counts[2] = False
        counts[2, keys - 1] = True
    counts = counts.contiguous() if layout == "whole words" else counts
    counts = counts.view(torch.uint8)
    first, last = chunk_plan._first_and_last_seen(counts)
    for row, keys_seen in enumerate(counts.bool().tolist()):
        cols = [col for col, sees in enumerate(keys_seen) if sees]
        if cols:
            assert (int(first[row]), int(last[row])) == (cols[0], cols[-1]), (layout, row)
        else:  # the documented values for a row that sees nothing
            assert (int(first[row]), int(last[row])) == (0, keys - 1), (layout, row)
