"""How much rounding noise a correct kernel leaves in each row of an output, and of
dQ, dK and dV, where the row's own terms are few or cancel, so that the verdict can judge
those rows by what a careful kernel can do. Five sources, summed per row
(row_noise_magnitudes); the third, dS and P below float16's normal range
(reference/underflow_noise.py), is described there, the fourth, partial sums over shared
key/value heads, in reference/partial_sums.py, and the fifth, which the row rule alone adds,
the rounding of P for the P V product in 16-bit outputs (reference/probability_rounding.py)
and of dS for dQ (reference/gradient_roundings.py):

What cancels (cancelling_magnitudes). dQ_i = scale * sum_j P_ij (dP_ij - delta_i) k_j, with
dP_ij = dO_i . v_j and delta_i = dO_i . O_i.
In a row that sees few keys, dP_ij and delta_i nearly cancel and the golden dQ_i is small (0
when the row sees one key), while every fused kernel (FlashAttention, flex_attention's Triton
template, eager flex_attention) takes delta_i from O as stored in the case dtype: the
roundings of O, and of the P it was made from, move delta_i by about u w_i (_delta_rounding),
and dQ_i by u scale w_i (P K)_i, whatever the golden's size.
dK_j = scale sum_i P_ij (dP_ij - delta_i) q_i is moved by the roundings of many rows at once,
independent of each other: by about u scale sqrt(sum_i (P_ij w_i)^2 |q_i|^2).
(Under a score mod each P_ij there is times the mod's slope.)
Those sizes (without u, which the verdict's dtype term supplies) are
the magnitude of what cancels in each row, beside the golden's own, which the row's error is
measured against. Where rows see many keys they are a fraction of the gradient (medians of
0.31-0.35 of rms(dQ) and 0.17-0.22 of rms(dK) at S512, full and causal, bf16; ALiBi 0.57 and
0.52), so a row 2-3% off is still caught
there (tests/test_gradient_verdict.py); where a row sees few keys they are most of its limit
(docs/oracle.md: a correct FlashAttention-style backward failed the dQ row rule by up to 18x
in rows whose golden was 1/100 of that noise).

A float32 kernel's roundings of P and dP (float32_rounding_magnitudes, float32 cases, output
rows and gradient rows). In a row of one or a few terms (in the output: a row dominated by a
few keys) the row's whole error is the rounding of one P_ij or dP_ij, and the
baseline's own draw of it can be 30x smaller than a correct backend's: in float32, where
nothing else widens the limit, a correct backward failed such rows by up to 4.8x (inputs x1)
and most of them with inputs x4. Sized as 4 RMS of each rounding, from the sizes of the
terms; 35-41x rms(G) on float32 rows of many keys with inputs x1 (where the row rule still
fails a row 1e-4 off), more with larger scores, as the roundings grow (docs/oracle.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.variants import Mods
from reference.kernel import stacked_product
from reference.overflow_rows import FLOAT32_LSE_RESOLVES
from reference.pair_terms import PairTerms
from reference.gradient_roundings import GradientOperandRounding
from reference.probability_rounding import probabilities_rounded, probability_rounding_sizes
from reference.partial_sums import PartialSums, partial_sums_sized
from reference.row_sizes import (DRAWS_COVERED, RowSizes, add_key_rows, mean_square,
                                 over_pairs, spacing)
from reference.underflow_noise import (UnderflowSizes, subnormal_rounding_variance,
                                      underflows_before_float32)


#: delta's rounding (_delta_rounding) is a sum of D + m independent roundings, close to normal:
#: its size is this many RMS of it, beside the row's other terms. Measured (docs/oracle.md):
#: at 4, 1-15% fewer gradient faults caught than at 3; at 2.5 a correct backward failed.
_DELTA_DRAWS_COVERED = 3.0


@dataclass(frozen=True)
class RowNoise:
    """What row_noise_magnitudes finds, per row of each tensor it names (float32, in units of
    the case dtype's unit roundoff): ``sizes``, the noise a correct kernel may leave there,
    which the row rule adds to the row's magnitude; ``unshared``, one RMS of the part of it
    that the baseline's own computation does not draw (the roundings below float16's normal
    range, of partial sums, and of the float32 lse a backward recomputes P from), which the
    global and head rules add to the baseline's error element by element in quadrature,
    beside the factor (verdict._unshared_excess). The rest, what cancels and a float32
    kernel's other roundings, the baseline draws too, once: its error already holds it
    there. ``row_only``: the roundings of a 16-bit kernel's product operands (P for P V,
    reference/probability_rounding.py; dS for dQ, reference/gradient_roundings.py), whose
    draw in a row held by a few terms can be far above the baseline's (which draws P's too,
    and not dS's); the row rule alone takes them, as the global and head rules, over many
    rows, judge them by the baseline's error: the output's (P's, a draw the baseline makes
    too) in quadrature with its factor times the baseline's row error, dQ's (roundings the
    baseline never makes) on top of it (verdict._decide)."""

    sizes: dict[str, torch.Tensor]
    unshared: dict[str, torch.Tensor]
    row_only: dict[str, torch.Tensor] = field(default_factory=dict)


def row_noise_magnitudes(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor,
                         lse: torch.Tensor, grad_out: torch.Tensor | None = None,
                         largest_pv_terms: torch.Tensor | None = None) -> RowNoise | None:
    """Per row of the output (float32 cases) and, given dO, of dQ, dK and dV, the size of the
    noise a correct kernel leaves there beside the golden's own magnitude, in units of the
    case dtype's unit roundoff: what cancels in gradient rows (cancelling_magnitudes), what dS
    and P lose below float16's normal range (underflow_noise.underflow_magnitudes, float16
    gradients), what rounding partial sums adds to dK and dV rows where heads or batches share
    a key/value head (partial_sum_magnitudes, 16-bit gradients), plus a float32 kernel's
    roundings of P and dP (float32_rounding_magnitudes: float32 cases, and 16-bit cases
    whose scores are large enough for them to count, _float32_roundings_sized; otherwise, in
    bfloat16 and float16 units it is 2^-16 and 2^-13 of itself, and the dtype's own roundings
    set those limits; added to fp16 runs with inputs x4 it moved no margin). With ``fwd+lse``,
    the float32 lse's rows too (``lse``: the roundings of its scores, _LseRounding). In
    16-bit cases, for the row rule alone (RowNoise.row_only), the roundings of the product
    operands: the output's from the golden's ``largest_pv_terms``
    (reference/probability_rounding.py), dQ's from the pair terms
    (reference/gradient_roundings.py). None: nothing to add."""
    parts: list[RowSizes] = []
    if grad_out is not None:
        parts.append(_Cancelling(case, inputs))
    if _float32_roundings_sized(case, lse):
        parts.append(_Float32Rounding(case, inputs, backward=grad_out is not None))
        if grad_out is not None:
            parts.append(_StoredLseRounding(case, inputs))
    if case.mode == "fwd+lse":
        parts.append(_LseRounding(case, inputs))
    if grad_out is not None and underflows_before_float32(torch_dtype(case.dtype)):
        parts.append(UnderflowSizes(case, inputs))
    if grad_out is not None and partial_sums_sized(case):
        parts.append(PartialSums(case, inputs))
    if grad_out is not None and probabilities_rounded(case):
        parts.append(GradientOperandRounding(case, inputs))
    noise: dict[str, torch.Tensor] = {}
    row_only: dict[str, torch.Tensor] = {}
    unshared_var: dict[str, torch.Tensor] = {}
    for part, sizes in zip(parts, over_pairs(case, inputs, mods, out, lse, grad_out, parts)):
        if part.sized or part.row_only:
            summed = row_only if part.row_only else noise
            summed.update({name: size + summed.get(name, 0.0) for name, size in sizes.items()})
        if part.unshared:
            unshared_var = dict(unshared_var, **{
                name: (size / part.draws).square() + unshared_var.get(name, 0.0)
                for name, size in sizes.items()})
    if largest_pv_terms is not None:
        row_only["out"] = probability_rounding_sizes(largest_pv_terms) + row_only.get("out", 0.0)
    if not noise and not unshared_var and not row_only:
        return None
    return RowNoise(noise, {name: var.sqrt() for name, var in unshared_var.items()}, row_only)


#: A 16-bit case's float32 roundings are sized where a row's scores are so large (a fill
#: added to every score of the row, as HF adds ``finfo(score.dtype).min``) that the rounding
#: of one, |s| u_float32, is at least this share of the dtype's unit roundoff: float16's min
#: added in a float16 case rounds each score by up to 2^-8 in float32, and eager's correct
#: backward failed the dQ rule by 1.5x in 20-24 such rows where they were not sized.
_FLOAT32_SCORE_ROUNDING_SHARE = 1 / 8


def _float32_roundings_sized(case: Case, lse: torch.Tensor) -> bool:
    """Whether row_noise_magnitudes sizes a float32 kernel's roundings for ``case``: always in
    float32; in 16 bits where the largest finite |lse| (a bound on the scores of its row's
    dominant keys) makes them count (_FLOAT32_SCORE_ROUNDING_SHARE)."""
    if case.dtype == "fp32":
        return True
    finite = lse[torch.isfinite(lse)]
    if finite.numel() == 0:
        return False
    return float(finite.abs().max()) * _float32_units(case) >= _FLOAT32_SCORE_ROUNDING_SHARE


def _float32_units(case: Case) -> float:
    """float32's unit roundoff in units of the case dtype's."""
    return torch.finfo(torch.float32).eps / torch.finfo(torch_dtype(case.dtype)).eps


def cancelling_magnitudes(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor,
                          lse: torch.Tensor, grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row, the RMS over the head dim of the term a rounding of O moves: ``{"dq": [B, Hq,
    Sq], "dk": [Bkv, Hkv, Skv]}`` (float32: a size, not a value), from the golden's ``out``
    and ``lse``. A rounding e_i of delta_i moves dS_ij = slope_ij P_ij (dP_ij - delta_i) by
    slope_ij P_ij e_i (slope: the score mod's derivative, 1 without one), so dQ_i by
    scale e_i sum_j slope_ij P_ij k_j and dK_j by scale sum_i slope_ij P_ij e_i q_i. The e_i
    of different rows are independent: dK_j's size is sqrt(sum_i (slope_ij P_ij w_i)^2
    |q_i|^2), not the sum of the terms' sizes (which grows with the rows: with the
    worst-case w_i, 4-25x |dK| at S1024); with one query row it is the term itself."""
    return over_pairs(case, inputs, mods, out, lse, grad_out, [_Cancelling(case, inputs)])[0]


