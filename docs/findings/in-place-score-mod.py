"""docs/findings.md, finding 11: a score mod that changes its score argument in place
(``score.clamp_(-3, 3)``), in eager flex_attention and in torch.compile(flex_attention,
fullgraph=True, dynamic=False), against softmax(clamp(scores)) V. torch 2.15.0 refuses it in both
('Encountered input mutation during higher order op tracing'); 2.6 to 2.14 run it eagerly.
torch only; prints one line per mode.

    python docs/findings/in-place-score-mod.py
"""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")


def clamped_in_place(score, b, h, q_idx, kv_idx):
    return score.clamp_(-3.0, 3.0)


g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
want = torch.softmax((q @ k.transpose(-1, -2) / 4).clamp(-3, 3), -1) @ v
print("torch", torch.__version__)
for name, flex in (("eager", flex_attention),
                   ("compiled", torch.compile(flex_attention, fullgraph=True, dynamic=False))):
    torch._dynamo.reset()
    try:
        got = flex(q, k, v, score_mod=clamped_in_place)
        print(f"  {name:9s} max |out - softmax(clamp(s)) V| = {(got - want).abs().max():.1e}")
    except Exception as exc:  # noqa: BLE001
        first = next((line for line in str(exc).splitlines() if line.strip()), "")
        print(f"  {name:9s} {type(exc).__name__}: {first[:100]}")
