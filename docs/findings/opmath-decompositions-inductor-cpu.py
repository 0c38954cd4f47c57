"""Finding 13 (docs/findings.md): compiled CPU flex_attention miscomputes, in bfloat16 and
float16, a score mod built of torch functions whose decompositions compute a 16-bit input in
float32 and round back (Inductor's decomposition table: gelu, logsigmoid, silu, softplus, elu,
mish, clamp with a Python bound); the same functions written out without that round trip, and
every float32 case, are right. Standalone, torch only.

Each line: how many dtype conversions the mod's decomposition holds (what Inductor compiles),
and flex_attention's output against a float64 evaluation of the same function on the exact
scores, eager and compiled."""
import math
import warnings

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention.flex_attention import flex_attention

warnings.filterwarnings("ignore")  # flex_attention's own warnings on the CPU

#: name -> the function of the score; float64 evaluates the same function
MODS = {
    "F.gelu(4 s, approximate='tanh')": lambda s: F.gelu(4.0 * s, approximate="tanh"),
    "F.gelu(4 s)": lambda s: F.gelu(4.0 * s),
    "3 F.logsigmoid(2 s)": lambda s: 3.0 * F.logsigmoid(2.0 * s),
    "F.silu(s)": lambda s: F.silu(s),
    "s * torch.sigmoid(s)": lambda s: s * torch.sigmoid(s),
    "F.softplus(s)": lambda s: F.softplus(s),
    "F.elu(s)": lambda s: F.elu(s),
    "F.mish(s)": lambda s: F.mish(s),
    "torch.clamp(s, min=-0.3)": lambda s: torch.clamp(s, min=-0.3),
    "torch.clamp_min(s, -0.3)": lambda s: torch.clamp_min(s, -0.3),
    "torch.tanh(s / 20) * 20": lambda s: torch.tanh(s / 20) * 20,
}


def conversions(fn, dtype: torch.dtype) -> int:
    """The dtype conversions in fn's graph after Inductor's decompositions, on ``dtype``."""
    from torch._inductor.decomposition import select_decomp_table

    graph = make_fx(fn, decomposition_table=select_decomp_table())(torch.ones(4, dtype=dtype))
    return sum("convert_element_type" in str(node.target) for node in graph.graph.nodes)


def main() -> None:
    print(f"torch {torch.__version__}")
    compiled = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, 128, 32, generator=gen).to(dtype) for _ in range(3))
        scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)
        for name, fn in MODS.items():
            def score_mod(score, b, h, q_idx, kv_idx, fn=fn):
                return fn(score)
            want = torch.softmax(fn(scores), -1) @ v.double()
            errors = []
            for attention in (flex_attention, compiled):
                torch._dynamo.reset()
                got = attention(q, k, v, score_mod=score_mod).double()
                errors.append(float((got - want).abs().max()))
            print(f"{str(dtype):15s} {name:32s} conversions {conversions(fn, dtype)}: "
                  f"max |out - float64| eager {errors[0]:.3g}, inductor {errors[1]:.3g}")


if __name__ == "__main__":
    main()
