"""The golden of a score mod with an operation vmap has no batching rule for (clamp_), beside
the same mask with no score mod, in one process: ``python benchmarks/bench_golden_unbatchable_mod.py
1,2,256,64 2,8,4096,64`` (each argument B,H,S,D; bf16, causal). docs/performance.md, "A score
mod with an operation vmap cannot batch"; docs/oracle.md says how such mods are evaluated."""
from __future__ import annotations

import sys
import time

from cases.inputs import make_inputs
from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder
from reference.golden import golden_attention


@builder("bench_clamp_in_place")
def _clamp_in_place(variant, shape, device):
    return Mods(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx,
                lambda score, b, h, q_idx, kv_idx: score.float().clamp_(-3.0, 3.0))


def main(shapes: list[str]) -> None:
    for spec in shapes:
        B, H, S, D = map(int, spec.split(","))
        for name in ("bench_clamp_in_place", "causal"):
            case = Case(Variant(name), Shape(B, H, H, S, S, D), "bf16")
            inputs = make_inputs(case, 0)
            start = time.perf_counter()
            golden_attention(case, inputs)
            print(f"{name:22s} B{B} H{H} S{S} D{D}: golden "
                  f"{time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["1,2,256,64", "2,8,4096,64"])
