"""Finding 6 (docs/findings.md): eager flex_attention runs its softmax, and returns its
log-sum-exp, in a score mod's output dtype when that is 16-bit. Standalone, torch only.

Eager flex_attention computes the scores in float32, applies the mod, and masks with
``torch.where(mask, modded, torch.tensor(-inf, dtype=float32))``: a 0-d float32 tensor does
not promote a bfloat16 one, so a mod that returns ``x.to(score.dtype)`` (bfloat16 in a
bfloat16 case, as flex_attention traces it) makes every later step bfloat16. The same mod
with ``.float()`` after it computes the same function with a float32 softmax."""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")  # flex_attention's own warnings on the CPU


def softcap(s, b, h, q, k):
    return (torch.tanh(s.float() / 20.0) * 20.0).to(s.dtype)


def softcap_float32(s, b, h, q, k):
    return softcap(s, b, h, q, k).float()


def main() -> None:
    print(f"torch {torch.__version__}")
    for dtype in (torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 128, 32, generator=gen).to(dtype) for _ in range(3))
        scores = q.double() @ k.double().transpose(-1, -2) / 32 ** 0.5
        modded = (torch.tanh(scores / 20) * 20).to(dtype).double()  # the traced function
        want_out = torch.softmax(modded, -1) @ v.double()
        want_lse = torch.logsumexp(modded, -1)
        for name, mod in (("returns .to(s.dtype)", softcap), ("then .float()", softcap_float32)):
            out, lse = flex_attention(q, k, v, score_mod=mod, return_lse=True)
            print(f"{str(dtype):15s} {name:21s}: lse dtype {str(lse.dtype):15s} "
                  f"max |lse - float64| = {float((lse.double() - want_lse).abs().max()):.3g}, "
                  f"max |out - float64| = {float((out.double() - want_out).abs().max()):.3g}")


if __name__ == "__main__":
    main()