class _Cancelling(RowSizes):
    """cancelling_magnitudes, chunk by chunk."""

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        self.scale, self.group = 1.0 / math.sqrt(s.D), s.Hq // s.Hkv
        self.dtype = torch_dtype(case.dtype)
        self.dq = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=inputs.q.device)
        self.dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=inputs.q.device)

    def add(self, t: PairTerms) -> None:
        weight = _delta_rounding(t, self.dtype)
        moved = t.probs if t.slope is None else t.probs * t.slope  # [Hq, n, m]
        attended = torch.bmm(moved.reshape(t.k.shape[0], -1, moved.shape[-1]), t.k) \
            .view_as(t.q)
        self.dq[t.b, :, t.rows] = self.scale * weight.squeeze(-1) * _rms(attended)
        var = (moved * weight).square_()  # (slope P w)^2
        add_key_rows(self.dk, t, torch.bmm(var.transpose(1, 2), mean_square(t.q)),
                     self.group)

    def result(self) -> dict[str, torch.Tensor]:
        return {"dq": self.dq.float(), "dk": (self.scale * self.dk.sqrt()).float()}


def float32_rounding_magnitudes(case: Case, inputs: Inputs, mods: Mods, out: torch.Tensor,
                                lse: torch.Tensor, grad_out: torch.Tensor | None = None
                                ) -> dict[str, torch.Tensor]:
    """Per row of the output and, given dO, of dQ, dK and dV, the RMS over the head dim of
    what a float32 kernel's own roundings of P and dP move (``{"out"/"dq": [B, Hq, Sq],
    "dk"/"dv": [Bkv, Hkv, Skv]}``, in units of the case dtype's unit roundoff, which the
    verdict multiplies them by).

    The forward: O_i = sum_j P_ij V_j / sum_j P_ij, so a relative rounding e_ij of each P_ij
    moves O_i by sum_j P_ij e_ij (V_j - O_i). A forward kernel takes P_ij = exp(s'_ij - m_i)
    (m_i its row's running maximum) and is off by a relative ``u f_ij``: the score's dot
    product through the mod's slope, the mod's result ``|s'_ij|``, the subtraction
    ``|s'_ij - lse_i|`` and the exponential's own, 2 (a rounding common to a whole row, as of
    m_i, cancels in the normalization). Where a row is dominated by a few keys with scores of
    tens (inputs x4), those roundings are its whole error, and a kernel whose dot products sum
    in another order failed the row rule by up to 5x against a baseline whose roundings are
    eager flex_attention's own (docs/oracle.md).

    A fused backward recomputes P_ij = exp(s_ij - lse_i) and dP_ij = dO_i . v_j in float32. Each
    is one rounding of a D-term dot product and a few more, and where a row holds one or a few
    terms (decoding, a causal row that sees one key) that one rounding is the row's whole
    error: the baseline's own draw of it can be 30x smaller than a correct backend's
    (docs/oracle.md). Sizes, each DRAWS_COVERED (4) times a rounding's RMS, as a row of one
    term holds one draw of it:
    - P_ij is off by a relative ``u c_ij``: the score's dot product (_dot_rounding), carried
      through the score mod's slope; the mod's result, ``|s'_ij|``; the stored lse,
      ``|lse_i|``; and the exponential's own, 2;
    - dP_ij is off by ``u n_ij``, its dot product's rounding.
    dS_ij = slope P_ij (dP_ij - delta_i) then moves by u times ``c_ij dS_ij`` and
    ``n_ij slope P_ij``, independent from pair to pair, and dQ_i = scale sum_j dS_ij k_j,
    dK_j = scale sum_i dS_ij q_i and dV_j = sum_i P_ij dO_i sum them in quadrature. In the case
    dtype's units these are u_float32 / u_dtype of that (2^-16 of it in bfloat16)."""
    sizes = _Float32Rounding(case, inputs, backward=grad_out is not None)
    return over_pairs(case, inputs, mods, out, lse, grad_out, [sizes])[0]


