"""Finding 5 (docs/findings.md): compiled CPU flex_attention miscomputes a score mod that goes
through float32 and back to the score's dtype, ``(f(score.float())).to(score.dtype)`` (the
way soft-capping is often written for 16-bit models). Standalone, torch only.

Each line compares flex_attention's output with a float64 evaluation of the same function:
the mod applied to the exact scores, with the rounding to the query's dtype that its
``.to(score.dtype)`` makes (flex_attention traces a mod with the score in the query's dtype)."""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")  # flex_attention's own warnings on the CPU

MODS = {
    "(tanh(s.float() / 20) * 20).to(s.dtype)": (
        lambda s, b, h, q, k: (torch.tanh(s.float() / 20.0) * 20.0).to(s.dtype),
        lambda s, dtype: (torch.tanh(s / 20) * 20).to(dtype).double()),
    "(s.float() * 1.0).to(s.dtype)": (
        lambda s, b, h, q, k: (s.float() * 1.0).to(s.dtype),
        lambda s, dtype: s.to(dtype).double()),
    "(tanh(s / 20) * 20).to(s.dtype)": (
        lambda s, b, h, q, k: (torch.tanh(s / 20.0) * 20.0).to(s.dtype),
        lambda s, dtype: (torch.tanh(s / 20) * 20).to(dtype).double()),
    "tanh(s.float() / 20) * 20": (
        lambda s, b, h, q, k: torch.tanh(s.float() / 20.0) * 20.0,
        lambda s, dtype: torch.tanh(s / 20) * 20),
}


def main() -> None:
    print(f"torch {torch.__version__}")
    compiled = torch.compile(flex_attention)
    for dtype in (torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 128, 32, generator=gen).to(dtype) for _ in range(3))
        scores = q.double() @ k.double().transpose(-1, -2) / 32 ** 0.5
        for name, (mod, exact_mod) in MODS.items():
            want = torch.softmax(exact_mod(scores, dtype), -1) @ v.double()
            for how, attention in (("eager", flex_attention), ("inductor", compiled)):
                torch._dynamo.reset()
                got = attention(q, k, v, score_mod=mod).double()
                print(f"{str(dtype):15s} {name:40s} {how:8s}: max |out - float64 reference| = "
                      f"{float((got - want).abs().max()):.3g}")


if __name__ == "__main__":
    main()
