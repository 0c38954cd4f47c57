"""How much rounding noise a correct backward leaves in each row of dQ and dK where the terms
of the row cancel, so that the verdict can judge those rows by what a careful kernel can do.

dQ_i = scale * sum_j P_ij (dP_ij - delta_i) k_j, with dP_ij = dO_i . v_j and delta_i = dO_i . O_i.
In a row that sees few keys, dP_ij and delta_i nearly cancel and the golden dQ_i is small (0
when the row sees one key), while every fused kernel (FlashAttention, flex_attention's Triton
template, eager flex_attention) takes delta_i from O as stored in the case dtype: a rounding of
O by u |O| moves delta_i by up to u sum_d |dO_id O_id| = u w_i, and dQ_i by up to
u scale w_i (P K)_i, whatever the golden's size. dK_j = scale sum_i P_ij (dP_ij - delta_i) q_i
is moved by up to u scale sum_i P_ij w_i |q_i|. Those sizes (without u, which the verdict's
dtype term supplies) are this module's answer: the magnitude of what cancels in each row,
beside the golden's own, which the row's error is measured against. In rows with many keys
they are about the size of the gradient itself, so the rows that do not cancel keep their
limit (docs/oracle.md: a correct FlashAttention-style backward failed the dQ row rule by up to
18x in rows whose golden was 1/100 of that noise).
"""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.variants import Mods


def cancelling_magnitudes(case: Case, inputs: Inputs, mods: Mods, grad_out: torch.Tensor,
                          out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per row, the RMS over the head dim of the terms a rounding of O moves: ``{"dq": [B, Hq,
    Sq], "dk": [Bkv, Hkv, Skv]}`` (float32: a size, not a value). ``out`` is the golden O."""
    from reference.golden import chunked_attention, chunked_gradients  # they import this module

    scale = 1.0 / math.sqrt(case.shape.D)
    weight = (grad_out.to(out.dtype) * out).abs().sum(-1, keepdim=True).float()  # w_i
    # (P K)_i: the same attention with the keys as its values
    keys_attended, _ = chunked_attention(case, Inputs(inputs.q, inputs.k, inputs.k), mods,
                                         torch.float32)
    # sum_i P_ij w_i |q_i|: the gradient of V for dO_i = w_i |q_i|
    spread = chunked_gradients(case, inputs, mods, weight * inputs.q.float().abs(),
                               torch.float32)["dv"]
    return {"dq": scale * weight.squeeze(-1) * _rms(keys_attended), "dk": scale * _rms(spread)}


def _rms(t: torch.Tensor) -> torch.Tensor:
    return t.pow(2).mean(-1).sqrt()
