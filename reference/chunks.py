"""The query chunks that reference/kernel.py computes attention on, one at a time: each
chunk's rows and kept keys (cut by reference/chunk_plan.py), its operands in the compute dtype
(the golden's V with a column of ones), the index vectors its mods are evaluated on, and the
addend of a score mod that adds to the score (cases/score_addend.py), evaluated once for every
batch of a span of rows where it does not depend on b.

Memory stays bounded: one batch at a time (or every batch's K and V, up to
_SPAN_BY_SPAN_EXTRA_BYTES, where the batches share an addend: see query_chunks), query rows in
chunks of bounded size, and key columns that the mask excludes for a whole chunk are skipped
(exactly: they would contribute exp(-inf) = 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.pointwise import check_mods
from cases.score_addend import adds_to_score, score_addend
from cases.score_dtype import traced_score_dtype
from cases.variants import Mods
from reference.chunk_plan import plan_batches, shared_plan

#: The golden's P V product runs on V with a column of ones appended, so the same product
#: gives the softmax normalizer (the row sums of P) without a pass of its own, padded with zero
#: columns to a multiple of this. MKL's float64 kernel computes the output 24 columns at a time
#: on the development VM (AMD EPYC): a width of 64 leaves a partial block and ran at 39-45
#: GFLOP/s at the golden's chunk shapes, 72 columns at 55-75, and 144 faster than 128, more
#: than the zero columns cost (benchmarks/bench_pv_width.py measures it on any machine; where
#: a BLAS has no such blocks they are work for nothing: 12.5% of P V at D = 64, 50% at 16, 32).
_PV_COLUMN_MULTIPLE = 24

#: Where query_chunks hands out chunks span by span (addends shared by the batches), every
#: key/value batch's K and V | 1 are held at once: at most this many bytes beyond one batch's
#: (36 MB at B2 H8 S4096 D64; the largest core case, 428 MB, goes batch by batch).
_SPAN_BY_SPAN_EXTRA_BYTES = 64 << 20


@dataclass(frozen=True)
class Chunk:
    """One query chunk of one batch: its rows, operands in the compute dtype, mask, the index
    vectors the mods are evaluated on, and the key columns any of its rows may see; the
    addend of its score mod where the chunks of its rows share one (see query_chunks)."""

    b: int
    kv_batch: int
    rows: slice
    q: torch.Tensor  # [Hq, n, D]
    k: torch.Tensor  # [Hkv, Skv, D] of kv_batch (shared by the batch's chunks)
    v: torch.Tensor
    v_ones: torch.Tensor | None  # the golden's V | 1 | 0..., see _with_ones_column
    mask: torch.Tensor | None  # broadcastable to [Hq, n, Skv]
    keys: slice | torch.Tensor
    batch: torch.Tensor  # [1]: b
    heads: torch.Tensor  # [Hq]
    q_idx: torch.Tensor  # [n]
    scale: float
    group: int  # query heads per key/value head
    golden: bool  # the float64 golden (scale in q, exp as exp2), not the baseline
    key_norm: float | None  # max ||k_j|| of the batch: the golden's without a score mod
    value_max: float | None  # max |v| of the batch, likewise (both may be inf or NaN)
    score_adds: bool  # the golden's score mod adds to the score (cases/score_addend.py)
    traced_dtype: torch.dtype  # the score's dtype as the mods read it (cases/score_dtype.py)
    addend: torch.Tensor | None = None  # score_addend's, shared by the batches of these rows


def query_chunks(case: Case, inputs: Inputs, mods: Mods, compute_dtype: torch.dtype,
                 requires_grad: bool = False, addends_shared: bool = False):
    """The query chunks of ``case``, batch by batch (operands are leaves that require grad
    when asked, so autograd can run through one chunk at a time).

    With ``addends_shared``, where the golden's score mod adds an addend that does not depend
    on b (cases/score_addend.py) and one plan serves every batch (reference/chunk_plan.py),
    they come span by span instead, each span of rows for every batch in turn, carrying the
    addend evaluated once for all of them: ALiBi at B2 evaluates it half as often. Every
    key/value batch's K and V are then made first and held throughout, up to
    _SPAN_BY_SPAN_EXTRA_BYTES beyond one batch's."""
    s = case.shape
    device = inputs.q.device
    traced_dtype = traced_score_dtype(case)
    check_mods(mods.mask_mod, mods.score_mod, case.variant.token, device, traced_dtype)
    heads = torch.arange(s.Hq, device=device)
    golden = compute_dtype == torch.float64
    score_adds = (golden and mods.score_mod is not None
                  and adds_to_score(mods.score_mod, compute_dtype, (s.B, s.Hq, s.Sq, s.Skv),
                                    device, traced_dtype))
    common = {"heads": heads, "scale": 1.0 / math.sqrt(s.D), "group": s.Hq // s.Hkv,
              "golden": golden, "score_adds": score_adds, "traced_dtype": traced_dtype}
    plan = (_plan_sharing_addends(case, mods, heads, traced_dtype)
            if addends_shared and score_adds else None)
    if plan is not None:
        yield from _span_by_span(case, inputs, mods, plan, requires_grad, common)
        return
    for b, (batch, plan) in enumerate(plan_batches(s, mods, heads)):
        kv_batch = b if s.Bkv == s.B else 0
        k, v, v_ones = _key_value_operands(inputs, kv_batch, compute_dtype, requires_grad)
        key_norm, value_max = (_key_and_value_sizes(k, v) if golden and mods.score_mod is None
                               else (None, None))
        for span, mask, keys in plan:
            yield Chunk(b=b, kv_batch=kv_batch, rows=span, k=k, v=v, v_ones=v_ones, mask=mask,
                        keys=keys, batch=batch, key_norm=key_norm, value_max=value_max,
                        q_idx=torch.arange(span.start, span.stop, device=device),
                        q=_query_operand(inputs, b, span, compute_dtype, requires_grad),
                        **common)
        del k, v, v_ones  # not held while the next batch's are made: 140 MB at the largest case


