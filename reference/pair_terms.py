"""The golden's terms per query-key pair, chunk by chunk (float64): P from the stored
log-sum-exp and the score mod's slope (forward), and dP and dS (backward), from which
reference/row_noise.py sizes a float32 kernel's roundings. The chunks, the products and
the mod's evaluation are the golden's own (reference/kernel.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.variants import Mods
from reference.heap import keep_freed_heap
from reference.chunks import query_chunks
from reference.kernel import modded_scores, stacked_product


@dataclass(frozen=True)
class PairTerms:
    """The golden's terms of one query chunk, per query-key pair ([Hq, n, m]: the chunk's rows
    by its kept keys, float64). Operands are the chunk's own (q unscaled). The backward's
    (``d_out``, ``d_probs``, ``d_scores``) are None when no dO was given."""

    b: int
    kv_batch: int
    rows: slice
    keys: slice | torch.Tensor
    q: torch.Tensor  # [Hq, n, D]
    k: torch.Tensor  # [Hkv, m, D]: the kept keys
    v: torch.Tensor  # [Hkv, m, D]
    out: torch.Tensor  # [Hq, n, D]: the golden output's rows
    lse: torch.Tensor  # [Hq, n, 1] (natural log; -inf on fully masked rows)
    scores: torch.Tensor  # q k^T scale, before the score mod
    modded: torch.Tensor  # the scores after the score mod (0 where masked)
    slope: torch.Tensor | None  # d modded / d score, pointwise (None: no score mod, 1)
    probs: torch.Tensor  # P = exp(modded - lse), 0 where masked
    #: [Hq, n, 1]: rows whose pairs that contribute all have one score after the mod (a row
    #: of one key, or a row a mod hides whole with one constant, as HF-style padding does):
    #: a rounding of that score is the same for every pair and cancels in the normalization
    tied: torch.Tensor | None = None
    d_out: torch.Tensor | None = None  # [Hq, n, D]
    d_probs: torch.Tensor | None = None  # dP = dO v^T
    d_scores: torch.Tensor | None = None  # dS = slope * P * (dP - delta): each raw score's
    #: Terms derived from these that several row sizes read (reference/row_noise.py), made
    #: once per chunk by the first that needs them; never changed in place.
    derived: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)


def pair_terms(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor, lse: torch.Tensor,
               grad_out: torch.Tensor | None = None):
    """PairTerms of every golden query chunk, given the golden's ``out`` and ``lse``: P from
    the stored lse; with ``grad_out`` (dO), the backward's terms too, delta from the stored O,
    as fused backward kernels take them."""
    keep_freed_heap()
    for chunk in query_chunks(case, inputs, mods, torch.float64):
        k, v = chunk.k[:, chunk.keys], chunk.v[:, chunk.keys]
        if k.shape[1] == 0:  # every row of the chunk is fully masked
            continue
        scores = stacked_product(chunk.q * chunk.scale, k)
        modded, slope = scores, None
        if mods.score_mod is not None:
            modded, slope = _modded_and_slope(chunk, mods, scores)
        row_lse = lse[chunk.b, :, chunk.rows].unsqueeze(-1).to(modded.dtype)
        # a pair that contributes nothing: masked, in a fully masked row, a score the mod
        # made -inf, or one whose P is 0 in float64 (as a score of -1e30 beside live ones):
        # P = 0 exactly, and its size would be inf * 0 or a huge score's rounding times 0
        dead = ~torch.isfinite(row_lse) | ~torch.isfinite(modded)
        if chunk.mask is not None:
            dead = dead | ~chunk.mask[..., chunk.keys]
        probs = _probabilities(modded, row_lse, dead)
        dead = dead | (probs == 0)
        probs.masked_fill_(dead, 0.0)
        tied = _tied_rows(modded, dead)
        modded = modded.masked_fill(dead, 0.0)
        if slope is not None:
            slope.masked_fill_(dead, 0.0)
        rows_out = out[chunk.b, :, chunk.rows].to(modded.dtype)
        terms = PairTerms(chunk.b, chunk.kv_batch, chunk.rows, chunk.keys, chunk.q, k, v,
                          rows_out, row_lse, scores, modded, slope, probs, tied)
        if grad_out is not None:
            terms = _with_backward(terms, grad_out[chunk.b, :, chunk.rows].to(modded.dtype))
        yield terms


#: Beyond this magnitude float64 holds a row's lse to no better than 2^-22 of log(n).
_LSE_HOLDS_LOG_N = 2.0 ** 30


def _probabilities(modded: torch.Tensor, row_lse: torch.Tensor,
                   dead: torch.Tensor) -> torch.Tensor:
    """P = exp(modded - lse), from the stored lse; but in a row whose lse is beyond
    _LSE_HOLDS_LOG_N (a padded row a mod hides with -1e30 or float32's min, where lse and
    every score round to one value and that P would be 1 for each of its n keys), the row's
    softmax over its live pairs (a chunk holds every key its rows see)."""
    finite = torch.isfinite(row_lse)
    shift = row_lse.masked_fill(~finite, 0.0)
    huge = finite & (row_lse.abs() > _LSE_HOLDS_LOG_N)
    if not bool(huge.any()):
        return (modded.masked_fill(dead, 0.0) - shift).exp_().masked_fill_(dead, 0.0)
    row_max = modded.masked_fill(dead, -float("inf")).amax(-1, keepdim=True)
    probs = (modded.masked_fill(dead, 0.0) - torch.where(huge, row_max, shift)).exp_() \
        .masked_fill_(dead, 0.0)
    return torch.where(huge, probs / probs.sum(-1, keepdim=True), probs)


def _tied_rows(modded: torch.Tensor, dead: torch.Tensor) -> torch.Tensor:
    """[Hq, n, 1]: whether each row's live pairs all share one value of ``modded``."""
    top = modded.masked_fill(dead, -float("inf")).amax(-1, keepdim=True)
    bottom = modded.masked_fill(dead, float("inf")).amin(-1, keepdim=True)
    return top == bottom


