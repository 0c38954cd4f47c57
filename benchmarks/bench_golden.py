"""Speed and memory of the float64 golden against PyTorch's own golden (eager flex_attention on
float64 inputs, as PyTorch's test_flex_attention checks against) on causal and ALiBi at B2 H8
S4096 D64, ours alone on the largest core case (B4 H8 S8192 D128), and this machine's float64
matmul rate, all in one run; optionally a golden of another commit (``--before REV``) too.

    python benchmarks/bench_golden.py [--repeats 2] [--skip-largest] [--before REV]

Each measurement runs in a fresh subprocess so that peak memory is its own, holding torch as a
run's pytest processes hold it, where every golden of a run is computed (its import with the
collector paused, then frozen: conformance/process_gc.py; otherwise the first full collection
after the import, 63-97 ms walking torch's objects, fell inside whichever first call came
first), and runs its golden twice: the first call ("cold": its heap grows, page by page) and
the same call again ("warm": what each golden after the first costs a process that computes one
after another, as the suite's workers, and PyTorch's test suite, do); both are reported, with
the first call's minor page faults. A third side, "prefaulted", runs our golden in a process
whose heap was grown and touched before the clock (288 MB, kept by reference/heap.py): its
first call is what a first call costs without the heap's page faults. "Extra
peak" is the peak resident size over the first call (VmHWM, reset through /proc/self/clear_refs
once the inputs are made and the imports done, before the clock) minus the resident size at
that point. The goldens of one case run alternately ``--repeats`` times and the fastest run of
each counts (of first calls and of second calls alike), so a change of load on a shared machine
does not land on one side only; for memory the ratio takes our largest extra peak and PyTorch's
smallest. The matmul rate is the rate of the golden's own two products (one full-width query
chunk against all keys, q k^T then p v as the golden runs it, V with a column of ones and zero
columns, counted on the flops executed, best of 5, each product writing into memory made once
and just used), measured before each turn of a case's runs and after the last (the fastest
counts; docs/performance.md says how much lower the rate came out, and how much higher the
shares, before 2026-12-02 14:29, with fresh memory each time); the share of it is counted on
the unmasked work, 4 D flops per visible query-key pair. The share of a large square matmul's
rate is shown beside it, a ceiling that does not move with the golden's chunk shapes. Two
floors of ours run in the same turns (benchmarks/golden_floor.py): "floor", the golden's two
products and its score mod on the golden's own chunks and nothing of the softmax, and
"products", the products alone (without a score mod the two are the same, and only "products"
runs); the share of the matmul rate at the floor's time is about the most any softmax could
reach with the mod evaluated as flex_attention defines it. On causal, "fused" runs torch's own
fused float64 CPU kernel in the same turns (``scaled_dot_product_attention`` with
``is_causal``: FlashAttention for the CPU, one pass, blocks above the diagonal skipped, no
mods at all), the fastest float64 attention that torch ships for this case: ours against it
says how far a golden built of eager operations is from a fused kernel. It has no score mods,
so ALiBi has no such side (an additive bias of 1 GiB would be another computation).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    ("causal", "b2-h8x8-s4096x4096-d64"),
    ("alibi", "b2-h8x8-s4096x4096-d64"),
    ("causal", "b4-h8x8-s8192x8192-d128"),
    ("alibi", "b4-h8x8-s8192x8192-d128"),
]

_WORKER = r"""
import json, re, resource, sys, time, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, ROOT)
from conformance.process_gc import imported_for_good  # from this tree, before --before's
with imported_for_good():  # torch held as a run's pytest processes hold it (see the module)
    import torch
if sys.argv[3] == "before":  # the commit's whole tree ahead of this one: its cases/ too
    sys.path.insert(0, sys.argv[4])
from cases import variants as v
from cases.inputs import make_inputs
from cases.model import Case, Shape
from cases.variants import build_mods
variant, shape, which = sys.argv[1], sys.argv[2], sys.argv[3]
case = Case(getattr(v, variant)(), Shape.parse(shape), "bf16")
inputs = make_inputs(case, 0)
if which in ("ours", "prefaulted"):  # imports before the clock and the memory baseline
    from reference.golden import golden_attention
if which == "prefaulted":  # its heap grown and every page touched before the clock: 288 MB in
    from reference.heap import keep_freed_heap  # blocks below glibc's mmap threshold, kept
    keep_freed_heap()
    grown = [torch.ones(3 << 20, dtype=torch.float64) for _ in range(12)]
    del grown
elif which == "fused":
    from torch.nn.functional import scaled_dot_product_attention
elif which in ("floor", "products"):
    sys.path.insert(0, ROOT + "/benchmarks")
    from golden_floor import products_and_score_mod
elif which == "before":  # from the commit's tree (see above)
    from reference.golden import golden_attention
else:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
def kib(field):
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1))
with open("/proc/self/clear_refs", "w") as clear:  # the peak (VmHWM) restarts from here:
    clear.write("5")  # what making the inputs peaked at is not ours
rss0 = kib("VmRSS")
def golden():
    if which in ("ours", "before", "prefaulted"):
        return golden_attention(case, inputs).out
    if which in ("floor", "products"):
        return torch.tensor(products_and_score_mod(case, inputs, which == "floor"))
    if which == "fused":  # causal only (see the module)
        return scaled_dot_product_attention(inputs.q.double(), inputs.k.double(),
                                            inputs.v.double(), is_causal=True)
    mods = build_mods(case.variant, case.shape)
    s = case.shape
    bm = create_block_mask(mods.mask_mod, None, None, s.Sq, s.Skv, "cpu")
    return flex_attention(inputs.q.double(), inputs.k.double(), inputs.v.double(),
                          score_mod=mods.score_mod, block_mask=bm)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t0 = time.perf_counter()
out = golden()
seconds = time.perf_counter() - t0
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
peak = kib("VmHWM")  # the first call's: it grows the heap, the second reuses it
t0 = time.perf_counter()
golden()  # the same golden again in the same process: as a suite computes one after another
warm = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "warm_seconds": warm, "first_call_page_faults": faults,
                  "extra_peak_mb": (peak - rss0) / 1024, "checksum": float(out.double().sum())}))
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
    """This machine's float64 rate on the golden's own two products for ``shape``, one
    full-width query chunk against all keys, as the golden runs them (q k^T, then p times V
    with its column of ones and zero columns), counted on the flops they execute, best of 5:
    the golden's ceiling. Both products write into memory made once and just used (the
    scores are 24 MiB at S4096: with memory fresh from the allocator each time, each product
    paid for its pages too, and the rate came out at 46-100 GFLOP/s on the Xeon VM where these
    products run at 111-122)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from cases.model import Shape
    from reference.chunk_plan import CHUNK_SCORE_ELEMENTS
    from reference.chunks import _with_ones_column

    s = Shape.parse(shape)
    rows = max(1, min(s.Sq, CHUNK_SCORE_ELEMENTS // (s.Hq * s.Skv)))
    q = torch.randn(s.Hkv, rows * (s.Hq // s.Hkv), s.D, dtype=torch.float64)
    k = torch.randn(s.Hkv, s.Skv, s.D, dtype=torch.float64)
    v_ones = _with_ones_column(torch.randn(s.Hkv, s.Skv, s.D), torch.float64)
    scores = torch.bmm(q, k.transpose(1, 2))
    out = torch.bmm(scores, v_ones)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.bmm(q, k.transpose(1, 2), out=scores)
        torch.bmm(scores, v_ones, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * s.Hq * rows * s.Skv * (s.D + v_ones.shape[-1]) / best / 1e9


def square_matmul_gflops(n: int = 2048) -> float:
    """This machine's float64 rate on one large square matmul, best of 3: a ceiling that does
    not depend on how the golden cuts its chunks."""
    import torch

    a, b = torch.randn(n, n, dtype=torch.float64), torch.randn(n, n, dtype=torch.float64)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def unmasked_flops(variant: str, shape: str) -> float:
    sys.path.insert(0, str(ROOT))
    from cases.model import Shape

    s = Shape.parse(shape)
    pairs = s.Sq * s.Skv if variant == "full" else s.Sq * (s.Sq + 1) / 2  # causal and alibi
    return 4.0 * s.B * s.Hq * s.D * pairs  # q.k and p.v, 2 flops per multiply-add


def _has_score_mod(variant: str, shape: str) -> bool:
    sys.path.insert(0, str(ROOT))
    from cases import variants
    from cases.model import Shape

    return variants.build_mods(getattr(variants, variant)(), Shape.parse(shape)).score_mod \
        is not None


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
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each "
                        "golden; the fastest of each counts")
    parser.add_argument("--before", default="", help="also run the golden of this commit")
    args = parser.parse_args()
    before_path = _golden_of(args.before) if args.before else ""
    try:
        return _measure_all(args, before_path)
    finally:
        if before_path:
            shutil.rmtree(before_path, ignore_errors=True)


def _measure_all(args, before_path: str) -> int:
    rows = []
    for variant, shape in CASES:
        if args.skip_largest and "s8192" in shape:
            continue
        need = pytorch_golden_bytes(shape)
        floors = ["floor", "products"] if _has_score_mod(variant, shape) else ["products"]
        sides = ["ours", "prefaulted", *floors] + (["before"] if before_path else []) \
            + (["fused"] if variant == "causal" else [])
        if need > 0.8 * _machine_bytes():
            theirs_error = (f"not run: needs about {need / 2**30:.0f} GiB, the machine has "
                            f"{_machine_bytes() / 2**30:.0f} GiB")
        else:
            theirs_error = ""
            sides.append("pytorch")
        rate, square = 0.0, 0.0
        runs = {side: [] for side in sides}
        for _ in range(args.repeats):  # the rates in every turn too: the host's speed drifts
            rate = max(rate, matmul_rate_gflops(shape))
            square = max(square, square_matmul_gflops())
            for side in sides:
                runs[side].append(measure(variant, shape, side, args.timeout, before_path))
        rate = max(rate, matmul_rate_gflops(shape))
        square = max(square, square_matmul_gflops())
        ours = _fastest(runs["ours"])
        theirs = _fastest(runs["pytorch"]) if "pytorch" in runs else {"error": theirs_error}
        row = {"case": f"{variant} {shape}", "ours": ours, "pytorch": theirs,
               "matmul_gflops": rate, "square_matmul_gflops": square}
        flops = unmasked_flops(variant, shape)
        if "seconds" in ours:
            row["golden_gflops"] = flops / ours["seconds"] / 1e9
            row["fraction_of_matmul_rate"] = row["golden_gflops"] / rate
            row["fraction_of_square_matmul_rate"] = row["golden_gflops"] / square
            row["warm_golden_gflops"] = flops / ours["fastest_warm_seconds"] / 1e9
            row["warm_fraction_of_matmul_rate"] = row["warm_golden_gflops"] / rate
            row["warm_fraction_of_square_matmul_rate"] = row["warm_golden_gflops"] / square
        prefaulted = row["prefaulted"] = _fastest(runs["prefaulted"])
        if "seconds" in prefaulted:  # the first call without the heap's page faults
            row["prefaulted_fraction_of_matmul_rate"] = flops / prefaulted["seconds"] / 1e9 / rate
        for floor_side in ("floor", "products"):  # the ceilings (benchmarks/golden_floor.py)
            floor = row[floor_side] = _fastest(runs[floor_side if floor_side in runs
                                                     else "products"])
            if "seconds" in floor:
                row[f"{floor_side}_ceiling_fraction_of_matmul_rate"] = \
                    flops / floor["seconds"] / 1e9 / rate
                row[f"{floor_side}_warm_ceiling_fraction_of_matmul_rate"] = \
                    flops / floor["fastest_warm_seconds"] / 1e9 / rate
        if "seconds" in ours and "seconds" in theirs:
            row["speedup"] = theirs["seconds"] / ours["seconds"]
            row["warm_speedup"] = theirs["fastest_warm_seconds"] / ours["fastest_warm_seconds"]
            row["memory_ratio"] = theirs["least_extra_peak_mb"] / max(
                ours["most_extra_peak_mb"], 1)
            row["same_output"] = abs(theirs["checksum"] - ours["checksum"]) < 1e-6
        if "fused" in runs:  # torch's fused float64 kernel (see the module)
            fused = row["fused"] = _fastest(runs["fused"])
            if "seconds" in ours and "seconds" in fused:
                row["time_vs_fused"] = ours["seconds"] / fused["seconds"]
                row["warm_time_vs_fused"] = (ours["fastest_warm_seconds"]
                                             / fused["fastest_warm_seconds"])
                row["same_output_as_fused"] = abs(fused["checksum"] - ours["checksum"]) < 1e-6
        if before_path:
            before = row["before"] = _fastest(runs["before"])
            if "seconds" in ours and "seconds" in before:
                row["time_vs_before"] = ours["seconds"] / before["seconds"]
                row["same_output_as_before"] = abs(before["checksum"] - ours["checksum"]) < 1e-6
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps({"rows": rows}))
    return 0


def _golden_of(rev: str) -> str:
    """The tree of commit ``rev``, extracted into a temporary directory: its path (the
    "before" worker imports every project module from there, ``cases/`` and ``records/`` as
    well as ``reference/``, so the commit's golden runs on its own mods and inputs). Until
    2026-12-05 only ``reference/`` was the commit's and ``cases/`` came from this tree; before
    2026-12-03 only the commit's golden.py was: the dated ``--before`` runs in
    docs/performance.md were made that way."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--before {rev}: git archive failed: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    directory = tempfile.mkdtemp(suffix="_golden_before")
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    return directory


def _fastest(runs: list[dict]) -> dict:
    """The fastest run, with every run's seconds and the least and most extra peak; the first
    error when none finished."""
    done = [run for run in runs if "seconds" in run]
    if not done:
        return runs[0]
    peaks = [run["extra_peak_mb"] for run in done]
    return dict(min(done, key=lambda run: run["seconds"]),
                all_seconds=[round(run["seconds"], 2) for run in done],
                fastest_warm_seconds=min(run["warm_seconds"] for run in done),
                all_warm_seconds=[round(run["warm_seconds"], 2) for run in done],
                least_extra_peak_mb=min(peaks), most_extra_peak_mb=max(peaks))


def _machine_bytes() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


if __name__ == "__main__":
    sys.exit(main())