class _Float32Rounding(RowSizes):
    """float32_rounding_magnitudes, chunk by chunk (``backward``: dQ, dK and dV too)."""

    def __init__(self, case: Case, inputs: Inputs, backward: bool):
        s = case.shape
        device = inputs.q.device
        self.backward = backward
        self.o = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=device)
        self.dq = torch.zeros_like(self.o)
        self.dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=device)
        self.dv = torch.zeros_like(self.dk)
        self.group, self.scale = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
        self.to_dtype_units = _float32_units(case)

    def add(self, t: PairTerms) -> None:
        group, scale = self.group, self.scale
        dot = _score_rounding(t) * DRAWS_COVERED
        if t.slope is not None:
            dot.mul_(t.slope.abs())
        dot.add_(t.modded.abs())  # the score's rounding, before the exponent's own
        lse_i = t.lse.where(torch.isfinite(t.lse), 0.0)
        in_p_forward = (t.modded - lse_i).abs_().add_(2.0).add_(dot)
        if t.tied is not None:  # one rounding for the whole row: O does not move
            in_p_forward.masked_fill_(t.tied, 0.0)
        self.o[t.b, :, t.rows] = _output_variance(t, in_p_forward, group)
        del in_p_forward
        if not self.backward:
            return
        # in_p: the relative rounding of P_ij in units of u (see above), built in place
        in_p = _finite(dot.add_(lse_i.abs() + 2.0)).masked_fill_(_lse_beyond_float32(t), 2.0)
        var_p = (in_p * t.probs).square_()
        dv_keys = torch.bmm(var_p.transpose(1, 2), mean_square(t.d_out))
        del var_p
        var_ds = in_p.mul_(t.d_scores).square_()  # in_p's memory: P's rounding in dS
        in_dp = _dot_rounding(t.d_out, t.v, t.d_probs).mul_(DRAWS_COVERED).mul_(t.probs)
        if t.slope is not None:
            in_dp.mul_(t.slope)
        var_ds.add_(in_dp.square_())  # dP's rounding in dS
        del in_dp
        ms_k = mean_square(t.k).repeat_interleave(group, 0)  # [Hq, m, 1]
        self.dq[t.b, :, t.rows] = scale ** 2 * torch.bmm(var_ds, ms_k).squeeze(-1)
        dk_keys = scale ** 2 * torch.bmm(var_ds.transpose(1, 2), mean_square(t.q))
        add_key_rows(self.dk, t, dk_keys, group)
        add_key_rows(self.dv, t, dv_keys, group)

    def result(self) -> dict[str, torch.Tensor]:
        found = (("out", self.o), ("dq", self.dq), ("dk", self.dk), ("dv", self.dv)) \
            if self.backward else (("out", self.o),)
        return {name: (self.to_dtype_units * var.sqrt()).float() for name, var in found}


