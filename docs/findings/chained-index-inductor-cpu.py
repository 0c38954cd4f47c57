"""Compiled CPU flex_attention mis-computes a score_mod (or mask_mod) that indexes a captured
tensor by chained subscripts, t[h][i % 4][j % 4]; the same index written t[h, i % 4, j % 4]
is right, and so is eager. Found by the FlexAttention conformance suite (docs/findings.md)."""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
table = torch.randn(4, 4, 4)
keep = torch.rand(4, 4, 4) > 0.3
keep[:, :, 0] = True  # every row keeps a key

def chained(score, b, h, i, j):
    return score + table[h][i % 4][j % 4]

def flat(score, b, h, i, j):
    return score + table[h, i % 4, j % 4]

def chained_mask(b, h, i, j):
    return keep[h][i % 4][j % 4]

def flat_mask(b, h, i, j):
    return keep[h, i % 4, j % 4]

def run(fn, backend=None, **kwargs):
    torch._dynamo.reset()
    f = flex_attention if backend is None else torch.compile(flex_attention, backend=backend, fullgraph=True, dynamic=False)
    return f(q, k, v, **kwargs).double()

reference = flex_attention(q.double(), k.double(), v.double(), score_mod=flat)
print("torch", torch.__version__)
for backend in (None, "aot_eager", "inductor"):
    print(f"score_mod chained, {backend or 'eager':9}: max |out - float64 reference| =",
          f"{(run(flex_attention, backend, score_mod=chained) - reference).abs().max().item():.3g}")
print(f"score_mod flat,    inductor : max |out - float64 reference| =",
      f"{(run(flex_attention, 'inductor', score_mod=flat) - reference).abs().max().item():.3g}")
mask_ref = flex_attention(q.double(), k.double(), v.double(),
                          block_mask=create_block_mask(flat_mask, None, 4, 64, 64, device="cpu"))
for backend in (None, "inductor"):
    torch._dynamo.reset()
    block = create_block_mask(chained_mask, None, 4, 64, 64, device="cpu")
    print(f"mask_mod  chained, {backend or 'eager':9}: max |out - float64 reference| =",
          f"{(run(flex_attention, backend, block_mask=block) - mask_ref).abs().max().item():.3g}")
