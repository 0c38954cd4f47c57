"""The rounding of a 16-bit backward's dS for the dS K product, per dQ row: the gradients'
analogue of P's rounding for the P V product (reference/probability_rounding.py). A correct
kernel draws it, the baseline (autograd through its own forward, reference/kernel.py) does
not, and in a row held by a few terms one draw is the row's whole error.

FlashAttention and flex_attention's Triton template round dS once for that product. Eager
flex_attention (torch 2.13, ``sdpa_dense_backward``) rounds it once (``grad_scores * scale``
converted to the query's dtype before ``grad_scores @ key``) and, under a mod, as many more
times as the mod's joint graph, traced with the score in the query's dtype, works on the
incoming gradient in that dtype: it casts the gradient back to it where a float32 constant
promoted the mod's output (ALiBi's slopes, a bias table), and each constant it multiplies
by that is not a power of two rounds it again (an outside review rebuilt that graph and
eager's dQ bit for bit: once without a mod and under ``scale`` or ``cap``, twice under a mod
ending in ``alibi`` or ``bias``, three times under ``scale2-cap20-alibi8``). Each rounding is
relative, of RMS at most u / sqrt(3), so each term of dQ_i = scale sum_j dS_ij k_j moves by
about scale sqrt(DS_ROUNDINGS / 3) |dS_ij| rms(k_j) in units of u; sized by the row's largest
term, as the output is. Unsized, eager's correct bfloat16 and float16 backward failed dQ rows
of the fuzzed case ``composed-scale2-cap20-alibi8/b2-h4x1-s257x31-d8`` on 2 and 3 of 700 seeds
(up to 1.19x: the row moved by 0.00435 where the baseline's error was 0.000267); with
DS_ROUNDINGS 2 none fails, the worst at 0.83 (docs/oracle.md, "P's rounding"). dK and dV rows
are not sized: no correct kernel the reviews ran came near their limits without it (worst
0.40-0.59), and sizing them let more bfloat16 dK and dV rows 2% off pass (caught in 22%
and 91% of rows without, 6% and 67% with)."""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs
from cases.model import Case
from reference.pair_terms import PairTerms
from reference.row_sizes import RowSizes, mean_square

#: The roundings of each dS_ij sized: an allowance measured on eager (above), not a count.
DS_ROUNDINGS = 2

#: The size is this many RMS of those roundings of a row's largest term: 2, as P's was while
#: it too was added on top of the baseline's row error (reference/probability_rounding.py).
DS_DRAWS_COVERED = 2.0


class GradientOperandRounding(RowSizes):
    """Per dQ row, DS_DRAWS_COVERED RMS of the roundings of its largest term (see the module),
    scale^2 DS_ROUNDINGS max_j dS_ij^2 ms(k_j) / 3 under the root, in units of the dtype's u,
    chunk by chunk. The row rule alone adds it (row_noise.RowNoise.row_only)."""

    draws = DS_DRAWS_COVERED
    row_only = True

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        self.group, self.scale = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
        self.dq = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=inputs.q.device)

    def add(self, t: PairTerms) -> None:
        var_ds = t.d_scores.square().mul_(self.scale ** 2 * DS_ROUNDINGS / 3.0)  # in u^2
        ms_k = mean_square(t.k).repeat_interleave(self.group, 0).transpose(1, 2)  # [Hq, 1, m]
        self.dq[t.b, :, t.rows] = var_ds.mul_(ms_k).amax(-1)

    def result(self) -> dict[str, torch.Tensor]:
        return {"dq": (self.draws * self.dq.sqrt()).float()}