class _LseRounding(RowSizes):
    """The float32 lse a kernel returns (``fwd+lse``, every dtype: flex_attention returns it in
    float32) is off by sum_j P_ij e_ij, e_ij the rounding of score s'_ij: its dot product's
    (_dot_rounding, through the mod's slope) and the mod's result's, |s'_ij| u. The
    baseline's own draw of it can be near 0 by chance (it multiplies its kept keys alone, in
    another order), so where a row is held by one or a few keys whose terms cancel (|q . k|
    far below sum |q_d k_d|) a correct kernel failed the lse rule, which scaled with |lse|
    alone: eager's lse 1.43x its limit on composed-prefix1-scale4 b1-h8x2 s255 d64 fp32 x8,
    16 of 20 seeds (an outside fuzzing run). Sized as 4 RMS per pair (DRAWS_COVERED), in
    quadrature over the row's keys; the verdict adds it to the lse row's limit."""

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        self.lse = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=inputs.q.device)
        self.to_dtype_units = _float32_units(case)

    def add(self, t: PairTerms) -> None:
        per_pair = _score_rounding(t) * DRAWS_COVERED
        if t.slope is not None:
            per_pair.mul_(t.slope.abs())
        per_pair = _finite(per_pair.add_(t.modded.abs()))
        self.lse[t.b, :, t.rows] = per_pair.mul_(t.probs).square_().sum(-1)

    def result(self) -> dict[str, torch.Tensor]:
        return {"lse": (self.to_dtype_units * self.lse.sqrt()).float()}


