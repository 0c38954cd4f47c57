"""A cpu-inductor child's start with its warm-up builds kept between runs, against a warm-up
that builds everything, side by side in one run; and whether the cases' cold compiles notice.

    python benchmarks/bench_warm_up.py [--repeats 3]

Each repeat starts two executors (conformance.executor, as a worker does), taking turns:
"fresh", whose child finds its warm-up directory empty (XDG_CACHE_HOME a new directory: the
first child on a machine, and every child before 2026-12-06), and "kept", whose child finds
the builds a first child left there. Each executor runs the same three cases, cold (the
default), one after another in its one child. Reported: the child's start (the process, its
imports and the warm-up: the wall time from its start to its ready event, as the
supervisor waits for it), and each case's compile seconds and stages. A
one-time cost that the kept warm-up no longer pays would show up in the first case's compile:
its compile seconds minus the mean of the other two, per child, is printed for both.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cases.model import Case, Shape, Variant  # noqa: E402
from conformance.backends.base import WorkerSlot  # noqa: E402
from conformance.backends.registry import load_backend  # noqa: E402
from conformance.executor import Executor, Settings  # noqa: E402
from conformance.reference_cache import ReferenceCache  # noqa: E402

SHAPE = Shape(1, 2, 2, 128, 128, 16)
CASES = [Case(Variant("causal"), SHAPE), Case(Variant("alibi"), SHAPE),
         Case(Variant("sliding_window", (("w", 32),)), SHAPE)]


def start_seconds(executor: Executor) -> float:
    """Start the executor's child now and return the seconds until it said it was ready."""
    started = time.perf_counter()
    problem = executor.supervisor._start()  # noqa: SLF001 - the start alone, timed
    assert problem is None, problem
    return time.perf_counter() - started


def one_child(cache_home: str) -> dict:
    os.environ["XDG_CACHE_HOME"] = cache_home  # the child reads its warm-up directory here
    executor = Executor(load_backend("cpu-inductor"), "cpu-inductor", WorkerSlot(0, 1),
                        Settings(), ReferenceCache(None, 0), worker="bench")
    try:
        start = start_seconds(executor)
        records = [executor.execute(case) for case in CASES]
    finally:
        executor.close()
    assert all(r.label.value == "PASS" and r.cache_hit is False for r in records), \
        [(r.label, r.cache_hit, r.message) for r in records]
    return {"start_seconds": start,
            "compile_seconds": [r.compile_seconds for r in records],
            "stages": [r.compile_breakdown for r in records]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    homes = [tempfile.mkdtemp(prefix="bench-warm-up-kept-")]
    kept_home = homes[0]
    runs: dict[str, list[dict]] = {"fresh": [], "kept": []}
    try:
        one_child(kept_home)  # the first child on this "machine" leaves its builds
        for _ in range(args.repeats):
            homes.append(tempfile.mkdtemp(prefix="bench-warm-up-fresh-"))
            runs["fresh"].append(one_child(homes[-1]))
            runs["kept"].append(one_child(kept_home))
    finally:  # the "machines" are this run's alone
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
    summary = {}
    for mode, measured in runs.items():
        summary[mode] = {
            "start_seconds": [round(m["start_seconds"], 2) for m in measured],
            "median_start_seconds": round(statistics.median(m["start_seconds"]
                                                            for m in measured), 2),
            "compile_seconds_by_case": [[round(m["compile_seconds"][i], 2) for m in measured]
                                        for i in range(len(CASES))],
            # within one child, so the machine's drift between children cancels
            "first_case_minus_mean_of_the_others": [
                round(m["compile_seconds"][0] - statistics.mean(m["compile_seconds"][1:]), 2)
                for m in measured],
            "first_case_stages": [{k: round(v, 2) for k, v in m["stages"][0].items()}
                                  for m in measured],
        }
    print(json.dumps({"cases": [c.id for c in CASES], **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
