"""What the roundings of dS and P to float16 lose below its normal range, per gradient row
(underflow_magnitudes): the third of the row noise sources of reference/row_noise.py, which
adds it to the others."""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.variants import Mods
from reference.pair_terms import PairTerms
from reference.row_sizes import DRAWS_COVERED, RowSizes, add_key_rows, mean_square, over_pairs


def underflow_magnitudes(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor,
                         lse: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row of dQ, dK and dV, the RMS over the head dim of what the roundings of dS and P
    to a case dtype whose exponent range is narrower than float32's (float16) lose to
    underflow (``{"dq": [B, Hq, Sq], "dk"/"dv": [Bkv, Hkv, Skv]}``, in units of the case
    dtype's unit roundoff). Below the smallest normal number a rounding is to a fixed spacing,
    2^-24 in float16, an absolute error that no relative rounding (the dtype term) models:
    about min(|x|, spacing / sqrt(12)) RMS for a value x, of which the part beyond a relative
    rounding's is sized (subnormal_rounding_variance).

    dS: every backward rounds dS to the case dtype before its dQ and dK products, some times a
    factor c: c = 1 in flex_attention's Triton template and FlashAttention, which scale dQ and
    dK afterwards; c = the softmax scale in eager flex_attention. Sized with the coarser
    spacing of the two, 2^-24 / scale, where c dS is subnormal. With inputs x4 the dS of a key
    that no row attends are all that small, and its dK row is made of them: eager's dK failed
    such rows by up to 3.4x (docs/oracle.md). dQ_i = scale sum_j dS_ij k_j and
    dK_j = scale sum_i dS_ij q_i sum the roundings in quadrature.

    P: every backward (fused kernels and eager alike) recomputes the normalized P_ij =
    exp(s_ij - lse_i) and rounds it to the case dtype for dV_j = sum_i P_ij dO_i. The baseline
    rounds its forward's unnormalized P (largest 1 in each row) instead, its row's normalizer
    times larger, so below 2^-14 less often and there at a spacing that many times finer
    relative to it: where a key is attended by no row, dV_j is made of P below 2^-14, and
    correct backwards failed such dV rows by up to 4.4x (ALiBi with slopes on k - q both ways,
    inputs x1; docs/oracle.md).

    DRAWS_COVERED RMS of each, as in the other sizes (tests/test_float16_underflow.py holds the
    model against the roundings themselves: one RMS is a median 0.25 of the size)."""
    return over_pairs(case, inputs, mods, out, lse, grad_out, [UnderflowSizes(case, inputs)])[0]


class UnderflowSizes(RowSizes):
    """underflow_magnitudes, chunk by chunk (the baseline keeps dS in float32 and rounds its
    unnormalized P: it does not draw these roundings)."""

    unshared = True

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        dtype = torch_dtype(case.dtype)
        self.scale, self.group = 1.0 / math.sqrt(s.D), s.Hq // s.Hkv
        self.tiny = torch.finfo(dtype).tiny
        self.eps = torch.finfo(dtype).eps
        self.spacing = self.tiny * self.eps  # of a subnormal number: 2^-24 in float16
        self.to_dtype_units = DRAWS_COVERED / (self.eps / 2)  # u = eps / 2
        self.dq = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=inputs.q.device)
        self.dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=inputs.q.device)
        self.dv = torch.zeros_like(self.dk)

    def add(self, t: PairTerms) -> None:
        scale, group, tiny = self.scale, self.group, self.tiny
        # dS's rounding times the softmax scale, which dQ and dK carry
        var = subnormal_rounding_variance(t.d_scores, scale, tiny, self.spacing / scale,
                                          self.eps).mul_(scale ** 2)
        self.dq[t.b, :, t.rows] = torch.bmm(
            var, mean_square(t.k).repeat_interleave(group, 0)).squeeze(-1)
        add_key_rows(self.dk, t, torch.bmm(var.transpose(1, 2), mean_square(t.q)), group)
        var = subnormal_rounding_variance(t.probs, 1.0, tiny, self.spacing, self.eps)
        add_key_rows(self.dv, t, torch.bmm(var.transpose(1, 2), mean_square(t.d_out)),
                     group)

    def result(self) -> dict[str, torch.Tensor]:
        return {name: (self.to_dtype_units * var.sqrt()).float()
                for name, var in (("dq", self.dq), ("dk", self.dk), ("dv", self.dv))}


def subnormal_rounding_variance(values: torch.Tensor, factor: float, tiny: float,
                                 spacing: float, eps: float) -> torch.Tensor:
    """Per value x, what the variance of its rounding where ``factor`` x is below the dtype's
    smallest normal number ``tiny`` (``spacing``: x's spacing there), min(|x|, spacing /
    sqrt(12))^2, adds to that of a rounding relative to x, (|x| eps)^2 / 12, which the dtype
    term covers (at least 0: just below ``tiny`` the two are the same); 0 for normal
    numbers. Without the subtraction, P around 2^-14 (full attention over 16,384 keys) gave
    dV rows a size of 1.3x u rms(G) that a correct backward did not need (a review)."""
    size = values.abs()
    relative = (size * eps).square_().div_(12.0)
    return size.clamp_max(spacing / math.sqrt(12.0)).square_().sub_(relative).clamp_min_(0.0) \
        .masked_fill_(size * factor >= tiny, 0.0)


def underflows_before_float32(dtype: torch.dtype) -> bool:
    """Whether ``dtype``'s normal numbers end above float32's (float16): its dS and P can
    underflow where a float32 kernel's do not."""
    return torch.finfo(dtype).tiny > torch.finfo(torch.float32).tiny