class _StoredLseRounding(RowSizes):
    """The rounding of the lse that a fused backward recomputes P from, P_ij = exp(s_ij -
    lse_i), lse_i stored in float32 (natural or log2 units): one rounding of lse_i moves every
    P_ij of row i by one relative amount e_i, of an RMS of at most u |lse_i| / sqrt(3) (a
    spacing of at most 2u |lse_i| in either unit: ln 2 log2 e = 1), independent from row to
    row. It moves dV_j = sum_i P_ij dO_i by sum_i e_i P_ij dO_i, dS_ij by e_i dS_ij, so dQ_i
    by e_i dQ_i (one factor for the row) and dK_j = scale sum_i dS_ij q_i by scale sum_i e_i
    dS_ij q_i. The baseline's backward takes P from its own forward, exp(s - rowmax), where
    the largest term is exactly 1: it does not draw this, so it is unshared. The row rule
    already holds it (|lse_i| is one of the P roundings that _Float32Rounding sizes), so it
    is not sized again. Where |lse| is large (a sink: score + 1000 on one key) it is most of
    a correct backward's error in dV's rows of the dominant keys, and eager's float32 backward
    failed dV's global rule at 1.5-1.6x without it (docs/oracle.md). Tied rows beyond
    float32's reach are the exponential's alone (_lse_beyond_float32): none here."""

    draws = 1.0
    unshared = True
    sized = False

    def __init__(self, case: Case, inputs: Inputs):
        s = case.shape
        device = inputs.q.device
        self.dq = torch.zeros(s.B, s.Hq, s.Sq, dtype=torch.float64, device=device)
        self.dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, dtype=torch.float64, device=device)
        self.dv = torch.zeros_like(self.dk)
        self.group, self.scale = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
        self.to_dtype_units = _float32_units(case)

    def add(self, t: PairTerms) -> None:
        lse_i = t.lse.where(torch.isfinite(t.lse), 0.0)
        rms = lse_i.abs().div_(math.sqrt(3.0)).masked_fill_(_lse_beyond_float32(t), 0.0)
        moved_p = (rms * t.probs).square_()  # [Hq, n, m], in units of u^2
        dv_keys = torch.bmm(moved_p.transpose(1, 2), mean_square(t.d_out))
        del moved_p
        hq, n, m = t.d_scores.shape
        hkv = hq // self.group
        dq = torch.bmm(t.d_scores.reshape(hkv, self.group * n, m), t.k).view(hq, n, -1)
        self.dq[t.b, :, t.rows] = (rms.square() * mean_square(dq)).squeeze(-1) * self.scale ** 2
        moved_ds = (rms * t.d_scores).square_()
        dk_keys = self.scale ** 2 * torch.bmm(moved_ds.transpose(1, 2), mean_square(t.q))
        add_key_rows(self.dk, t, dk_keys, self.group)
        add_key_rows(self.dv, t, dv_keys, self.group)

    def result(self) -> dict[str, torch.Tensor]:
        return {name: (self.to_dtype_units * var.sqrt()).float()
                for name, var in (("dq", self.dq), ("dk", self.dk), ("dv", self.dv))}


