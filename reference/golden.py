"""The float64 golden output, and the dtype baseline, of a case, without flex_attention.

FlexAttention's semantics, written out: scores = q k^T * scale (scale = 1/sqrt(D));
score_mod applied to the scaled scores; masked positions set to -inf; softmax over keys;
out = P v. A query row whose keys are all masked gives out = 0 and lse = -inf. With GQA,
query head h reads key/value head h // (Hq / Hkv); with Bkv = 1, every batch reads kv batch 0.
Mods are evaluated as flex_attention defines them, point by point (cases/pointwise.py).

Both are the same chunked kernel (reference/kernel.py: bounded memory, mods under
flex_attention's vmap): the golden in float64, the baseline as fused attention kernels run it,
what a careful implementation in the case dtype achieves: inputs in the dtype, float32 scores,
softmax and accumulation, the probabilities rounded to the dtype for the P.V product (as
FlashAttention, flex_attention's Triton template and its eager path all do), and the output
rounded to the dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.variants import Mods, build_mods
from reference.overflow_rows import masking_hidden_rows, rows_hidden_by_overflow
from reference.probability_rounding import probabilities_rounded
from reference.row_noise import row_noise_magnitudes
from reference.kernel import chunked_attention, chunked_gradients

#: Version of the reference computation; part of every reference cache key.
#: 2: mods evaluated point by point (torch.vmap), no longer on broadcast index grids.
#: 3: chunks cut by key range (the same values up to float64 rounding: other matmul shapes).
#: 4: scale (and, without a score_mod, log2 e) folded into q, exp as exp2 (float64 rounding).
#: 5: the normalizer summed by the P V product, on V with a column of ones (float64 rounding).
#: 6: terms below 2^-600 (golden) and 2^-100 (baseline) of their row's largest flushed to zero.
#: 7: without a score_mod, no shift by the row maximum where a bound allows (float64 rounding).
#: 8: the baseline's gradients take the softmax's row term from the output rounded to the dtype;
#:    the golden of a backward case carries the magnitude of what cancels in dQ and dK rows.
#: 9: ... and of a float32 kernel's roundings of P and dP in dQ, dK and dV rows (bounds).
#: 10: those roundings sized as 4 RMS of a dot product's rounding, float32 cases only.
#: 11: ... and carried into the rows of a float32 case's output as well.
#: 12: float16 gradient rows also carry what dS loses below float16's normal range.
#: 13: what cancels in dQ and dK rows carries the score mod's slope, summed exactly per pair.
#: 14: ... and what P loses there in dV rows (fused and eager backwards round the normalized P).
#: 15: delta's rounding sized from O's spacing and P's roundings (3 RMS); the float16 sizes
#:     count only what the fixed spacing adds to a relative rounding.
#: 16: 16-bit dK and dV rows of shared key/value heads carry the partial sums' roundings; the
#:     noise the baseline does not draw (those, and float16's underflow) is kept apart.
#: 17: float32 delta's rounding also carries the forward's roundings of P, the sum over keys
#:     of P V and delta's own dot product.
#: 18: chunks of a multiple of 16 rows where they have that many (float64 rounding).
#: 19: a score mod that adds to the score has its addend accumulated by the q k^T product
#:     (cases/score_addend.py; bit for bit on MKL, float64 rounding on another BLAS).
#: 20: the noise of a pair whose P is 0 is 0 (it was inf * 0 = NaN beside a fill of float64's
#:     min); a row whose live pairs share one score carries none from that score's rounding.
#: 21: backward cases with such rows also carry the answer with them masked (masked_overflow);
#:     P of rows whose lse float64 cannot hold log(n) from their own softmax; a float32 lse
#:     that cannot (tied rows beyond 2^24) is no longer sized as a rounding of P.
#: 22: a score mod reads its score's dtype as flex_attention traces it, the query's
#:     (cases/score_dtype.py): finfo(score.dtype), .to(score.dtype).
#: 23: ... a conversion to 16 bits of a float32 value and score.new_tensor's constant too; a
#:     mod autograd cannot run back through gets its slope by difference.
#: 24: the slope through a copy of the scores (a mod that changes its score in place), by
#:     difference wherever autograd refuses; new_tensor counts as a dtype read (the cache).
#: 25: a conversion of the score (or a value made from it) to float32, Gemma's
#:     ``score.float()``, keeps the golden's float64 (it rounded each score to float32).
#: 26: ... in the gradients and noise of 16-bit cases too (the baseline no longer lets the
#:     golden skip its lens), through round trips (score.double().float()) and ops that take
#:     one dtype (torch.lerp beside a float32 table); a float32 constant stays float32's.
#: 27: score.double(), .bfloat16() and .to(float64) make a new tensor, as eager does (an
#:     operation in place on them left the golden's score changed); an op the trace refuses
#:     is refused.
#: 28: ... a conversion that keeps the traced dtype is the tensor itself in a 16-bit case
#:     too; .type("torch.FloatTensor") and .type("torch.BFloat16Tensor") keep float64.
#: 29: a conversion that names a 16-bit dtype is a new tensor in a 16-bit case too.
#: 30: an operation with no batching rule (clamp_) batched where the mod calls it; a mod that
#:     changes its score in place, then indexes with ints, changes it once in a process's
#:     first evaluation too (the rule for ints is asked where the mod indexes).
#: 31: float32 backward rows carry, unshared, the rounding of the stored lse that a fused
#:     backward recomputes P from (the global and head rules; the row rule held it already).
#: 32: fwd+lse rows carry the size of a float32 kernel's score roundings in its lse.
#: 33: the batches of a span of rows share one evaluation of an addend that ignores b (the
#:     chunks come span by span: dK and dV of a shared key/value batch summed in another
#:     order, float64 rounding; the forward is bit for bit the same).
#: 34: the row rule's dtype term is at least an ulp of the row's largest element (over
#:     sqrt(D)): a row whose size is in one element failed one rounding the other way.
#: 35: 16-bit output rows carry 2 RMS of P's rounding for the P V product (summed over all
#:     terms, in all three rules: too loose, an outside review).
#: 36: ... instead, in the row rule only, 2 RMS of the rounding of their largest P V term,
#:     and dQ rows of their largest dS K term.
#: 37: (one commit, 1b5ef51) rows held by one key sized by what their other keys weigh.
#: 38: 36 again: a kernel whose running maximum is not the row's largest score (an integer
#:     one in log2 units; a constant one under a softcap) rounds the largest probability at
#:     another scale than 1, and failed in those rows (an outside review).
#: 39: the verdict combines the output rows' size of P's rounding with 4 times the baseline's
#:     row error in quadrature, no longer adds it (dQ's is still added): rows of many keys
#:     are judged as before it, and a bf16 row 1.5% off is caught in 98% of them, not 59%.
#: 40: ... and P's size is 2.5 RMS of its largest term's rounding, not 2 (dQ's stays 2): at 2 a
#:     kernel rounding P at one fixed scale failed a cancelling row at 0.2% of scales.
#: 41: the softmax divides by its normalizer with zeros replaced by 1, no longer clamped at 1:
#:     torch 2.14 gives clamp's gradient 0 at its bound, and a row of one term (denom exactly
#:     1) lost its normalizer's gradient (dQ, dK off there; the same values on 2.13).
REFERENCE_VERSION = 41


@dataclass(frozen=True)
class Reference:
    """Output [B, Hq, Sq, D], log-sum-exp [B, Hq, Sq] (natural log) and, for backward cases,
    gradients ``{"dq", "dk", "dv"}`` of one computation (golden, baseline or observed); the
    golden's also carries, per row of the output (float32) and of dQ, dK and dV, the size of
    the noise a correct kernel leaves there (a float32 kernel's roundings, and what cancels in
    gradients: reference/row_noise.py), which the verdict adds to the row's own magnitude, and
    the RMS of the part of it the baseline does not draw (``unshared_noise``), which the
    verdict's global and head rules add to the baseline's error, element by element in
    quadrature, beside the factor (row_noise.RowNoise, verdict._unshared_excess)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] | None = None
    row_noise: dict[str, torch.Tensor] | None = None
    unshared_noise: dict[str, torch.Tensor] | None = None
    #: A backward case with rows a score mod hides by overflow (reference/overflow_rows.py):
    #: the same computation with those rows masked, the gradients' other right answer.
    masked_overflow: Reference | None = None
    #: Per row, noise the row rule alone takes (in units of u): the roundings of a 16-bit
    #: kernel's product operands (row_noise.RowNoise.row_only, which says how), which the
    #: global and head rules judge by the baseline's own draw.
    row_only_noise: dict[str, torch.Tensor] | None = None


