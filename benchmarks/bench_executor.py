"""The suite's execution overhead: the smoke matrix through pytest against a bare loop.

    python benchmarks/bench_executor.py [--profile smoke] [--workers 1,2] [--limit N] [--keep DIR]

In one run, one after the other on the same machine:
- bare: one process compiles and runs the same cases with cpu-inductor, no isolation, no
  reference, no records: for each case a fresh Inductor cache directory, torch._dynamo.reset()
  and Inductor's in-memory caches cleared (so every compile is as cold as the suite's), the
  inputs, the block mask, the first call (compile) and 3 timed calls. Process start-up and the
  one-time compiler warm-up are inside its wall time.
- suite: ``pytest -n WORKERS conformance/ --backend cpu-inductor --profile PROFILE`` with a
  fresh report directory and an empty reference cache (golden computed, verdicts decided).

It prints both wall times, their ratio (target: suite <= 1.3 x bare) and where the suite's
time goes, from its results.json. ``--json FILE`` keeps the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BARE = r"""
import json, os, shutil, statistics, sys, tempfile, time
t_start = time.perf_counter()
sys.path.insert(0, ROOT)
import torch, torch._inductor.utils
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from cases.catalog import matrix
from cases.inputs import make_inputs
from cases.variants import build_mods
cases = matrix(PROFILE)[:LIMIT]
per_case = []
for case in cases:
    cache = tempfile.mkdtemp(prefix="bench-bare-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch._dynamo.reset(); torch._inductor.utils.clear_caches()
    t0 = time.perf_counter()
    inputs = make_inputs(case, 0)
    mods = build_mods(case.variant, case.shape, "cpu")
    s = case.shape
    mask = (create_block_mask(mods.mask_mod, None, None, s.Sq, s.Skv, device="cpu")
            if mods.mask_mod else None)
    fn = torch.compile(flex_attention, fullgraph=True, dynamic=False)
    t1 = time.perf_counter()
    out = fn(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod, block_mask=mask)
    t2 = time.perf_counter()
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        out = fn(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod, block_mask=mask)
        runs.append(time.perf_counter() - t)
    per_case.append({"id": case.id, "setup": t1 - t0, "compile": t2 - t1,
                     "run": statistics.median(runs)})
    shutil.rmtree(cache, ignore_errors=True)
print(json.dumps({"in_process_seconds": time.perf_counter() - t_start, "cases": per_case}))
"""


def run_bare(profile: str, limit: int) -> dict:
    script = (_BARE.replace("ROOT", repr(str(ROOT))).replace("PROFILE", repr(profile))
              .replace("LIMIT", str(limit)))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"bare loop failed:\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["wall_seconds"] = wall
    return data


def run_suite(profile: str, workers: int, limit: int, workdir: Path) -> dict:
    from cases.catalog import matrix

    args = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
            "--backend", "cpu-inductor", "--report-dir", str(workdir / "report"),
            "--reference-cache", str(workdir / "reference-cache")]
    if workers > 1:
        args += ["-n", str(workers)]
    if limit < 96:
        spec = workdir / "cases.json"
        spec.write_text(json.dumps([c.to_json() for c in matrix(profile)[:limit]]))
        args += ["--case-file", str(spec)]
    else:
        args += ["--profile", profile]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    results = json.loads((workdir / "report" / "results.json").read_text())
    return {"wall_seconds": wall, "exit": proc.returncode, "tail": proc.stdout[-1500:],
            "results": results}


def _t(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def breakdown(suite: dict) -> dict:
    """Where the suite's time went, per worker, from the records' timestamps and phases.

    A case's overhead is its wall time (started -> finished) minus its setup, compile and run
    phases: reference, verdict, records, output transfer; for a worker's first case also the
    child's start-up and warm-up compile.
    """
    records = suite["results"]["records"]
    start = _t(suite["results"]["started_at"])
    workers: dict[str, dict] = {}
    for r in sorted(records, key=lambda r: r["started_at"]):
        wall = _t(r["finished_at"]) - _t(r["started_at"])
        phases = sum(r.get(f"{p}_seconds") or 0.0 for p in ("setup", "compile", "run"))
        w = workers.setdefault(r["worker"], {
            "cases": 0, "compile": 0.0, "phases": 0.0, "first_case_overhead": wall - phases,
            "later_overhead": 0.0, "first_started": _t(r["started_at"]) - start, "last_finished": 0.0})
        if w["cases"]:
            w["later_overhead"] += wall - phases
        w["cases"] += 1
        w["compile"] += r.get("compile_seconds") or 0.0
        w["phases"] += phases
        w["last_finished"] = max(w["last_finished"], _t(r["finished_at"]) - start)
    labels: dict[str, int] = {}
    for r in records:
        labels[r["label"]] = labels.get(r["label"], 0) + 1
    return {"workers": workers, "labels": labels,
            "session_tail": suite["wall_seconds"] - max(w["last_finished"] for w in workers.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--workers", default="2", help="pytest-xdist workers; a list (1,2) "
                        "runs the suite once per count")
    parser.add_argument("--limit", type=int, default=96, help="first N cases only (quick check)")
    parser.add_argument("--keep", help="copy each suite run's report directory here")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    counts = [int(n) for n in args.workers.split(",")]
    bare = run_bare(args.profile, args.limit)
    bare_compile = sum(c["compile"] for c in bare["cases"])
    print(f"cases: {len(bare['cases'])} ({args.profile}), cores: {os.cpu_count()}")
    print(f"bare loop: wall {bare['wall_seconds']:.1f} s = compile {bare_compile:.1f} s + "
          f"runs ~{4 * sum(c['run'] for c in bare['cases']):.1f} s + setup "
          f"{sum(c['setup'] for c in bare['cases']):.1f} s + start-up and warm-up; median "
          f"compile {statistics.median(c['compile'] for c in bare['cases']):.2f} s")
    figures = {"bare": bare, "suites": {}}
    for workers in counts:
        with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
            suite = run_suite(args.profile, workers, args.limit, Path(tmp))
            if args.keep:
                shutil.copytree(Path(tmp) / "report", Path(args.keep) / f"n{workers}",
                                dirs_exist_ok=True)
        parts = breakdown(suite)
        records = suite["results"]["records"]
        print(f"suite -n {workers}: wall {suite['wall_seconds']:.1f} s, exit {suite['exit']}, "
              f"labels {parts['labels']}, ratio to bare "
              f"{suite['wall_seconds'] / bare['wall_seconds']:.2f} (target <= 1.3); median "
              f"compile {statistics.median(r['compile_seconds'] or 0 for r in records):.2f} s")
        for name, w in sorted(parts["workers"].items()):
            print(f"  {name}: {w['cases']} cases from {w['first_started']:.1f} s to "
                  f"{w['last_finished']:.1f} s: phases {w['phases']:.1f} s (compile "
                  f"{w['compile']:.1f}), first case overhead (child start, warm-up) "
                  f"{w['first_case_overhead']:.1f} s, other cases' overhead "
                  f"{w['later_overhead']:.1f} s ({w['later_overhead'] / max(1, w['cases'] - 1):.2f} s each)")
        print(f"  session start-up before the first case + merge and report after the last: "
              f"{parts['session_tail'] + min(w['first_started'] for w in parts['workers'].values()):.1f} s")
        figures["suites"][workers] = {"wall_seconds": suite["wall_seconds"], "exit": suite["exit"],
                                      "breakdown": parts}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
