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
2 sqrt(max_j P_ij^2 ms(V_j) / 3) in units of u. An outside review measured the whole sum
instead (2 sqrt(sum_j ...)): 1.04-1.27 u rms(G) in rows of many keys with zero-mean V, which
let a bfloat16 row 1% off pass in several smoke cases. The row rule alone adds it
(row_noise.RowNoise.row_only): added to the head and global rules, it let decoding shapes'
faults pass there (a float16 P rounded to bfloat16; a 16-bit P V accumulator). The largest
term is never below float16's normal range where a row has at most 16,384 keys (its P is at
least 1/16,384 = 2^-14).

A row that one key holds, its other keys' probabilities summing to less than HELD_BY_ONE_KEY
(1 - P_max, P normalized), gets the size of what those others weigh instead: (1 - P_max) / u for every term, at most. Its largest
probability is rounded by at most 1 - P_max there, because every kernel rounds it from a
value within that of 1, and 1 is representable: eager rounds its normalized P_max = 1 / sum;
FlashAttention, the templates and the baseline round exp(0) = 1 exactly at the row's maximum.
Each other term P_j <= 1 - P_max is rounded by at most u P_j. A row that sees one key (P = 1,
its output V_j exactly) so gets no size: with it, causal row 0 scaled by 1.005 passed, and by
1.01 on some bfloat16 seeds (an outside review). Only there: a kernel that rescales lazily
(FlashAttention 4 keeps a stale maximum while the row's grows by less than 2^8, in log2
units) rounds its largest term at another scale than 1, but only where a key seen before
weighs at least 2^-8 of it."""
from __future__ import annotations

import torch

from cases.inputs import torch_dtype
from cases.model import Case

#: The size is this many RMS of the rounding of a row's largest term. Measured on the fuzzed
#: case eager failed (docs/oracle.md, "P's rounding"): with 2, the worst of its 1,400 correct
#: forwards (seeds 300-999, bf16 and fp16) uses 0.63 of its row limit, of its 1,400
#: backwards 0.83; the weakest row-rule margins of the fault catalog on the smoke matrix's
#: S128 and S256 cases fell by 9-17%, the global and head rules' not at all.
P_DRAWS_COVERED = 2.0

#: A row whose other keys' probabilities sum to less than this (1 - P_max) is held by its
#: largest key alone (see the module): 2^-16, far below the 2^-9 that a lazy rescale leaves
#: them at least (the key that set a stale maximum, at most 2^8 below the row's in log2
#: units, weighs at least 2^-8 of the largest). tests/test_rows_held_by_one_key.py: a kernel
#: twice as lazy (2^16) passes, and fails where rows held to 2^-8 counted.
HELD_BY_ONE_KEY = 2.0 ** -16


def probabilities_rounded(case: Case) -> bool:
    """Whether a correct kernel rounds ``case``'s probabilities for the P V product: in every
    16-bit dtype (a float32 kernel multiplies them unrounded)."""
    return case.dtype != "fp32"


def probability_unit(case: Case) -> float:
    """u of ``case``'s dtype (half its machine epsilon), the unit of the sizes here."""
    return torch.finfo(torch_dtype(case.dtype)).eps / 2


def largest_pv_terms(probs: torch.Tensor, denom: torch.Tensor, values: torch.Tensor,
                     largest_is_one: bool, unit: float) -> torch.Tensor:
    """[Hq, n]: per row of one golden chunk, its largest term max_j P_ij^2 ms(V_j) (P
    normalized; ms: the mean square over the head dim), and in a row held by one key (1 -
    P_max below HELD_BY_ONE_KEY) at most ((1 - P_max) / ``unit``)^2 max_j ms(V_j), the
    maximum over the chunk's keys (see the module). ``probs`` [Hq, n, m] is the chunk's
    unnormalized P (scaled in place: not read again), ``denom`` [Hq, n, 1] its row sums,
    ``values`` [Hkv, m, D] the keys' V; ``largest_is_one``: each row's largest unnormalized
    term is exactly 1 (the shifted softmax's exp2(0)), else it is found in a pass of its own.
    Fully masked rows give 0."""
    hq, n, m = probs.shape
    hkv = values.shape[0]
    ms_v = values.square().mean(-1)  # [Hkv, m]
    sums = denom.squeeze(-1)
    safe = torch.where(sums > 0, sums, 1.0)
    top = 1.0 if largest_is_one else probs.amax(-1)
    stacked = probs.view(hkv, -1, m)  # the query heads that share a key/value head, stacked
    largest = stacked.mul_(ms_v.sqrt().unsqueeze(1)).amax(-1).view(hq, n).div_(safe)
    rest = (sums - top).clamp_min_(0.0).div_(safe)  # 1 - P_max
    bound = (rest / unit).square_().view(hkv, -1).mul_(ms_v.amax(-1, keepdim=True))
    bound = torch.where(rest < HELD_BY_ONE_KEY, bound.view(hq, n), torch.inf)
    return torch.minimum(largest.square_(), bound)


def probability_rounding_sizes(largest_pv_terms: torch.Tensor) -> torch.Tensor:
    """[B, Hq, Sq] float32: per output row, P_DRAWS_COVERED RMS of the rounding of its largest
    P V term, in units of the dtype's u, from the golden's largest terms per row (max_j
    min(P_ij, (1 - P_max) / u)^2 ms(V_j): ``largest_pv_terms``, written by
    reference/kernel.chunked_attention): a relative rounding of RMS at most u / sqrt(3)."""
    return (largest_pv_terms / 3.0).sqrt_().mul_(P_DRAWS_COVERED).float()