def reference_pair(case: Case, inputs: Inputs,
                   grad_out: torch.Tensor | None = None) -> tuple[Reference, Reference]:
    """The golden (float64) and the baseline (case dtype) of everything ``case.mode`` checks:
    the output always, the log-sum-exp for ``fwd+lse``, dQ/dK/dV for ``fwd+bwd`` (then
    ``grad_out`` is dO, see cases.inputs.make_grad_output); for a backward case with rows
    hidden by overflow, each with its ``masked_overflow``."""
    backward = case.mode == "fwd+bwd"
    if backward and grad_out is None:
        raise ValueError(f"{case.id}: a backward case needs grad_out (dO)")
    mods = build_mods(case.variant, case.shape, inputs.q.device)
    golden, baseline = _pair(case, inputs, mods, grad_out if backward else None)
    hidden = rows_hidden_by_overflow(golden.lse, case.dtype) if backward else None
    if hidden is not None:
        other_golden, other_baseline = _pair(case, inputs, masking_hidden_rows(mods, hidden),
                                             grad_out)
        golden = replace(golden, masked_overflow=other_golden)
        baseline = replace(baseline, masked_overflow=other_baseline)
    return golden, baseline


def _pair(case: Case, inputs: Inputs, mods: Mods,
          grad_out: torch.Tensor | None) -> tuple[Reference, Reference]:
    dtype = torch_dtype(case.dtype)
    s = case.shape
    largest = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=inputs.q.device) \
        if probabilities_rounded(case) else None
    out, lse = chunked_attention(case, inputs, mods, torch.float64, largest_pv_terms=largest)
    base_out, base_lse = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=dtype)
    baseline = Reference(base_out.to(dtype), base_lse)
    noise = row_noise_magnitudes(case, inputs, mods, out, lse, grad_out, largest)
    golden = Reference(out, lse, row_noise=noise.sizes if noise else None,
                       unshared_noise=noise.unshared if noise else None,
                       row_only_noise=noise.row_only if noise else None)
    if grad_out is not None:
        golden = replace(golden, grads=chunked_gradients(
            case, inputs, mods, grad_out, torch.float64))
        base_grads = chunked_gradients(case, inputs, mods, grad_out, torch.float32, dtype)
        baseline = replace(baseline, grads={k: g.to(dtype) for k, g in base_grads.items()})
    return golden, baseline


def golden_attention(case: Case, inputs: Inputs, mods: Mods | None = None) -> Reference:
    """The float64 golden of ``case`` on ``inputs`` (computed on the inputs' device)."""
    mods = mods or build_mods(case.variant, case.shape, inputs.q.device)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    return Reference(out, lse)


def baseline_attention(case: Case, inputs: Inputs, mods: Mods | None = None) -> torch.Tensor:
    """What a careful implementation in the case dtype gets: float32 math, dtype output."""
    mods = mods or build_mods(case.variant, case.shape, inputs.q.device)
    dtype = torch_dtype(case.dtype)
    out, _ = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=dtype)
    return out.to(dtype)
