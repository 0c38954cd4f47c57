"""docs/findings.md, finding 10: flex_attention with a score mod that captures a Python float,
called again with the float changed (a soft-cap of another cap, as a model with a cap per layer
or a sweep calls it). Dynamo recompiles the call with the float made symbolic (automatic
dynamic), and that recompile fails: in torch.compile(flex_attention) on the CPU from 2.13
(Inductor: 'unbacked_bindings'), and in eager flex_attention too in 2.15.0 (Dynamo's check of
the score mod's captured values refuses a SymFloat). torch only; prints one line per mode.

    python docs/findings/captured-float-recompile.py
"""
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")


def softcap(cap):
    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return score_mod


def reference(q, k, v, cap):
    s = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(cap * torch.tanh(s / cap), -1) @ v.double()


g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
print("torch", torch.__version__)
for name, flex in (("eager", flex_attention), ("compiled", torch.compile(flex_attention))):
    torch._dynamo.reset()
    calls = []
    for cap in (50.0, 30.0, 20.0):
        try:
            err = (flex(q, k, v, score_mod=softcap(cap)).double() - reference(q, k, v, cap))
            calls.append(f"cap {cap:g}: max error {err.abs().max().item():.1e}")
        except Exception as exc:  # noqa: BLE001
            first = next((line for line in str(exc).splitlines() if line.strip()), "")
            calls.append(f"cap {cap:g}: {type(exc).__name__}: {first[:90]}")
    print(f"  {name:9s}", " | ".join(calls))
