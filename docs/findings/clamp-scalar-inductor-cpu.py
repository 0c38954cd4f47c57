"""Finding 7 (docs/findings.md): compiled CPU flex_attention miscomputes a score mod that clamps
the score with a Python-number bound, ``torch.clamp(score, min=c)`` (or ``max=c``), in bfloat16
and float16; ``torch.clamp_min(score, c)`` is right. Standalone, torch only.

Each line compares flex_attention's output with a float64 evaluation of the same function
(the clamp applied to the exact scores)."""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")  # flex_attention's own warnings on the CPU

MODS = {
    "clamp(s, min=-0.3)": (lambda s, b, h, q, k: torch.clamp(s, min=-0.3),
                           lambda s: s.clamp(min=-0.3)),
    "clamp(s, max=0.5)": (lambda s, b, h, q, k: torch.clamp(s, max=0.5),
                          lambda s: s.clamp(max=0.5)),
    "clamp_min(s, -0.3)": (lambda s, b, h, q, k: torch.clamp_min(s, -0.3),
                           lambda s: s.clamp_min(-0.3)),
    "s (no clamp)": (lambda s, b, h, q, k: s, lambda s: s),
}


def main() -> None:
    print(f"torch {torch.__version__}")
    compiled = torch.compile(flex_attention)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 128, 32, generator=gen).to(dtype) for _ in range(3))
        scores = q.double() @ k.double().transpose(-1, -2) / 32 ** 0.5
        for name, (mod, exact_mod) in MODS.items():
            want = torch.softmax(exact_mod(scores), -1) @ v.double()
            for how, attention in (("eager", flex_attention), ("inductor", compiled)):
                torch._dynamo.reset()
                got = attention(q, k, v, score_mod=mod).double()
                print(f"{str(dtype):15s} {name:20s} {how:8s}: max |out - float64 reference| = "
                      f"{float((got - want).abs().max()):.3g}")


if __name__ == "__main__":
    main()
