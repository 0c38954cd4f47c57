"""The rounding of P for the P V product in a 16-bit forward, per output row: a draw the
baseline makes and a correct backend makes again, independently, so that in a row held by a
few terms the two draws' ratio is anything.

Every 16-bit kernel we know rounds the probabilities to the case dtype before the P V
product and takes the normalizer from them unrounded: eager flex_attention rounds the
normalized P (``softmax(scores).to(query.dtype) @ value``), FlashAttention, flex_attention's
Triton template and its CPU template the unnormalized exp(s - m) at their running maximum m
(accumulating in float32), and the baseline exp(s - rowmax) (reference/kernel.py). A
relative rounding e_ij of P_ij moves O_i by sum_j e_ij P_ij V_j, e_ij of RMS at most
u / sqrt(3) (a spacing of up to 2u P_ij, whatever scale the kernel rounds it at),
independent from pair to pair. Where two to five terms hold a row whose values partly cancel
(rms(G) well below rms(V_j)), the baseline's draw was a tenth of eager's, and eager's correct
bfloat16 output failed the row rule by up to 1.27x (docs/oracle.md, "P's rounding").

Where many terms hold a row, the baseline's draw is a stable one (the row rule allows 4
times it): what it can fall short of a correct kernel's by is about the rounding of one term,
so the size is P_DRAWS_COVERED RMS of the rounding of the row's largest term,
2.5 sqrt(max_j P_ij^2 ms(V_j) / 3) in units of u. An outside review measured the whole sum
instead (2 sqrt(sum_j ...)): 1.04-1.27 u rms(G) in rows of many keys with zero-mean V, which
let a bfloat16 row 1% off pass in several smoke cases. The row rule alone takes it
(row_noise.RowNoise.row_only), in quadrature with 4 times the baseline's row error
(REFERENCE_VERSION 39; added on top, it widened rows of many keys too, where that draw is a
stable one: a bfloat16 row 1.5% off was caught in 59% of rows, 98% in quadrature). Added to
the head and global rules, it let decoding shapes' faults pass there (a float16 P rounded to
bfloat16; a 16-bit P V accumulator). The largest term is never below float16's normal range
where a row has at most 16,384 keys (its P is at least 1/16,384 = 2^-14).

Rows that one key holds keep the size too, even a row that sees one key, whose P is 1: a
kernel whose running maximum is not the row's largest score (rounded up to an integer in log2
units, or a constant under a softcap) rounds that P at another scale, by up to u of it.
Bounding those rows by what their other keys weigh (REFERENCE_VERSION 37) failed such kernels
(tests/test_largest_probability_scales.py; docs/oracle.md, "P's rounding")."""
from __future__ import annotations

import torch

from cases.model import Case

#: The size is this many RMS of the rounding of a row's largest term. Added on top of the
#: baseline's row error (REFERENCE_VERSION 36-38) it was 2: the worst of eager's 1,400 correct
#: forwards on the fuzzed case it failed (seeds 300-999, bf16 and fp16) used 0.63 of its row
#: limit. In quadrature with it (39), 2 left a row where two keys of similar P cancel at 1.07x
#: for a kernel that rounds P at one fixed scale, at 0.2% of the scales (an outside review),
#: and eager at 0.84; 2.5 (40) leaves every scale below 0.92 there (docs/oracle.md, "P's
#: rounding").
P_DRAWS_COVERED = 2.5


def probabilities_rounded(case: Case) -> bool:
    """Whether a correct kernel rounds ``case``'s probabilities for the P V product: in every
    16-bit dtype (a float32 kernel multiplies them unrounded)."""
    return case.dtype != "fp32"


def probability_rounding_sizes(largest_pv_terms: torch.Tensor) -> torch.Tensor:
    """[B, Hq, Sq] float32: per output row, P_DRAWS_COVERED RMS of the rounding of its largest
    P V term, in units of the dtype's u, from the golden's max_j P_ij^2 ms(V_j) per row
    (``largest_pv_terms``, reference/kernel.chunked_attention): a relative rounding of RMS at
    most u / sqrt(3)."""
    return (largest_pv_terms / 3.0).sqrt_().mul_(P_DRAWS_COVERED).float()
