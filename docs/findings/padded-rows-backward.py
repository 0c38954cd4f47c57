"""Finding 4 (docs/findings.md): flex_attention's backward on query rows that a score mod hides
with a huge finite constant. Standalone, torch only.

A padded query row (every key's score replaced by FILL) has P = 1/n for each of its n keys, so
it adds dO_i / n to each key's dV. A backward that recomputes P = exp(s - lse) from a float32
lse gets lse == FILL (float32 cannot hold log(n) beside 1e30) and P = 1: n times that share.
torch refuses a backward on the CPU; this lifts its device check to run eager flex_attention's
own backward (on CUDA, call it as is)."""
import torch
import torch.nn.attention.flex_attention as flex_module
from torch.nn.attention.flex_attention import flex_attention

S, D, REAL = 128, 16, 96


def run(fill: float) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(1, 1, S, D, generator=gen) for _ in range(4))

    def padded(score, b, h, q_idx, kv_idx):
        return torch.where((q_idx >= REAL) | (kv_idx >= REAL), fill, score)

    # exact: float64 autograd through the softmax (the row maximum shifted out)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) / D ** 0.5
    rows, keys = torch.arange(S).view(-1, 1), torch.arange(S)
    scores = torch.where((rows >= REAL) | (keys >= REAL), torch.tensor(fill, dtype=torch.float64),
                         scores)
    out64 = torch.softmax(scores, -1) @ v64
    exact = torch.autograd.grad(out64, v64, d_out.double())[0]

    qe, ke, ve = (t.clone().requires_grad_() for t in (q, k, v))
    check = flex_module._validate_device
    flex_module._validate_device = lambda *args, **kwargs: None
    torch._dynamo.reset()  # eager flex_attention traces the mod; a new fill is a new mod
    try:
        out = flex_attention(qe, ke, ve, score_mod=padded)
        dv = torch.autograd.grad(out, ve, d_out)[0]
    finally:
        flex_module._validate_device = check
    share = d_out[0, 0, REAL:].sum(0) / S  # the padded rows' exact share of each key's dV
    error = (dv.double() - exact)[0, 0]
    out_error = float((out.detach().double() - out64.detach()).abs().max())
    print(f"fill {fill:9.3g}: output off by {out_error:.2g}; "
          f"dV off by {float(error.abs().max()):.3g}, "
          f"in units of the padded rows' share: {float((error / share).median()):.1f} "
          f"(n - 1 = {S - 1})")


if __name__ == "__main__":
    print(torch.__version__)
    for fill in (-1e4, -1e30, torch.finfo(torch.float32).min):
        run(fill)
