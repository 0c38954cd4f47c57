"""A float32 forward written out densely, for tests of the output verdict: correct kernels
whose roundings differ from the baseline's (the scores' dot products summed in another order,
or rounded from float64), and forwards with a precision loss (not correct answers).

The baseline's roundings are eager flex_attention's own (the same float32 operations in the
same order), so a correct kernel that rounds its scores differently, as any other kernel does,
is what the verdict must pass: with scores of tens its rows dominated by a few keys carry a
different draw of those roundings."""
from __future__ import annotations

import math

import torch

from cases.inputs import Inputs
from cases.model import Case
from cases.pointwise import evaluate_mask, evaluate_score
from cases.variants import build_mods
from tests.fa_style_backward import tf32

#: Correct kernels: the dot products q.k summed from the last term of the head dim to the
#: first, or computed in float64 and rounded once (more careful than float32 arithmetic), or
#: flex_attention's Triton template's order of operations (online_forward). (Also correct:
#: "plain", the baseline's own operations, and "rounded_mod", the score mod evaluated in
#: float64 and rounded once.)
CORRECT = ("reversed_sums", "rounded_scores", "online")
#: online_forward's blocks of keys (a block size of the Triton template's kind; its own
#: depends on the head dim and the GPU).
ONLINE_BLOCK = 64
_LOG2E = 1.0 / math.log(2.0)
#: Precision losses: q and k, or P and V, as TF32's 10-bit mantissa gives them to tensor cores
#: (round to nearest); P rounded to bfloat16 for the P V product; exp accurate to 2^-16
#: ("exp_N_bits": a relative error of up to 2^-N on each term).
LOSSES = ("scores_tf32", "pv_tf32", "p_bf16", "exp_16_bits")


def float32_forward(case: Case, inputs: Inputs, kind: str) -> torch.Tensor:
    if kind == "online":
        return online_forward(case, inputs)
    scores, v = _scores(case, inputs, kind)
    probs = (scores - scores.amax(-1, keepdim=True)).exp()
    if kind.startswith("exp_") and kind.endswith("_bits"):  # up to 2^-N relative, per term
        bits = int(kind.split("_")[1])
        draws = torch.rand(probs.shape, generator=torch.Generator().manual_seed(0))
        probs = probs * (1 + (draws * 2 - 1) * 2.0 ** -bits)
    product = probs
    if kind == "p_bf16":
        product = probs.bfloat16().float()
    if kind == "pv_tf32":
        product, v = tf32(probs), tf32(v)
    return (product @ v) / probs.sum(-1, keepdim=True)


def _scores(case: Case, inputs: Inputs, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The scores after the score mod and the mask ([B, Hq, Sq, Skv] float32, -inf where
    masked), rounded as ``kind`` rounds them, and V expanded to the query heads."""
    s = case.shape
    group, scale = s.Hq // s.Hkv, 1.0 / math.sqrt(s.D)
    mods = build_mods(case.variant, s)
    q = inputs.q.float()
    k, v = (t.float().expand(s.B, -1, -1, -1).repeat_interleave(group, 1)
            for t in (inputs.k, inputs.v))
    if kind == "scores_tf32":
        q, k = tf32(q), tf32(k)
    if kind == "reversed_sums":
        scores = q.flip(-1) @ k.flip(-1).transpose(-1, -2) * scale
    elif kind == "prescaled":  # in log2 units
        scores = q * (scale * _LOG2E) @ k.transpose(-1, -2)
    elif kind == "rounded_scores":
        scores = (q.double() @ k.double().transpose(-1, -2) * scale).float()
    else:
        scores = q @ k.transpose(-1, -2) * scale
    index = [torch.arange(n) for n in (s.B, s.Hq, s.Sq, s.Skv)]
    if mods.score_mod is not None and kind == "rounded_mod":
        scores = evaluate_score(mods.score_mod, scores.double(), *index).float()
    elif mods.score_mod is not None:
        scores = evaluate_score(mods.score_mod, scores, *index)
    if mods.mask_mod is not None:
        seen = evaluate_mask(mods.mask_mod, *index).expand(scores.shape)
        scores = scores.masked_fill(~seen, -math.inf)
    return scores, v


def online_forward(case: Case, inputs: Inputs, prescaled: bool = False) -> torch.Tensor:
    """A float32 forward in the order of flex_attention's Triton template with IEEE float32
    products: scores scaled, modded and masked, then in log2 units; an online softmax over
    blocks of ONLINE_BLOCK keys (each block's row maximum, exp2 of the shifted scores, the
    running sum and the accumulator rescaled when the maximum rises); P V accumulated into the
    running output one key at a time (one rounding per key at the accumulator's size, as a
    fused multiply-add loop does), divided by the running sum at the end. ``prescaled``: q
    times the softmax scale and log2 e before the product, whose scores are then in log2
    units (the template's way without a score mod; FlashAttention's too)."""
    if prescaled:
        if build_mods(case.variant, case.shape).score_mod is not None:
            raise ValueError(f"{case.id}: a prescaled q leaves no score to mod")
        scores, v = _scores(case, inputs, "prescaled")
    else:
        scores, v = _scores(case, inputs, "plain")
        scores = scores * _LOG2E
    row_max = torch.full(scores.shape[:-1] + (1,), -math.inf)
    row_sum = torch.zeros_like(row_max)
    acc = torch.zeros(scores.shape[:-1] + (v.shape[-1],))
    zero = torch.zeros(())
    for start in range(0, scores.shape[-1], ONLINE_BLOCK):
        block = scores[..., start:start + ONLINE_BLOCK]
        new_max = torch.maximum(row_max, block.amax(-1, keepdim=True))
        shift = torch.where(torch.isfinite(new_max), new_max, zero)  # a row masked so far
        probs = torch.exp2(block - shift)
        alpha = torch.exp2(torch.where(torch.isfinite(row_max), row_max, shift) - shift)
        row_sum = row_sum * alpha + probs.sum(-1, keepdim=True)
        acc = acc * alpha
        for j in range(probs.shape[-1]):
            acc = torch.addcmul(acc, probs[..., j:j + 1], v[..., start + j:start + j + 1, :])
        row_max = new_max
    return torch.where(row_sum > 0, acc / row_sum, zero)

