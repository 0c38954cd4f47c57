"""Finding 8 (docs/findings.md): compiled CPU flex_attention fails with "IndexError: tuple index
out of range" when a score mod captures a tensor that requires grad (an nn.Parameter bias, in a
model run for inference without torch.no_grad()), though nothing calls backward. Eager is
right, and so is the compiled call under torch.no_grad(); with q requiring grad instead, torch
says what it means: "FlexAttention does not support backward on CPU". Standalone, torch only."""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")  # flex_attention's own warnings on the CPU

HEADS, REACH = 4, 16


def main() -> None:
    print(f"torch {torch.__version__}")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, 150, 32, generator=gen).to(torch.bfloat16)
               for _ in range(3))
    table = torch.randn(HEADS, 2 * REACH + 1, generator=gen).requires_grad_()  # a parameter

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, torch.clamp(q_idx - kv_idx, -REACH, REACH) + REACH]

    eager = flex_attention(q, k, v, score_mod=relative_bias)
    print("eager                        : ok")
    for name, grad_mode in (("compiled, grad enabled       ", torch.enable_grad),
                            ("compiled, under torch.no_grad", torch.no_grad)):
        torch._dynamo.reset()
        try:
            with grad_mode():
                out = torch.compile(flex_attention)(q, k, v, score_mod=relative_bias)
            error = (out.float() - eager.float()).abs().max().item()
            print(f"{name}: ok, max |compiled - eager| = {error:.3g}")
        except Exception as exc:  # noqa: BLE001 - the finding
            print(f"{name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")


if __name__ == "__main__":
    main()
