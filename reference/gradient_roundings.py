"""The roundings of a 16-bit backward's operands to the case dtype, per gradient row: dS for
the dS K and dS^T Q products (dQ, dK), P for the P^T dO product (dV). The gradients' analogue
of P's rounding for the P V product (reference/probability_rounding.py): a correct kernel
draws them, the baseline (autograd through its own forward, reference/kernel.py) draws P's
and not dS's, and in a row held by a few terms one draw is the row's whole error.

Eager flex_attention rounds dS twice (torch 2.13, ``sdpa_dense_backward``): the mod's joint
graph, traced with the score in the query's dtype, converts the incoming gradient P (dP -
delta) to that dtype before the mod's derivative, and ``grad_scores * scale`` is converted
again before ``grad_scores @ key``; it rounds the normalized P for ``softmax_scores.to(
query.dtype).T @ grad_out``. FlashAttention and flex_attention's Triton template round dS and
P once each for those products. Each rounding is relative, of RMS at most u / sqrt(3) (below
float16's normal range the fixed spacing, which reference/underflow_noise.py sizes), and
independent from pair to pair, so each term of dQ_i = scale sum_j dS_ij k_j moves by
scale sqrt(DS_ROUNDINGS / 3) |dS_ij| rms(k_j), of dK_j likewise, and of dV_j = sum_i P_ij dO_i
by P_ij rms(dO_i) / sqrt(3), in units of u; sized by the largest term of each row, as the
output is (GradientOperandRounding). Unsized, eager's correct bfloat16 and float16 backward
failed dQ rows of the fuzzed case ``composed-scale2-cap20-alibi8/b2-h4x1-s257x31-d8`` on 2
and 3 of 700 seeds (up to 1.19x): its two roundings of dS (reproduced bit for bit) moved the
row by 0.00435 where the baseline's error was 0.000267 (docs/oracle.md, "P's rounding")."""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs
from cases.model import Case
from reference.pair_terms import PairTerms
from reference.probability_rounding import P_DRAWS_COVERED
from reference.row_sizes import RowSizes, mean_square

#: How many times a correct kernel rounds each dS_ij (eager: twice, above).
DS_ROUNDINGS = 2


class GradientOperandRounding(RowSizes):
    """Per row of dQ, dK and dV, P_DRAWS_COVERED RMS of the roundings of its largest term (as
    for the output, reference/probability_rounding.py: where many terms hold a row the
    baseline's draw is a stable one), in units of the dtype's u, chunk by chunk: for dQ_i the
    largest scale^2 DS_ROUNDINGS dS_ij^2 ms(k_j) / 3 over its keys, for dK_j the same over
    its rows and the query heads that share its head, for dV_j the largest P_ij^2 ms(dO_i)
    / 3. The row rule alone adds them (row_noise.RowNoise.row_only)."""

    draws = P_DRAWS_COVERED
    row_only = True

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        device = inputs.q.device
        self.group, self.scale = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
        self.dq = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=device)
        self.dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=device)
        self.dv = torch.zeros_like(self.dk)

    def add(self, t: PairTerms) -> None:
        scale, group = self.scale, self.group
        var_ds = t.d_scores.square().mul_(scale ** 2 * DS_ROUNDINGS / 3.0)  # [Hq, n, m], u^2
        ms_k = mean_square(t.k).repeat_interleave(group, 0).transpose(1, 2)  # [Hq, 1, m]
        self.dq[t.b, :, t.rows] = (var_ds * ms_k).amax(-1)
        _keep_largest(self.dk, t, (var_ds * mean_square(t.q)).amax(1), group)
        del var_ds
        var_p = t.probs.square().div_(3.0).mul_(mean_square(t.d_out))
        _keep_largest(self.dv, t, var_p.amax(1), group)

    def result(self) -> dict[str, torch.Tensor]:
        return {name: (self.draws * var.sqrt()).float()
                for name, var in (("dq", self.dq), ("dk", self.dk), ("dv", self.dv))}


def _keep_largest(acc: torch.Tensor, t: PairTerms, per_query_head: torch.Tensor,
                  group: int) -> None:
    """Keep in ``acc`` ([Bkv, Hkv, Skv]) the largest of it and one chunk's [Hq, m] largest
    terms over its rows at its kept keys, over the query heads that share each key/value
    head."""
    full = torch.zeros_like(acc[t.kv_batch])
    full[:, t.keys] = per_query_head.unflatten(0, (-1, group)).amax(1)
    acc[t.kv_batch] = torch.maximum(acc[t.kv_batch], full)
