"""The golden's time with chunks of whole blocks of rows (reference/chunk_plan.py,
CHUNK_ROW_MULTIPLE) against other multiples, in one process, taking turns on the same inputs.

    python benchmarks/bench_chunk_rows.py [--case alibi:b2-h8x8-s4096x4096-d64 ...]
                                          [--multiples 1,8,16] [--turns 5]

A multiple of 1 is the plan before REFERENCE_VERSION 18 (chunks cut wherever the score budget
ends). Each turn runs every multiple once, in order; the first turn is dropped (it grows the
heap), and the fastest and the median of the rest are printed, with each multiple's largest
difference from the first one's output (float64 rounding only: the chunks' products change
shape, not what they compute).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import reference.chunk_plan as chunk_plan  # noqa: E402
from cases import variants  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from reference.golden import golden_attention  # noqa: E402

DEFAULT_CASES = ("causal:b2-h8x8-s4096x4096-d64", "alibi:b2-h8x8-s4096x4096-d64")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="VARIANT:SHAPE, repeatable")
    parser.add_argument("--multiples", default="1,16")
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    multiples = [int(m) for m in args.multiples.split(",")]
    print("| case | " + " | ".join(f"rows x{m}: fastest, median" for m in multiples)
          + " | fastest against x" + str(multiples[0]) + " | largest |difference| |")
    print("|---" * (len(multiples) + 3) + "|")
    for spec in args.case or DEFAULT_CASES:
        variant, shape = spec.split(":")
        case = Case(getattr(variants, variant)(), Shape.parse(shape), "bf16")
        inputs = make_inputs(case, 0)
        seconds = {m: [] for m in multiples}
        outputs = {}
        for turn in range(args.turns + 1):
            for multiple in multiples:
                chunk_plan.CHUNK_ROW_MULTIPLE = multiple
                t0 = time.perf_counter()
                outputs[multiple] = golden_attention(case, inputs).out
                if turn:
                    seconds[multiple].append(time.perf_counter() - t0)
        first = multiples[0]
        cells = [f"{min(seconds[m]):.3f} s, {statistics.median(seconds[m]):.3f} s"
                 for m in multiples]
        ratios = ", ".join(f"x{m} {min(seconds[m]) / min(seconds[first]):.2f}"
                           for m in multiples[1:])
        diffs = ", ".join(f"{float((outputs[m] - outputs[first]).abs().max()):.1e}"
                          for m in multiples[1:])
        print(f"| {spec} | " + " | ".join(cells) + f" | {ratios} | {diffs} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