def _with_backward(t: PairTerms, d_out: torch.Tensor) -> PairTerms:
    d_probs = stacked_product(d_out, t.v)
    delta = (d_out * t.out).sum(-1, keepdim=True)
    d_scores = (d_probs - delta).mul_(t.probs)
    if t.slope is not None:
        d_scores.mul_(t.slope)
    return replace(t, d_out=d_out, d_probs=d_probs, d_scores=d_scores)


def _modded_and_slope(chunk, mods: Mods, scores: torch.Tensor):
    """The chunk's scores after the score mod, and the mod's slope d modded / d score at each
    (0 where the mod ignores the score), by autograd through the mod, on a copy of the scores
    (a mod may change its score in place: ``score.mul_(2)``). For a mod autograd cannot run
    back through (``(s / 20).tanh_().mul_(20)`` changes what tanh's backward needs; a function
    with no derivative), which flex_attention runs forward all the same, by a central
    difference, a step of 2^-20 of each score's size: the slope only sizes noise (a step
    function of the score gets a slope of its jump over 2 steps where a jump falls within
    one)."""
    leaf = scores.detach().requires_grad_()
    try:
        with torch.enable_grad():
            modded = modded_scores(chunk, mods, leaf.clone()).to(scores.dtype)
            slope = torch.autograd.grad(modded, leaf, torch.ones_like(modded),
                                        allow_unused=True)[0] if modded.requires_grad else None
        modded = modded.detach()
        if slope is None:
            return modded, torch.zeros_like(modded)
        # A value the mod made finite with a slope autograd could not: torch.where's branch
        # not taken (score / d.sqrt() where d = 0) gives 0 * inf = NaN in the backward. The
        # slope is the branch taken's, as the central difference finds it (an outside audit:
        # NaN limits made a correct fp32 backend a MISMATCH).
        lost = ~torch.isfinite(slope) & torch.isfinite(modded)
        if bool(lost.any()):
            slope = torch.where(lost, _central_difference(chunk, mods, scores), slope)
        return modded, slope
    except RuntimeError:  # autograd's, or the mod's own, which the evaluation below raises again
        pass
    modded = modded_scores(chunk, mods, scores.clone()).to(scores.dtype)
    return modded, _central_difference(chunk, mods, scores)


def _central_difference(chunk, mods: Mods, scores: torch.Tensor) -> torch.Tensor:
    """d modded / d score by a central difference, a step of 2^-20 of each score's size;
    0 where it is not finite."""
    step = scores.abs().clamp_min(1.0).mul_(2.0 ** -20)
    above = modded_scores(chunk, mods, scores + step).to(scores.dtype)
    below = modded_scores(chunk, mods, scores - step).to(scores.dtype)
    slope = (above - below).div_(step.mul_(2.0))  # not in place: above may be a captured tensor
    return slope.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
