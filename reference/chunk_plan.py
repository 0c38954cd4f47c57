"""How the golden cuts a case into query chunks: which rows go together, the mask of those
rows, and the key columns any of them sees (reference/kernel.py runs one chunk at a time).

Memory stays bounded: one batch at a time, query rows in chunks whose score matrix [Hq, rows,
kept keys] holds at most CHUNK_SCORE_ELEMENTS, and key columns that the mask excludes for a
whole chunk are skipped (exactly: they would contribute exp(-inf) = 0). Chunks are cut by the
key range their rows see, so rows that see few keys go in taller chunks, whose products are
larger matmuls; a mask that does not depend on b is planned so for the first batch only, and
the plan is reused by the others, where the batches are large enough for that to pay and their
mask small enough to hold (shared_plan). The mask is evaluated point by point, as
flex_attention defines it (cases.pointwise.evaluate_mask).

``plan_batches(s, mods, heads)`` (``s`` the case's Shape) is the entry: for each batch in
order, (b as a [1] tensor, its chunks as (rows slice, mask broadcastable to [Hq, rows, Skv] or
None, kept keys as a slice or an index tensor)). ``shared_plan`` gives those chunks once, as a
list, where one plan serves every batch.
"""
from __future__ import annotations

import weakref

import torch

from cases.model import Shape
from cases.pointwise import evaluate_mask, mask_dependence
from cases.variants import Mods

#: Upper bound for one chunk's score matrix [Hq, rows, kept keys], in elements: 24 MiB of
#: float64. Not more, because glibc's malloc serves a block of 32 MiB or more with fresh pages
#: from mmap every time: a chunk's scores, and every intermediate of its score_mod, would then
#: be page-faulted in again chunk after chunk, which cost more than the arithmetic (8 Mi
#: elements took 2-3x the time of 3 Mi). Smaller blocks are reused from the heap.
CHUNK_SCORE_ELEMENTS = 3 * 1024 * 1024

#: A chunk takes a multiple of this many rows where it has at least as many (the rest goes to
#: the next chunk): MKL's float64 products run their rows in blocks, and chunks of 99 or 101
#: rows left a partial one. The products alone ran 1-9% faster, the goldens 0-8% (causal and
#: ALiBi, S4096 and S8192): about the host's noise, never slower by more (docs/performance.md).
CHUNK_ROW_MULTIPLE = 16

#: The mask is evaluated on this many full-width chunks of rows at once (see _row_spans).
_WINDOW_CHUNKS = 4

#: A mask that does not depend on b is evaluated and scanned for key ranges (the windows' masks,
#: each row's first and last key, each chunk's kept keys) once, for the first batch, and the
#: plan is reused by the others, when a batch has at least this many query-key pairs: that
#: bookkeeping took 49-66 ms per batch of causal at S4096 (10-13% of that batch's golden), and
#: telling whether the mask depends on b (mask_dependence) took 10-15 ms then (under 1 ms
#: since it no longer traces). The plan holds the whole batch's mask meanwhile, so only up to
#: _SHARED_PLAN_BYTES of it (one byte per entry).
_SHARED_PLAN_MIN_PAIRS = 1 << 22
_SHARED_PLAN_BYTES = 64 << 20


def plan_batches(s: Shape, mods: Mods, heads: torch.Tensor):
    """(b as a [1] tensor, its chunks' (rows, mask, kept keys)) for each batch in order.

    The chunks are planned batch by batch, lazily, unless the mask does not depend on b
    (cases.pointwise.mask_dependence, exact or erring towards a dependence): then the first
    batch's plan, held as a list, serves every batch (see _SHARED_PLAN_MIN_PAIRS)."""
    batches = [torch.tensor([b], device=heads.device) for b in range(s.B)]
    pays = s.B > 1 and mods.mask_mod is not None and s.Sq * s.Skv >= _SHARED_PLAN_MIN_PAIRS
    plan = shared_plan(s, mods, heads) if pays else None
    for batch in batches:
        yield batch, _planned(s, mods, batch, heads) if plan is None else plan