def _delta_rounding(t: PairTerms, dtype: torch.dtype) -> torch.Tensor:
    """[Hq, n, 1]: w_i, the size of delta_i's rounding in units of u (_DELTA_DRAWS_COVERED
    RMS of it). Fused backwards and eager take delta_i = dO_i . O_i from O as a correct
    forward stored it in ``dtype``: rounded once at the end, an RMS of spacing(O_id) / sqrt(12)
    per element, after each P_ij was rounded for the P V product (FlashAttention,
    flex_attention's Triton template and eager alike: eager rounds the normalized P, fused
    kernels the unnormalized, each at most a spacing of 2u P_ij in the normalized scale, an
    RMS e_ij of at most u P_ij / sqrt(3)), which moves O_i by sum_j e_ij v_j and so delta_i by
    sum_j e_ij dP_ij; below float16's normal range, P_ij's rounding is to the fixed spacing
    instead (subnormal_rounding_variance adds what that spacing adds). The D and the m
    roundings are independent: in quadrature. In float32, where O's last rounding is the least
    of them, a float32 kernel's own arithmetic too (_float32_delta_variance). Until
    REFERENCE_VERSION 14 w_i was
    2 sqrt(sum_d (dO_id O_id)^2), which left P's roundings out: in a row of a few keys they
    are as large as O's, and a correct backward failed such a dQ row (docs/oracle.md)."""
    info = torch.finfo(dtype)
    u = info.eps / 2
    of_out = (t.d_out * spacing(t.out, dtype)).square_().sum(-1, keepdim=True).div_(12 * u * u)
    var_p = t.probs.square().div_(3.0)  # in units of u^2
    if underflows_before_float32(dtype):  # float16: P below 2^-14
        var_p.add_(subnormal_rounding_variance(t.probs, 1.0, info.tiny, info.tiny * info.eps,
                                               info.eps).div_(u * u))
    of_probs = var_p.mul_(t.d_probs.square()).sum(-1, keepdim=True)
    var = of_out.add_(of_probs)
    if dtype == torch.float32:
        var.add_(_float32_delta_variance(t))
    return _finite(var.sqrt_().mul_(_DELTA_DRAWS_COVERED))


