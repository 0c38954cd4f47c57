"""Eager flex_attention's error against float64, beside a kernel that takes its scores in
float32 (docs/findings.md, finding 9). torch 2.6.0 computes q k^T in the inputs' dtype and then
converts it to float32; torch 2.13.0 converts q and k to float32 before the product. Torch only.

    python docs/findings/eager-raw-scores-16bit.py
"""
import math
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention


def softcap(score, b, h, q_idx, kv_idx):
    return 50.0 * torch.tanh(score / 50.0)


def float32_scores(q, k, v, dtype):
    """Scores, the mod and the softmax in float32; P rounded to ``dtype`` for P V (as fused
    kernels do); the output rounded to ``dtype``."""
    scores = softcap(q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1]),
                     None, None, None, None)
    probs = torch.softmax(scores, dim=-1).to(dtype)
    return (probs.float() @ v.float()).to(dtype)


def main():
    warnings.filterwarnings("ignore")  # eager's "use torch.compile" advice
    print("torch", torch.__version__)
    gen = torch.Generator().manual_seed(0)
    shape = (4, 8, 1024, 128)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    exact = flex_attention(q, k, v, score_mod=softcap)
    for dtype in (torch.bfloat16, torch.float16):
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        eager = flex_attention(qd, kd, vd, score_mod=softcap).double()
        careful = float32_scores(qd, kd, vd, dtype).double()
        e_eager = (eager - exact).abs().mean().item()
        e_careful = (careful - exact).abs().mean().item()
        print(f"{str(dtype):15s} mean |eager - float64| = {e_eager:.3g}, with float32 scores "
              f"{e_careful:.3g}: {e_eager / e_careful:.2f}x")


if __name__ == "__main__":
    main()
