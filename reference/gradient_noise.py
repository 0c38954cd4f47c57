"""How much rounding noise a correct backward leaves in each row of dQ and dK where the terms
of the row cancel, so that the verdict can judge those rows by what a careful kernel can do.

dQ_i = scale * sum_j P_ij (dP_ij - delta_i) k_j, with dP_ij = dO_i . v_j and delta_i = dO_i . O_i.
In a row that sees few keys, dP_ij and delta_i nearly cancel and the golden dQ_i is small (0
when the row sees one key), while every fused kernel (FlashAttention, flex_attention's Triton
template, eager flex_attention) takes delta_i from O as stored in the case dtype: roundings
of O move delta_i by about u w_i (w_i below), and dQ_i by u scale w_i (P K)_i, whatever the
golden's size. dK_j = scale sum_i P_ij (dP_ij - delta_i) q_i is moved by the roundings of many
rows at once, independent of each other: by about u scale sqrt(sum_i (P_ij w_i)^2 |q_i|^2).
Those sizes (without u, which the verdict's dtype term supplies) are this module's answer: the
magnitude of what cancels in each row, beside the golden's own, which the row's error is
measured against. Where rows see many keys they are a fraction of the gradient (medians of
0.28-0.34 of rms(dQ) and 0.15-0.20 of rms(dK) at S512), so a row 2-3% off is still caught
there (tests/test_gradient_verdict.py); where a row sees few keys they are most of its limit
(docs/oracle.md: a correct FlashAttention-style backward failed the dQ row rule by up to 18x
in rows whose golden was 1/100 of that noise).
"""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.variants import Mods
from reference.kernel import chunked_attention, chunked_gradients


#: Signed draws that estimate the size of the dK term (see cancelling_magnitudes).
_DK_DRAWS = 2
#: How many roundings of O a correct backend's delta may carry (see cancelling_magnitudes).
_ROUNDINGS_OF_O = 2.0


def cancelling_magnitudes(case: Case, inputs: Inputs, mods: Mods, grad_out: torch.Tensor,
                          out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row, the RMS over the head dim of the term a rounding of O moves: ``{"dq": [B, Hq,
    Sq], "dk": [Bkv, Hkv, Skv]}`` (float32: a size, not a value). ``out`` is the golden O."""
    scale = 1.0 / math.sqrt(case.shape.D)
    # w_i: the size of delta_i's rounding, in units of u: its D terms dO_id O_id carry
    # independent roundings, so sqrt(sum_d (dO_id O_id)^2) times two roundings (an output a
    # few roundings off, as eager's is), not the sum of their sizes (sqrt(D) times larger)
    weight = _ROUNDINGS_OF_O * (grad_out.to(out.dtype) * out).pow(2).sum(-1, keepdim=True) \
        .sqrt().float()
    # dQ_i moves by scale * e_i * (P K)_i: the same attention with the keys as its values
    keys_attended, _ = chunked_attention(case, Inputs(inputs.q, inputs.k, inputs.k), mods,
                                         torch.float32)
    # dK_j moves by scale * sum_i P_ij e_i q_i, whose e_i are roundings of different rows, so
    # its size is sqrt(sum_i (P_ij w_i)^2 |q_i|^2), not the sum of the terms' sizes (which
    # grows with the rows: with the worst-case w_i, 4-25x |dK| at S1024). That is the mean
    # square of P^T (s_i w_i q_i) over random signs s_i (the gradient of V for that dO),
    # estimated from fixed draws; with one query row it is the term itself.
    generator = torch.Generator().manual_seed(0)
    squares = 0.0
    for _ in range(_DK_DRAWS):
        signs = torch.randint(0, 2, weight.shape, generator=generator).float() * 2 - 1
        signed = signs.to(weight.device) * weight * inputs.q.float()
        draw = chunked_gradients(case, inputs, mods, signed, torch.float32)["dv"]
        squares = squares + draw.pow(2).mean(-1)
    return {"dq": scale * weight.squeeze(-1) * _rms(keys_attended),
            "dk": scale * (squares / _DK_DRAWS).sqrt()}


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean(-1).sqrt()