#: The variance of a float32 exponential's own relative error, in units of u^2: 2u RMS, an
#: allowance for a GPU's exp2, which CUDA documents as accurate to a few ulp, not correctly
#: rounded (a review; not measured here: the CPU's is within an ulp).
_EXP_VARIANCE = 4.0


def _float32_delta_variance(t: PairTerms) -> torch.Tensor:
    """[Hq, n, 1]: the variance, in units of float32's u^2, of what a float32 kernel's own
    arithmetic moves delta_i = dO_i . O_i by, beyond O's last rounding (_delta_rounding):
    - the forward's roundings of each P_ij, relative, of RMS^2 slope^2 (c^2 + s^2 / 3) +
      (2 s'^2 + (s' - lse_i)^2) / 3 + 4 in units of u^2: the score's dot product (c, as in
      _dot_rounding) and its scaling (s), through the mod's slope; the mod's result and its
      change to log2 units (s'; without a score mod, s' = s and only the change, s'^2 / 3);
      the exponent's subtraction; the exponential's own, 2u RMS (_EXP_VARIANCE). The same
      P_ij makes O_i's numerator and its normalizer, so O_i moves by
      sum_j P_ij e_ij (V_j - O_i) and delta_i by sum_j P_ij e_ij (dP_ij - delta_i);
    - the sum over keys O_id = sum_j P_ij V_jd, added one key at a time (a fused multiply-add
      loop, as flex_attention's Triton template runs P V in float32): m_i sum_j (P_ij V_jd)^2 / 6
      + m_i O_id^2 / 9 per element (_dot_rounding's model over the row's m_i visible keys), each
      times dO_id^2;
    - delta's own dot product over the head dim (_dot_rounding's model).
    Before REFERENCE_VERSION 17 none was sized (in float32 nothing rounds P for P V), and
    correct forwards moved delta by a median 3.4-9.2 RMS of its size, up to 30-540 RMS
    (soft-capping, causal and full attention, inputs x1 and x4, S256-1024; docs/oracle.md,
    "Float32 delta"; tests/test_float32_delta.py). In bfloat16 and
    float16 they are 2^-32 and 2^-26 of themselves, and O's own rounding sets delta's size."""
    d = t.q.shape[-1]
    delta = (t.d_out * t.out).sum(-1, keepdim=True)
    of_score = _score_rounding(t).square().add_(t.scores.square().div_(3.0))
    if t.slope is not None:
        of_score.mul_(t.slope.square())
    lse_i = t.lse.where(torch.isfinite(t.lse), 0.0)
    roundings_of_modded = 1.0 if t.slope is None else 2.0  # the mod's result, if any; log2
    in_p = of_score.add_((t.modded - lse_i).square_()
                         .add_(t.modded.square().mul_(roundings_of_modded))
                         .div_(3.0)).add_(_EXP_VARIANCE)
    _finite(in_p).masked_fill_(_lse_beyond_float32(t), _EXP_VARIANCE)
    of_probs = in_p.mul_(((t.d_probs - delta) * t.probs).square_()).sum(-1, keepdim=True)
    del in_p
    hkv, m = t.v.shape[0], t.probs.shape[-1]
    terms = torch.bmm(t.probs.square().view(hkv, -1, m), t.v.square()).view_as(t.out)
    keys = (t.probs > 0).sum(-1, keepdim=True).to(t.out.dtype)  # each row's visible keys
    in_sum = terms.div_(6.0).add_(t.out.square().div_(9.0)).mul_(keys)
    of_sum = in_sum.mul_(t.d_out.square()).sum(-1, keepdim=True)
    products = t.d_out * t.out
    of_dot = products.square_().sum(-1, keepdim=True).mul_(d / 6.0) \
        .add_(delta.square().mul_(d / 9.0))
    return of_probs.add_(of_sum).add_(of_dot)


