"""Compiled CPU flex_attention gives NaN and wrong rows when a score_mod's value is promoted to
float64 by a captured float64 0-d tensor times an index expression (alpha * (q_idx - kv_idx));
eager is right, and so is compiled when the mod casts back (.float()) or alpha is float32 or a
Python float. Found by the FlexAttention conformance suite (docs/findings.md, finding 3) on a
third-party style mod."""
import torch
from torch.nn.attention.flex_attention import flex_attention

torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, 256, 16) for _ in range(3))
alpha64 = torch.tensor(0.75, dtype=torch.float64)
alpha32 = torch.tensor(0.75, dtype=torch.float32)

mods = {
    "float64 alpha * (q - kv)": lambda s, b, h, i, j: s + alpha64 * (i - j) * 0.01,
    "float64 alpha * kv": lambda s, b, h, i, j: s + alpha64 * j * 0.01,
    "float64 alpha alone": lambda s, b, h, i, j: s + alpha64,
    "float64 alpha * (q - kv), .float()": lambda s, b, h, i, j: s + (alpha64 * (i - j) * 0.01).float(),
    "float32 alpha * (q - kv)": lambda s, b, h, i, j: s + alpha32 * (i - j) * 0.01,
}
print("torch", torch.__version__)
for name, mod in mods.items():
    reference = flex_attention(q.double(), k.double(), v.double(), score_mod=mod)
    for backend in (None, "inductor"):
        torch._dynamo.reset()
        f = flex_attention if backend is None else torch.compile(
            flex_attention, backend=backend, fullgraph=True, dynamic=False)
        out = f(q, k, v, score_mod=mod).double()
        print(f"{name:36} {backend or 'eager':8}: NaN {int(out.isnan().sum()):4d}, max |out - "
              f"float64 reference| where finite = {(out - reference).nan_to_num(0).abs().max().item():.3g}")