def shared_plan(s: Shape, mods: Mods, heads: torch.Tensor) -> list | None:
    """The chunks of every batch, planned once (for b = 0) as a list, where one plan serves
    all: there is no mask, or it does not depend on b and holding it takes at most
    _SHARED_PLAN_BYTES; None otherwise."""
    if mods.mask_mod is not None:
        depends = _mask_dependence_of(mods.mask_mod, heads.device)
        held_bytes = ((s.Hq if "h" in depends else 1) * (s.Sq if "q_idx" in depends else 1)
                      * s.Skv)
        if "b" in depends or held_bytes > _SHARED_PLAN_BYTES:
            return None
    # Each mask is copied out of its window: a window view would also hold the window's rows
    # that were handed on to the next window (see _row_spans).
    first = torch.tensor([0], device=heads.device)
    return [(span, None if mask is None else mask.clone(), keys)
            for span, mask, keys in _planned(s, mods, first, heads)]


def _planned(s: Shape, mods: Mods, batch: torch.Tensor, heads: torch.Tensor):
    for span, mask in _row_spans(s, mods, batch, heads):
        yield span, mask, _kept_keys(mask, s.Skv)


#: mask_mod -> {device: mask_dependence}: reference.golden.reference_pair plans the same mods up
#: to four times (golden, baseline, their gradients).
_MASK_DEPENDENCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _mask_dependence_of(mask_mod, device: torch.device) -> frozenset[str]:
    try:
        known = _MASK_DEPENDENCE.setdefault(mask_mod, {})
    except TypeError:  # a callable with no weak reference (__slots__) or no hash: not cached
        return mask_dependence(mask_mod, device)
    if device not in known:
        known[device] = mask_dependence(mask_mod, device)
    return known[device]


