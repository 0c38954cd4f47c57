"""What rounding partial sums to a 16-bit dtype adds to dK and dV rows where key/value heads
are shared (GQA groups, one key/value batch for every batch): the size the golden carries
for it (reference/row_noise.py adds it to the row noise, and its RMS to the noise the
baseline does not draw). docs/oracle.md, "Shared key/value heads"."""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.variants import Mods
from reference.pair_terms import PairTerms
from reference.row_sizes import RowSizes, over_pairs, spacing

#: The partial sums' roundings (PartialSums) are a sum of at least two independent roundings:
#: their size is this many RMS of it.
PARTIAL_DRAWS_COVERED = 3.0


def partial_sums_sized(case: Case) -> bool:
    """Whether ``case``'s golden sizes partial sums (partial_sum_magnitudes): a backward whose
    dK or dV rows sum more than one query head or batch, in a 16-bit dtype (in float32 the
    partial sums' roundings are the float32 sum's own)."""
    s = case.shape
    return case.mode == "fwd+bwd" and case.dtype != "fp32" and (s.Hq > s.Hkv or s.B > s.Bkv)


def partial_sum_magnitudes(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor,
                           lse: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per key row of dK and dV, the RMS over the head dim of what rounding partial sums to
    the case dtype adds where a key/value head is shared (GQA groups, or one key/value batch
    for all batches): ``{"dk"/"dv": [Bkv, Hkv, Skv]}`` in units of the case dtype's unit
    roundoff, PARTIAL_DRAWS_COVERED RMS of it; empty where nothing is shared or the dtype is
    float32.

    Such a row is a sum over the query heads and batches that read the key. flex_attention's
    Triton template sums them in float32 and rounds once, as the baseline does; eager
    flex_attention's backward (sdpa_dense_backward) computes dK and dV per query head and
    batch in the case dtype, rounds each, sums each group and rounds again, then sums the
    batches (FlashAttention 2's GQA backward also rounds per query head before its sum). Each
    of those roundings is one draw of spacing(x) / sqrt(12) RMS per element, independent of
    the others: their variances add. The last rounding, of the whole sum, is the baseline's
    own and is not counted. With B4 Bkv1 and groups of 16, eager's correct float16 dV failed a
    key row at 1.11x and dV's global rule at 1.02x without it (docs/oracle.md)."""
    if not partial_sums_sized(case):
        return {}
    return over_pairs(case, inputs, mods, out, lse, grad_out, [PartialSums(case, inputs)])[0]


class PartialSums(RowSizes):
    """partial_sum_magnitudes: each batch's per query head sums of dK and dV are gathered
    chunk by chunk ([Hq, Skv, D] each, float64; conformance/estimates.py counts them) and,
    once the batch's chunks are done (query_chunks yields them batch by batch), their
    roundings are sized into the key/value batch's rows (the baseline sums in float32: it
    does not draw them)."""

    draws = PARTIAL_DRAWS_COVERED
    unshared = True

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        self.shape, self.dtype = s, torch_dtype(case.dtype)
        self.scale = 1.0 / math.sqrt(s.D)
        device = inputs.q.device
        self.batch: int | None = None  # the batch whose sums are being gathered
        self.kv_batch = 0
        self.sums = {name: torch.zeros(s.Hq, s.Skv, s.D, dtype=torch.float64, device=device)
                     for name in ("dk", "dv")}
        self.var = {name: torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=device)
                    for name in ("dk", "dv")}

    def add(self, t: PairTerms) -> None:
        if t.b != self.batch:
            self._fold_batch()
            self.batch, self.kv_batch = t.b, t.kv_batch
        self.sums["dv"][:, t.keys] += torch.bmm(t.probs.transpose(1, 2), t.d_out)
        self.sums["dk"][:, t.keys] += torch.bmm(t.d_scores.transpose(1, 2), t.q) \
            .mul_(self.scale)

    def result(self) -> dict[str, torch.Tensor]:
        self._fold_batch()
        u = torch.finfo(self.dtype).eps / 2
        return {name: (var.sqrt() * (PARTIAL_DRAWS_COVERED / u)).float()
                for name, var in self.var.items()}

    def _fold_batch(self) -> None:
        """Add the variance of the gathered batch's roundings to its key/value batch's rows:
        each query head's sum and, where batches share a key/value batch too, each group's
        sum (rounded before the batches' sum); then start the next batch from 0."""
        if self.batch is None:
            return
        s, dtype = self.shape, self.dtype
        group = s.Hq // s.Hkv

        def variance(x: torch.Tensor) -> torch.Tensor:  # [.., Skv, D] -> [.., Skv]
            return spacing(x, dtype).square_().mean(-1).div_(12.0)

        for name, sums in self.sums.items():
            per_group = sums.unflatten(0, (s.Hkv, group))  # [Hkv, G, Skv, D]
            var = self.var[name][self.kv_batch]
            var += variance(per_group).sum(1)
            if group > 1 and s.B > s.Bkv:
                var += variance(per_group.sum(1))
            sums.zero_()
        self.batch = None
