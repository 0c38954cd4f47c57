"""Would the golden be faster if each query chunk's heads went through the softmax in groups,
so a group's scores stay in the L2 cache? A/B on warm calls of the ALiBi golden at B2 H8 S4096
D64 (or the variant given), the group sizes taking turns in one process, fastest of three each;
the outputs of every grouping must equal the ungrouped one to float64 rounding.

    python benchmarks/bench_head_groups.py [--variant alibi] [--groups 8,4,2,1]

An experiment, not the golden's code: it wraps reference.kernel._attend from outside. The
result (docs/performance.md, "The float64 golden") is why the golden keeps all heads together.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import reference.kernel as kernel  # noqa: E402
from cases import variants  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from reference.golden import golden_attention  # noqa: E402

UNGROUPED = kernel._attend


def grouped_attend(heads_per_group: int):
    """``_attend`` run on groups of ``heads_per_group`` key/value heads, outputs joined."""
    def attend(chunk, mods, probs_dtype):
        group, kv_heads = chunk.group, chunk.k.shape[0]
        if heads_per_group >= kv_heads:
            return UNGROUPED(chunk, mods, probs_dtype)
        outs, lses = [], []
        for start in range(0, kv_heads, heads_per_group):
            stop = min(start + heads_per_group, kv_heads)
            rows = slice(start * group, stop * group)
            mask = chunk.mask
            if mask is not None and mask.shape[0] == kv_heads * group:
                mask = mask[rows]
            part = dataclasses.replace(
                chunk, q=chunk.q[rows], k=chunk.k[start:stop], v=chunk.v[start:stop],
                v_ones=None if chunk.v_ones is None else chunk.v_ones[start:stop],
                heads=chunk.heads[rows], mask=mask)
            out, lse = UNGROUPED(part, mods, probs_dtype)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs), torch.cat(lses)
    return attend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="alibi")
    parser.add_argument("--groups", default="8,4,2,1")
    args = parser.parse_args()
    sizes = [int(size) for size in args.groups.split(",")]
    case = Case(getattr(variants, args.variant)(), Shape.parse("b2-h8x8-s4096x4096-d64"), "bf16")
    inputs = make_inputs(case, 0)
    reference = golden_attention(case, inputs).out  # also the warm-up of the process
    fastest = {size: float("inf") for size in sizes}
    for _ in range(3):
        for size in sizes:
            kernel._attend = grouped_attend(size)
            start = time.perf_counter()
            out = golden_attention(case, inputs).out
            fastest[size] = min(fastest[size], time.perf_counter() - start)
            kernel._attend = UNGROUPED
            assert (out - reference).abs().max() < 1e-12, size
    for size in sizes:
        print(f"{args.variant}: {size} head(s) per group: {fastest[size]:.3f} s "
              f"(x{fastest[size] / fastest[sizes[0]]:.2f} of {sizes[0]})")


if __name__ == "__main__":
    main()
