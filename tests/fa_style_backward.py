"""A FlashAttention-style backward, written out densely in float32 for tests of the gradient
verdict: what a careful fused kernel computes (FlashAttention-2's algorithm, which
flex_attention's Triton template follows), not what our baseline computes.

P is recomputed in float32 from the log-sum-exp; dV = P^T dO with P rounded to the case dtype;
dP = dO V^T; delta = rowsum(dO * O) with O the forward's output as stored, in the case dtype;
dS = P (dP - delta), through the score mod's derivative, rounded to the dtype for dQ = dS K and
dK = dS^T Q (or, as eager flex_attention does, dS times the softmax scale rounded: ``ds_scaled``);
float32 accumulation, one rounding at the end. Key/value heads shared by a group of query heads
(GQA), and a key/value batch shared by every batch (Bkv = 1), sum their gradients in float32
and round once, as flex_attention's Triton template does; or (``partials_rounded``) as eager
flex_attention's backward does: each query head's and batch's dK and dV rounded to the dtype,
each group's sum rounded again, then the batches' sum.
"""
from __future__ import annotations

import math

import torch

import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import create_block_mask, flex_attention, noop_mask

from cases.inputs import make_grad_output, make_inputs, torch_dtype
from cases.model import Case
from cases.pointwise import evaluate_mask, evaluate_score
from cases.variants import build_mods
from conformance import compat
from reference.golden import Reference


#: Precision losses a backward can make, for tests that the verdict still sees them in float32:
#: dP = dO V^T, or dQ = dS K and dK = dS^T Q, from operands with TF32's 10-bit mantissa (tensor
#: cores' TF32 mode); P rounded to bfloat16 for both of its uses; dS rounded to bfloat16.
LOSSES = ("dp_tf32", "products_tf32", "p_bf16", "ds_bf16")
#: A loss in the sums over shared heads (with ``partials_rounded``): each partial sum rounded
#: to bfloat16 before the case dtype.
PARTIALS_BF16 = "partials_bf16"


def fa_style_gradients(case, inputs, grad_out: torch.Tensor, out: torch.Tensor,
                       loss: str | None = None, ds_scaled: bool = False,
                       partials_rounded: bool = False) -> dict[str, torch.Tensor]:
    s = case.shape
    dtype, group, scale = torch_dtype(case.dtype), s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
    mods = build_mods(case.variant, s)
    q = inputs.q.float()
    k, v = (t.float().expand(s.B, -1, -1, -1).repeat_interleave(group, 1)
            for t in (inputs.k, inputs.v))
    index = [torch.arange(n) for n in (s.B, s.Hq, s.Sq, s.Skv)]
    scores = (q @ k.transpose(-1, -2) * scale).requires_grad_()
    modded = scores if mods.score_mod is None else evaluate_score(mods.score_mod, scores, *index)
    seen = torch.ones(s.B, s.Hq, s.Sq, s.Skv, dtype=torch.bool) if mods.mask_mod is None \
        else evaluate_mask(mods.mask_mod, *index).expand(s.B, s.Hq, s.Sq, s.Skv)
    masked = modded.detach().masked_fill(~seen, -math.inf)
    lse = masked.logsumexp(-1, keepdim=True)
    probs = torch.where(torch.isfinite(lse), (masked - lse).exp(), torch.zeros(()))
    if loss == "p_bf16":
        probs = probs.bfloat16().float()
    d_out = grad_out.float()
    dv = probs.to(dtype).float().transpose(-1, -2) @ d_out
    d_probs = tf32(d_out) @ tf32(v).transpose(-1, -2) if loss == "dp_tf32" else \
        d_out @ v.transpose(-1, -2)
    delta = (out.float() * d_out).sum(-1, keepdim=True)  # from O as stored, in the dtype
    d_modded = probs * (d_probs - delta)
    d_scores = d_modded if mods.score_mod is None else \
        torch.autograd.grad(modded, scores, d_modded)[0]
    # fused kernels round dS and scale dQ and dK after their products; eager flex_attention
    # (sdpa_dense_backward) rounds dS times the scale
    scale_before, scale_after = (scale, 1.0) if ds_scaled else (1.0, scale)
    d_scores = (d_scores.masked_fill(~seen, 0) * scale_before).to(dtype).float()
    if loss == "ds_bf16":
        d_scores = d_scores.bfloat16().float()
    if loss == "products_tf32":
        d_scores, k, q = tf32(d_scores), tf32(k), tf32(q)
    dq = d_scores @ k * scale_after
    dk = d_scores.transpose(-1, -2) @ q * scale_after

    def rounded(grad: torch.Tensor) -> torch.Tensor:
        if loss == PARTIALS_BF16:
            grad = grad.bfloat16().float()
        return grad.to(dtype).float() if partials_rounded else grad

    def per_kv_head(grad: torch.Tensor) -> torch.Tensor:  # [B, Hq, ..] -> [Bkv, Hkv, ..]
        grad = rounded(grad).unflatten(1, (s.Hkv, group)).sum(2)
        if s.Bkv < s.B:
            grad = rounded(grad).sum(0, keepdim=True)
        return grad.to(dtype)

    return {"dq": dq.to(dtype), "dk": per_kv_head(dk), "dv": per_kv_head(dv)}


def block_mask_of(case):
    """The block mask flex_attention needs for ``case`` on the CPU: None without a mask_mod,
    except where key/value are broadcast over the batch (flex_attention then requires one of
    the query batch)."""
    s = case.shape
    mask_mod = build_mods(case.variant, s).mask_mod or (noop_mask if s.Bkv != s.B else None)
    if mask_mod is None:
        return None
    return create_block_mask(mask_mod, s.B if s.Bkv != s.B else None, None, s.Sq, s.Skv, "cpu")


def eager_backward(case: Case, seed: int, mask_mod=None) -> Reference | None:
    """Eager flex_attention's own output and gradients on the CPU, or None where it raises
    (``mask_mod``: this mask instead of the case's, for every batch and head). torch refuses a
    CPU backward, so its device check is lifted for the call; Dynamo is reset first: eager's
    backward traces the mods, and state left by one variant made the next raise."""
    s, mods = case.shape, build_mods(case.variant, case.shape)
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    q, k, val = (t.clone().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    block_mask = block_mask_of(case) if mask_mod is None else \
        create_block_mask(mask_mod, s.B, s.Hq, s.Sq, s.Skv, "cpu")
    check = getattr(flex_module, "_validate_device", None)
    flex_module._validate_device = lambda *args, **kwargs: None
    torch._dynamo.reset()
    try:
        out = compat.attention(flex_attention, q, k, val, mods.score_mod, block_mask,
                               enable_gqa=s.Hq != s.Hkv)
        grads = torch.autograd.grad(out, (q, k, val), grad_out)
    except Exception:  # noqa: BLE001 - counted as skipped
        return None
    finally:
        flex_module._validate_device = check
    return Reference(out.detach(), None, dict(zip(("dq", "dk", "dv"), grads)))


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to nearest at TF32's 10 mantissa bits (ties away from zero)."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
