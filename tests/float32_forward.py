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
#: first, or computed in float64 and rounded once (more careful than float32 arithmetic).
#: (Also correct: "plain", the baseline's own operations, and "rounded_mod", the score mod
#: evaluated in float64 and rounded once.)
CORRECT = ("reversed_sums", "rounded_scores")
#: Precision losses: q and k, or P and V, as TF32's 10-bit mantissa gives them to tensor cores
#: (round to nearest); P rounded to bfloat16 for the P V product; exp accurate to 2^-16
#: ("exp_N_bits": a relative error of up to 2^-N on each term).
LOSSES = ("scores_tf32", "pv_tf32", "p_bf16", "exp_16_bits")


def float32_forward(case: Case, inputs: Inputs, kind: str) -> torch.Tensor:
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

