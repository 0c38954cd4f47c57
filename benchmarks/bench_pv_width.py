"""The float64 rate of the golden's P V product by the width of V, at the golden's chunk shapes:
why reference/chunks.py pads V (with its column of ones) to a multiple of _PV_COLUMN_MULTIPLE.

    python benchmarks/bench_pv_width.py [--repeats 8]

For each head size D, P [8, rows, keys] (one full-width chunk of 8 heads, the rows as the
golden cuts them) times V [8, keys, W] for W = D (the plain product, plus a row-sum pass for
the normalizer), D + 1 and the next multiples of 8 and of 24 after D (V with its ones column).
The widths take turns, the fastest of ``--repeats`` counts; printed: GFLOP/s on the executed
flops, and the time of each against the plain product with its row sum (below 1: faster).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reference.chunk_plan import CHUNK_SCORE_ELEMENTS  # noqa: E402
from reference.chunks import _PV_COLUMN_MULTIPLE  # noqa: E402
from reference.heap import keep_freed_heap  # noqa: E402

HEADS = 8
KEYS = (1024, 4096)
HEAD_SIZES = (16, 32, 64, 128)


def widths(d: int) -> list[int]:
    def next_multiple(n: int, of: int) -> int:
        return -(-n // of) * of
    return sorted({d + 1, next_multiple(d + 1, 8), next_multiple(d + 1, 24)})


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    keep_freed_heap()  # as the golden runs: chunk buffers reused, not page-faulted in again
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, the golden pads to a "
          f"multiple of {_PV_COLUMN_MULTIPLE}")
    print("| D | keys | rows | plain P V and row sum | V with ones, width W: GFLOP/s, time "
          "against plain |")
    print("|---|---|---|---|---|")
    for d in HEAD_SIZES:
        for keys in KEYS:
            rows = max(1, CHUNK_SCORE_ELEMENTS // (HEADS * keys))
            p = torch.rand(HEADS, rows, keys, dtype=torch.float64)
            v = torch.randn(HEADS, keys, d, dtype=torch.float64)
            padded = {w: torch.randn(HEADS, keys, w, dtype=torch.float64) for w in widths(d)}
            runs = {"plain": lambda: (torch.bmm(p, v), p.sum(-1)),
                    **{w: (lambda vw=vw: torch.bmm(p, vw)) for w, vw in padded.items()}}
            times = {name: float("inf") for name in runs}
            for name, run in runs.items():  # warm-up: the first call of a shape is slower
                run()
            for _ in range(args.repeats):  # the widths take turns
                for name, run in runs.items():
                    times[name] = min(times[name], seconds(run))
            flops = 2.0 * HEADS * rows * keys
            cells = [f"W {w}: {flops * w / t / 1e9:.0f}, x{t / times['plain']:.2f}"
                     for w, t in ((w, times[w]) for w in padded)]
            print(f"| {d} | {keys} | {rows} | {flops * d / times['plain'] / 1e9:.0f} GFLOP/s | "
                  + "; ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
