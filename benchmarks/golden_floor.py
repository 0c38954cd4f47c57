"""The work of the golden that no softmax can take away: its two products and the score mod,
on the golden's own chunks, with nothing of the softmax.

``products_and_score_mod(case, inputs)`` runs, chunk by chunk as the golden runs them
(its ``query_chunks``, so the planning is included: the mask evaluated and scanned for key ranges,
the operands made in float64, V with its column of ones): q k^T, then the score mod on every
score of the chunk, point by point as flex_attention defines it, or the addend of a mod that
adds to the score accumulated by that product (the golden's own ``chunk_scores``), then the
product of those scores with V. The mask is
not applied, the softmax passes (row maximum, shift, exp2) and the normalization are left out
and no output is written, so its output means nothing; its time is a floor: ``unmasked flops /
this time`` is about the highest rate, and share of the matmul rate, that a golden evaluating
the mod this way could reach on these chunks with a softmax that cost nothing
(benchmarks/bench_golden.py reports it beside the golden's own). About: a measured floor, not
a proven one; what the caches hold between the steps differs from the golden's
(docs/performance.md measured such effects at 0-8%). With ``with_score_mod=False``, the
products alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cases.inputs import Inputs  # noqa: E402
from cases.model import Case  # noqa: E402
from cases.variants import Mods, build_mods  # noqa: E402
from reference.chunks import query_chunks  # noqa: E402  the golden's own
from reference.kernel import chunk_scores  # noqa: E402
from reference.heap import keep_freed_heap  # noqa: E402


def products_and_score_mod(case: Case, inputs: Inputs, with_score_mod: bool = True) -> float:
    """Run the floor of ``case``'s golden (see the module docstring); returns a checksum."""
    keep_freed_heap()
    mods = build_mods(case.variant, case.shape, inputs.q.device)
    products_only = Mods(mods.mask_mod, None)
    checksum = 0.0
    for chunk in query_chunks(case, inputs, mods, torch.float64, addends_shared=True):
        checksum += _floor_of_chunk(chunk, mods if with_score_mod else products_only)
        del chunk  # batch by batch, its K and V go before the next's are made, as in the golden
    return checksum


def _floor_of_chunk(chunk, mods: Mods) -> float:
    """The products (and the score mod, if ``mods`` has one) of one chunk, as reference.kernel's
    ``_attend`` computes them (its ``chunk_scores``: an addend accumulated by the product, or
    the mod evaluated on the scores); everything it made is freed on return, as there, so the
    next chunk's products can reuse that (cached) memory."""
    hq, n, _ = chunk.q.shape
    k_sel = chunk.k[:, chunk.keys]
    m = k_sel.shape[1]
    if m == 0:
        return 0.0
    scores = chunk_scores(chunk, mods, chunk.q, k_sel)
    out = torch.bmm(scores.view(hq // chunk.group, chunk.group * n, m),
                    chunk.v_ones[:, chunk.keys])
    return float(out[0, 0, 0])
