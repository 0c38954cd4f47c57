"""Speed and memory of the float64 golden, against the golden before it evaluated mods point by
point (``--before``, a commit: its reference/golden.py, which called the mods once on broadcast
grids), against PyTorch's own golden (eager flex_attention on float64 inputs) on the same case,
and against this machine's float64 matmul rate, in one run.

    python benchmarks/bench_golden.py [--skip-largest] [--before c58e235]

Each measurement runs in a fresh subprocess so that peak memory (ru_maxrss) is its own;
"extra peak" is the peak minus the resident size right after the inputs were made. Ours and
the one before run alternately ``--repeats`` times and the fastest of each counts, so a change
of load on a shared machine does not land on one side only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The last commit whose golden evaluated mods on broadcast grids (REFERENCE_VERSION 1).
BROADCAST_GOLDEN_COMMIT = "c58e235"

CASES = [
    ("causal", "b2-h8x8-s4096x4096-d64"),
    ("alibi", "b2-h8x8-s4096x4096-d64"),
    ("causal", "b4-h8x8-s8192x8192-d128"),
    ("alibi", "b4-h8x8-s8192x8192-d128"),
]

_WORKER = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, ROOT)
import torch
from cases import variants as v
from cases.inputs import make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
variant, shape, which, before_path = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
case = Case(getattr(v, variant)(), Shape.parse(shape), "bf16")
inputs = make_inputs(case, 0)
if which == "ours":  # imports before the clock and the memory baseline: a one-time cost
    from reference.golden import golden_attention
elif which == "before":
    import importlib.util
    spec = importlib.util.spec_from_file_location("golden_before", before_path)
    before = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = before  # its dataclasses look their module up there
    spec.loader.exec_module(before)
    golden_attention = before.golden_attention
else:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if which in ("ours", "before"):
    out = golden_attention(case, inputs).out
else:
    mods = build_mods(case.variant, case.shape)
    s = case.shape
    bm = create_block_mask(mods.mask_mod, None, None, s.Sq, s.Skv, "cpu")
    out = flex_attention(inputs.q.double(), inputs.k.double(), inputs.v.double(),
                         score_mod=mods.score_mod, block_mask=bm)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "extra_peak_mb": (peak - rss0) / 1024,
                  "checksum": float(out.double().sum())}))
"""


def measure(variant: str, shape: str, which: str, timeout: float, before_path: str = "") -> dict:
    code = _WORKER.replace("ROOT", repr(str(ROOT)))
    try:
        proc = subprocess.run([sys.executable, "-c", code, variant, shape, which, before_path],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {proc.returncode}: {last[:120]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def matmul_rate_gflops(shape: str) -> float:
    """This machine's float64 rate on the golden's own two products for ``shape``, one query
    chunk against all keys (q k^T, then p v), best of 5: the golden's ceiling."""
    import torch

    sys.path.insert(0, str(ROOT))
    from cases.model import Shape
    from reference.golden import _CHUNK_SCORE_ELEMENTS

    s = Shape.parse(shape)
    rows = max(1, min(s.Sq, _CHUNK_SCORE_ELEMENTS // (s.Hq * s.Skv)))
    q = torch.randn(s.Hkv, rows * (s.Hq // s.Hkv), s.D, dtype=torch.float64)
    k = torch.randn(s.Hkv, s.Skv, s.D, dtype=torch.float64)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        scores = torch.bmm(q, k.transpose(1, 2))
        torch.bmm(scores, k)
        best = min(best, time.perf_counter() - t0)
    return 4.0 * s.Hq * rows * s.Skv * s.D / best / 1e9


def unmasked_flops(variant: str, shape: str) -> float:
    sys.path.insert(0, str(ROOT))
    from cases.model import Shape

    s = Shape.parse(shape)
    pairs = s.Sq * s.Skv if variant == "full" else s.Sq * (s.Sq + 1) / 2  # causal and alibi
    return 4.0 * s.B * s.Hq * s.D * pairs  # q.k and p.v, 2 flops per multiply-add


def pytorch_golden_bytes(shape: str) -> float:
    """What eager flex_attention in float64 materializes: scores, probabilities and the
    score-mod output, each [B, H, Sq, Skv] float64."""
    sys.path.insert(0, str(ROOT))
    from cases.model import Shape

    s = Shape.parse(shape)
    return 3.0 * s.B * s.Hq * s.Sq * s.Skv * 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-largest", action="store_true", help="only the B2 S4096 cases")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of ours "
                        "and the one before; the fastest of each counts")
    parser.add_argument("--before", default=BROADCAST_GOLDEN_COMMIT,
                        help="the commit whose golden to compare with (default: the last "
                             "broadcast one)")
    args = parser.parse_args()
    before_source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.before}:reference/golden.py"],
        capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix="_golden_before.py", delete=False) as tmp:
        tmp.write(before_source)
    rows = []
    for variant, shape in CASES:
        if args.skip_largest and "s8192" in shape:
            continue
        ours_runs, before_runs = [], []
        for _ in range(args.repeats):
            ours_runs.append(measure(variant, shape, "ours", args.timeout))
            before_runs.append(measure(variant, shape, "before", args.timeout, tmp.name))
        ours, before = _fastest(ours_runs), _fastest(before_runs)
        need = pytorch_golden_bytes(shape)
        if need > 0.8 * _machine_bytes():
            theirs = {"error": f"not run: needs about {need / 2**30:.0f} GiB, the machine has "
                               f"{_machine_bytes() / 2**30:.0f} GiB"}
        else:
            theirs = measure(variant, shape, "pytorch", args.timeout)
        rate = matmul_rate_gflops(shape)
        row = {"case": f"{variant} {shape}", "ours": ours, "before": before, "pytorch": theirs,
               "matmul_gflops": rate}
        if "seconds" in ours and "seconds" in before:
            row["time_vs_before"] = ours["seconds"] / before["seconds"]
            row["same_output_as_before"] = abs(before["checksum"] - ours["checksum"]) < 1e-6
        if "seconds" in ours:
            row["golden_gflops"] = unmasked_flops(variant, shape) / ours["seconds"] / 1e9
            row["fraction_of_matmul_rate"] = row["golden_gflops"] / rate
        if "seconds" in ours and "seconds" in theirs:
            row["speedup"] = theirs["seconds"] / ours["seconds"]
            row["memory_ratio"] = theirs["extra_peak_mb"] / max(ours["extra_peak_mb"], 1)
            row["same_output"] = abs(theirs["checksum"] - ours["checksum"]) < 1e-6
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"rows": rows}))
    os.unlink(tmp.name)
    return 0


def _fastest(runs: list[dict]) -> dict:
    """The fastest run, with every run's seconds; the first error when none finished."""
    done = [run for run in runs if "seconds" in run]
    if not done:
        return runs[0]
    return dict(min(done, key=lambda run: run["seconds"]),
                all_seconds=[round(run["seconds"], 2) for run in done])


def _machine_bytes() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


if __name__ == "__main__":
    sys.exit(main())