def _span_by_span(case: Case, inputs: Inputs, mods: Mods, plan: list, requires_grad: bool,
                  common: dict):
    """query_chunks's chunks span by span, the golden's (float64), whose score mod's addend
    does not depend on b: evaluated at b = 0 once for each span, it is every batch's."""
    s = case.shape
    device = inputs.q.device
    operands = [_key_value_operands(inputs, kv_batch, torch.float64, requires_grad)
                for kv_batch in range(s.Bkv)]
    batches = [torch.tensor([b], device=device) for b in range(s.B)]
    all_keys = torch.arange(s.Skv, device=device)
    for span, mask, keys in plan:
        q_idx = torch.arange(span.start, span.stop, device=device)
        addend = score_addend(mods.score_mod, torch.float64, batches[0], common["heads"],
                              q_idx, all_keys[keys], common["traced_dtype"])
        for b, batch in enumerate(batches):
            kv_batch = b if s.Bkv == s.B else 0
            k, v, v_ones = operands[kv_batch]
            yield Chunk(b=b, kv_batch=kv_batch, rows=span, k=k, v=v, v_ones=v_ones, mask=mask,
                        keys=keys, batch=batch, key_norm=None, value_max=None, q_idx=q_idx,
                        addend=addend,
                        q=_query_operand(inputs, b, span, torch.float64, requires_grad),
                        **common)
        del addend  # before the next span's is made: two would be held at once


def _plan_sharing_addends(case: Case, mods: Mods, heads: torch.Tensor,
                          traced_dtype: torch.dtype) -> list | None:
    """The plan that every batch shares, where the golden's chunks may also share the addend
    of its score mod (which adds to the score): there are batches to share it, their K and V
    fit _SPAN_BY_SPAN_EXTRA_BYTES, the addend does not depend on b, and one plan serves every
    batch; None otherwise."""
    s = case.shape
    per_batch = s.Hkv * s.Skv * (s.D + _ones_column_width(s.D)) * 8  # K and V | 1, float64
    if s.B == 1 or (s.Bkv - 1) * per_batch > _SPAN_BY_SPAN_EXTRA_BYTES:
        return None
    if _addend_reads_b(mods.score_mod, heads.device, traced_dtype):
        return None
    return shared_plan(s, mods, heads)


