"""The rounding of P for the P V product in a 16-bit forward, per output row: a draw the
baseline makes and a correct backend makes again, independently, so that in a row held by a
few keys the two draws' ratio is anything.

Every 16-bit kernel we know rounds the probabilities to the case dtype before the P V
product and takes the normalizer from them unrounded: eager flex_attention rounds the
normalized P (``softmax(scores).to(query.dtype) @ value``), FlashAttention and
flex_attention's Triton template the unnormalized exp(s - m) at their running maximum m,
and the baseline exp(s - rowmax) (reference/kernel.py). A relative rounding e_ij of P_ij
moves O_i by sum_j e_ij P_ij V_j, e_ij of RMS at most u / sqrt(3) (a spacing of up to 2u
P_ij, whatever scale the kernel rounds it at; below float16's normal range the fixed spacing,
bounded in probability_rounding_sizes), independent from pair to pair. In a row that many keys hold
this is a fraction of u rms(G), and the baseline's draw of it a stable one; in a row that
two to five keys hold whose values partly cancel (rms(G) well below rms(V_j)) it is
1-2 u rms(G), and eager's correct bfloat16 output failed the row rule by up to 1.27x where
the baseline's draw was a tenth of its own (docs/oracle.md, "P's rounding").

Sized as P_DRAWS_COVERED RMS of it; the global and head rules, over many rows, already judge
it by the baseline's draw, so it is not unshared (row_noise.RowNoise)."""
from __future__ import annotations

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from reference.underflow_noise import underflows_before_float32

#: The size is this many RMS of P's rounding. Measured on the fuzzed case eager failed
#: (docs/oracle.md): with 1, the worst of its 1,400 correct runs (seeds 300-999, bf16 and
#: fp16) used 0.73 of its row limit, with 2, 0.55; the weakest margins of faults planted in
#: the smoke matrix's 16-bit S128 and S256 cases fell by 6-26% with 2, by 13-43% with 4.
P_DRAWS_COVERED = 2.0


def probabilities_rounded(case: Case) -> bool:
    """Whether a correct kernel rounds ``case``'s probabilities for the P V product: in every
    16-bit dtype (a float32 kernel multiplies them unrounded)."""
    return case.dtype != "fp32"


def probability_rounding_sizes(case: Case, inputs: Inputs,
                               probability_squares: torch.Tensor) -> torch.Tensor:
    """[B, Hq, Sq] float32: per output row, P_DRAWS_COVERED RMS of what P's rounding moves
    it by, in units of the dtype's u, from the golden's sum_j P_ij^2 ms(V_j) per row
    (``probability_squares``, reference/kernel.chunked_attention): P_ij's relative rounding
    has an RMS of at most u / sqrt(3), so the row's variance is that sum over 3, in u^2.
    In float16, P below 2^-14 rounds to a fixed spacing instead, which adds at most
    spacing^2 / 12 per key beyond the relative rounding (underflow_noise.
    subnormal_rounding_variance): bounded for each row that sees any key by Skv of them
    at the largest ms(V_j), 2^-13 / 12 of it at 8,192 keys (a row spread evenly over 8,192
    keys has 2^-13 / 3 of its ms(V) of its own)."""
    var = probability_squares / 3.0
    dtype = torch_dtype(case.dtype)
    if underflows_before_float32(dtype):
        info = torch.finfo(dtype)
        u = info.eps / 2
        largest_ms_v = float(inputs.v.double().square().mean(-1).max())
        bound = case.shape.Skv * (info.tiny * info.eps) ** 2 / 12.0 / u ** 2 * largest_ms_v
        var = var + torch.where(probability_squares > 0, bound, 0.0)
    return var.sqrt_().mul_(P_DRAWS_COVERED).float()