def _output_variance(t: PairTerms, in_p: torch.Tensor, group: int) -> torch.Tensor:
    """[Hq, n]: sum_j (in_p_ij P_ij)^2 times the mean square over the head dim of V_j - O_i,
    that mean square taken apart as ms(V_j) - 2 V_j.O_i / D + ms(O_i). ``in_p`` is
    overwritten."""
    weights = in_p.mul_(t.probs).square_()
    ms_v = mean_square(t.v).repeat_interleave(group, 0)  # [Hq, m, 1]
    cross = stacked_product(t.out, t.v).mul_(weights).sum(-1, keepdim=True)
    var = torch.bmm(weights, ms_v).sub_(cross, alpha=2.0 / t.q.shape[-1]) \
        .add_(weights.sum(-1, keepdim=True) * mean_square(t.out))
    return var.clamp_min_(0.0).squeeze(-1)


def _score_rounding(t: PairTerms) -> torch.Tensor:
    """[Hq, n, m]: _dot_rounding of each score q_i . k_j scale, once per chunk for the row
    sizes that read it (t.derived)."""
    if "score_rounding" not in t.derived:
        scale = 1.0 / math.sqrt(t.q.shape[-1])
        t.derived["score_rounding"] = _dot_rounding(t.q * scale, t.k, t.scores)
    return t.derived["score_rounding"]


def _dot_rounding(a: torch.Tensor, b: torch.Tensor, dots: torch.Tensor) -> torch.Tensor:
    """[Hq, n, m]: the RMS, in units of u, of the rounding of each float32 dot product
    a_i . b_j of D terms (a: [Hq, n, D], b: [Hkv, m, D], ``dots`` the exact values), added one
    term at a time in any order: the k-th partial sum has a mean square of about
    k/D t^2 + (k/D)^2 s^2 (t^2 the sum of the squared terms, s the dot product), and each of
    the D roundings an RMS of at most u/sqrt(3) of it, so sqrt(D t^2 / 6 + D s^2 / 9). Measured
    (a review, 2026-12-03): 0.57-0.75 of it for sums one term at a time and for CPU bmm at
    D <= 128, less for blocked or pairwise sums (0.14-0.4), which round less."""
    d = a.shape[-1]
    squares = stacked_product(a.square(), b.square())
    return squares.mul_(d / 6.0).add_(dots.square().mul_(d / 9.0)).sqrt_()


def _lse_beyond_float32(t: PairTerms) -> torch.Tensor:
    """[Hq, n, 1]: tied rows (one score after the mod for every live pair: padding written as
    a huge constant) whose lse float32 cannot resolve. There a backward that recomputes P as
    exp(s - lse) from a float32 lse gets 1 for each of the row's n keys instead of 1/n: not a
    rounding but a wrong gradient (n times the row's share of dV), so its size is not noise.
    A correct kernel computes the row's softmax (eager) or holds the row as masked (the
    golden's masked_overflow); P's rounding there is the exponential's own."""
    if t.tied is None:
        return torch.zeros_like(t.lse, dtype=torch.bool)
    return t.tied & (t.lse.abs() > FLOAT32_LSE_RESOLVES)


def _finite(sizes: torch.Tensor) -> torch.Tensor:
    """``sizes`` with inf made the dtype's largest value, in place, where a mod's score is so
    large (a row hidden with float64's min) that a size overflows: it still sizes the row's
    noise beyond any error, and where it meets a term of 0 (a mod that ignores its score there)
    it makes 0, not inf * 0 = NaN, which failed every row."""
    return sizes.clamp_(max=torch.finfo(sizes.dtype).max)


def _rms(t: torch.Tensor) -> torch.Tensor:
    """The RMS over the head dim: [.., rows, D] -> [.., rows]."""
    return mean_square(t).squeeze(-1).sqrt()