def _addend_reads_b(score_mod, device: torch.device, traced_dtype: torch.dtype) -> bool:
    """Whether the addend of ``score_mod`` (a mod that adds to the score) may depend on b.
    Evaluated on a grid of two batches (b = 0 twice), it comes back expanded along b (stride
    0) where no operation read b: vmap carries a dimension only through the operations that
    read it, whatever the values (the argument of cases.pointwise.mask_dependence). Errs
    towards True (``b * 0`` reads b; an addend not had is taken to read it)."""
    two, one = (torch.zeros(n, dtype=torch.int64, device=device) for n in (2, 1))
    addend = score_addend(score_mod, torch.float64, two, one, one, one, traced_dtype)
    return addend is None or addend.dim() != 4 or addend.stride(0) != 0


def _key_value_operands(inputs: Inputs, kv_batch: int, compute_dtype: torch.dtype,
                        requires_grad: bool):
    """(K, V, V | 1 | 0... or None) of one key/value batch in ``compute_dtype``, the leaves
    that autograd differentiates when asked; V | 1 | 0... is the golden's leaf, V a view of
    it: one copy, one graph per chunk."""
    k = inputs.k[kv_batch].to(compute_dtype).requires_grad_(requires_grad)
    if compute_dtype != torch.float64:
        v = inputs.v[kv_batch].to(compute_dtype).requires_grad_(requires_grad)
        return k, v, None
    v_ones = _with_ones_column(inputs.v[kv_batch], compute_dtype)
    v_ones.requires_grad_(requires_grad)
    return k, v_ones[..., :inputs.v.shape[-1]], v_ones


def _query_operand(inputs: Inputs, b: int, span: slice, compute_dtype: torch.dtype,
                   requires_grad: bool) -> torch.Tensor:
    return inputs.q[b, :, span].to(compute_dtype).requires_grad_(requires_grad)


def kept_key_indices(chunk: Chunk) -> torch.Tensor:
    """The kv_idx of the chunk's kept keys, the grid its mods are evaluated on."""
    return torch.arange(chunk.k.shape[1], device=chunk.k.device)[chunk.keys]


def chunk_addend(chunk: Chunk, mods: Mods, dtype: torch.dtype) -> torch.Tensor | None:
    """The addend of the chunk's score mod (score_addend: [1, Hq, n, m] in its own dtype,
    dimensions it does not depend on expanded), the one its span's batches share where there
    is one, else evaluated for this chunk; None where the mod does not add after all."""
    if chunk.addend is not None:
        return chunk.addend
    return score_addend(mods.score_mod, dtype, chunk.batch, chunk.heads, chunk.q_idx,
                        kept_key_indices(chunk), chunk.traced_dtype)


def _key_and_value_sizes(k: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """The largest ||k_j|| and |v| of a batch's keys and values: where the golden's softmax
    may skip its shift (reference/kernel.py, _UNSHIFTED_LOG2_BOUND); inf where they overflow,
    NaN where they hold one."""
    return float(k.detach().norm(dim=-1).amax()), float(v.detach().abs().amax())


def _with_ones_column(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[Hkv, Skv, D] -> [Hkv, Skv, W] in ``dtype``: V, a column of ones, zero columns up to W,
    the next multiple of _PV_COLUMN_MULTIPLE (a new tensor: the golden's leaf for autograd)."""
    hkv, skv, d = v.shape
    v_ones = torch.zeros(hkv, skv, _ones_column_width(d), dtype=dtype, device=v.device)
    v_ones[..., :d] = v
    v_ones[..., d] = 1.0
    return v_ones


def _ones_column_width(d: int) -> int:
    """The width of the golden's V | 1 | 0... for V of width ``d``."""
    return -(-(d + 1) // _PV_COLUMN_MULTIPLE) * _PV_COLUMN_MULTIPLE
