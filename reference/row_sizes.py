"""What every kind of row size in reference/row_noise.py shares: the one pass over the
golden's pair terms that feeds them (over_pairs), their base class (RowSizes), how many RMS
of a noise a size is by default, the spacing of a dtype's numbers at the golden's values, and
two small sums over a chunk's terms (add_key_rows, mean_square)."""
from __future__ import annotations

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.variants import Mods
from reference.pair_terms import PairTerms, pair_terms

#: A row of one term holds one draw of each rounding: its limit allows this many RMS of it.
DRAWS_COVERED = 4.0


def over_pairs(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor, lse: torch.Tensor,
               grad_out: torch.Tensor | None, parts: list["RowSizes"]
               ) -> list[dict[str, torch.Tensor]]:
    """Each part's sizes, from one pass over the golden's pair terms (pair_terms), which every
    part reads and none changes."""
    if not parts:
        return []
    for t in pair_terms(case, inputs, mods, out, lse, grad_out):
        for part in parts:
            part.add(t)
        del t  # freed before the next chunk's terms are made
    return [part.result() for part in parts]


class RowSizes:
    """One kind of row size, summed chunk by chunk: ``add`` each chunk's PairTerms, then
    ``result``. A size is ``draws`` RMS of the noise; ``unshared``: the baseline's own
    computation does not draw that noise (row_noise.RowNoise); ``sized``: the size widens the
    row rule (False: a noise another part's sizes already hold, counted only as unshared);
    ``row_only``: the size widens the row rule alone (row_noise.RowNoise.row_only)."""

    draws: float = DRAWS_COVERED
    unshared: bool = False
    sized: bool = True
    row_only: bool = False

    def add(self, t: PairTerms) -> None:
        raise NotImplementedError

    def result(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError


_FLOAT64_EXPONENT_BITS = 0x7FF0000000000000


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at each finite value of ``x`` (float64, the
    golden's): 2^(e-1) eps for |x| in [2^(e-1), 2^e), the subnormal spacing below the normal
    range, 0 at 0 (exact)."""
    assert x.dtype == torch.float64, "the golden's values"
    info = torch.finfo(dtype)
    # float64's exponent bits alone, mantissa 0: 2^(e-1) exactly (0 at 0; a float64 subnormal
    # gives 0 too, and the clamp the dtype's subnormal spacing, as for any value that small);
    # a quarter of frexp and ldexp's time over the partial sums of a decoding case
    power = (x.view(torch.int64) & _FLOAT64_EXPONENT_BITS).view(torch.float64)
    return power.mul_(info.eps).clamp_min_(info.tiny * info.eps).masked_fill_(x == 0, 0.0)


def add_key_rows(acc: torch.Tensor, t: PairTerms, per_query_head: torch.Tensor,
                 group: int) -> None:
    """Add one chunk's [Hq, m, 1] sums over its rows to ``acc`` ([Bkv, Hkv, Skv]) at its kept
    keys, summed over the query heads that share each key/value head."""
    full = torch.zeros_like(acc[t.kv_batch])
    full[:, t.keys] = per_query_head.squeeze(-1).unflatten(0, (-1, group)).sum(1)
    acc[t.kv_batch] += full


def mean_square(x: torch.Tensor) -> torch.Tensor:
    """The mean square over the head dim: [.., rows, D] -> [.., rows, 1]."""
    return x.square().mean(-1, keepdim=True)