def _row_spans(s: Shape, mods: Mods, batch: torch.Tensor, heads: torch.Tensor):
    """(rows, mask of those rows) of one batch, the rows cut so that each chunk's score
    matrix [Hq, rows, kept keys] holds at most CHUNK_SCORE_ELEMENTS.

    The mask is evaluated on windows of _WINDOW_CHUNKS full-width chunks of rows; a window's
    rows are then grouped by the key range they see, so a chunk whose rows see few keys (the
    first rows of a causal mask, a sliding window) takes more rows: fewer, taller chunks, whose
    products are larger matmuls. Without a mask every chunk is full width.
    """
    full_width_rows = _aligned_stop(0, max(1, CHUNK_SCORE_ELEMENTS // (s.Hq * s.Skv)))
    window = full_width_rows * (_WINDOW_CHUNKS if mods.mask_mod is not None else 1)
    all_keys = torch.arange(s.Skv, device=heads.device)
    w0 = 0
    while w0 < s.Sq:
        q_idx = torch.arange(w0, min(w0 + window, s.Sq), device=heads.device)
        mask = _evaluate_mask(mods, batch, heads, q_idx, all_keys)
        if mask is None:
            yield slice(w0, w0 + len(q_idx)), None
            w0 += len(q_idx)
            continue
        cuts = list(_cut_by_key_range(mask, len(q_idx), s.Hq))
        if len(cuts) > 1 and w0 + len(q_idx) < s.Sq:
            cuts.pop()  # cut short by the window's end: the next window starts with its rows
        for r0, r1 in cuts:
            rows = slice(r0, r1) if mask.shape[-2] > 1 else slice(0, 1)  # a row-free mask
            yield slice(w0 + r0, w0 + r1), mask[..., rows, :]
        w0 += cuts[-1][1]


def _cut_by_key_range(mask: torch.Tensor, num_rows: int, num_heads: int):
    """(first, stop) row ranges of a window whose kept keys (from the first to the last key
    any of its rows sees) times rows times heads stay within CHUNK_SCORE_ELEMENTS; a chunk
    has at least one row, and a multiple of CHUNK_ROW_MULTIPLE where it has that many. Rows
    that see no key widen nothing."""
    seen = mask.reshape(-1, *mask.shape[-2:]).view(torch.uint8)  # [heads or 1, rows or 1, Skv]
    counts = seen[0] if len(seen) == 1 else seen.amax(0)  # a pass saved: what one head sees
    first, last = _first_and_last_seen(counts)
    first, last, sees_any = first.tolist(), last.tolist(), counts.amax(-1).bool().tolist()
    if len(sees_any) == 1:  # the mask ignores q_idx: every row sees the same keys
        first, last, sees_any = first * num_rows, last * num_rows, sees_any * num_rows
    start, row = 0, 0
    lo = hi = None  # the key range of rows start..row-1
    while row < num_rows:
        if sees_any[row]:
            new_lo = first[row] if lo is None else min(lo, first[row])
            new_hi = last[row] if hi is None else max(hi, last[row])
            if row > start and (row - start + 1) * (new_hi - new_lo + 1) * num_heads \
                    > CHUNK_SCORE_ELEMENTS:
                stop = _aligned_stop(start, row)
                yield start, stop
                start, row, lo, hi = stop, stop, None, None  # the rows past stop again
                continue
            lo, hi = new_lo, new_hi
        row += 1
    yield start, num_rows


def _first_and_last_seen(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and the last key each row of ``counts`` ([rows, Skv] of 0 and 1, uint8) sees
    (for a row that sees none: 0 and Skv - 1). torch's reductions over bytes that return an
    index (max, argmax) run a byte at a time: 0.75-0.8 ms each on a causal window of
    [384, 4096], where uint8 amax takes 0.014 ms. So where the rows are whole 8-byte words,
    the word that holds the first (the last) key seen is found among Skv / 8 words, and the key
    among its 8 bytes: argmax's first maximum, on 8x fewer entries."""
    rows, keys = counts.shape
    if not (keys % 8 == 0 and counts.stride(-1) == 1 and counts.stride(0) % 8 == 0
            and counts.storage_offset() % 8 == 0):  # not whole words: a byte at a time
        return counts.argmax(-1), keys - 1 - counts.flip(-1).argmax(-1)
    seen_words = (counts.view(torch.int64) != 0).view(torch.uint8)  # [rows, Skv / 8]
    first_word = seen_words.argmax(-1)
    last_word = seen_words.shape[-1] - 1 - seen_words.flip(-1).argmax(-1)
    words = counts.unflatten(-1, (-1, 8))  # [rows, Skv / 8, 8]: the bytes of each word
    row = torch.arange(rows, device=counts.device)
    first = first_word * 8 + words[row, first_word].argmax(-1)
    last = last_word * 8 + 7 - words[row, last_word].flip(-1).argmax(-1)
    return first, last


def _aligned_stop(start: int, stop: int) -> int:
    """``stop`` moved down so that the chunk start..stop has a multiple of CHUNK_ROW_MULTIPLE
    rows, where it has at least that many."""
    rows = stop - start
    return start + (rows - rows % CHUNK_ROW_MULTIPLE if rows >= CHUNK_ROW_MULTIPLE else rows)


def _evaluate_mask(mods: Mods, b, h, q_idx, kv_idx) -> torch.Tensor | None:
    """The mask of one chunk, broadcastable to [Hq, n, Skv]; None when nothing is masked.

    A head or row dimension the mask does not depend on comes back from vmap expanded (stride
    0): it is kept at size 1, a view, so the key-range scans (_cut_by_key_range, _kept_keys)
    read each distinct row once. The key dimension keeps its length: it says which columns
    exist.
    """
    if mods.mask_mod is None:
        return None
    mask = evaluate_mask(mods.mask_mod, b, h, q_idx, kv_idx)[0]
    for dim in range(mask.dim() - 1):
        if mask.stride(dim) == 0:  # every entry along dim is the same one
            mask = mask.narrow(dim, 0, 1)
    return mask


def _kept_keys(mask: torch.Tensor | None, num_keys: int) -> slice | torch.Tensor:
    """The key columns that any row of the chunk may see: a slice when contiguous."""
    if mask is None:
        return slice(0, num_keys)
    # uint8 amax: any(0) over bytes took 25x as long (see _first_and_last_seen)
    visible = mask.reshape(-1, mask.shape[-1]).view(torch.uint8).amax(0)
    return _as_slice(visible.nonzero().flatten())


def _as_slice(cols: torch.Tensor) -> slice | torch.Tensor:
    if len(cols) == 0:
        return slice(0, 0)
    first, last = int(cols[0]), int(cols[-1])
    if last - first + 1 == len(cols):
        return slice(first, last + 1)
    return cols
