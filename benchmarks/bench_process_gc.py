"""What pausing and freezing Python's garbage collector saves a run's processes
(conformance/process_gc.py), side by side in one run, taking turns:

- start and exit: a process that imports torch, torch._dynamo and flex_attention and exits,
  with the collector on throughout, and as a run's processes do it (paused for the imports,
  then frozen);
- a run: ``pytest conformance/`` of two tiny cpu-eager cases (a pytest process and its
  backend child), from this tree and from the tree of ``--before REV``;
- cold compiles: three tiny cases through one cpu-inductor executor (one child) from each
  tree, their compile seconds (the pause and the freeze must not change them).

CPU seconds are of the whole process tree (user + system, from the children's rusage).

    python benchmarks/bench_process_gc.py --before REV [--turns 8] [--compile-turns 3]
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_IMPORTS = "import torch, torch._dynamo, torch.nn.attention.flex_attention"
_START_AND_EXIT = {
    "collector on": _IMPORTS,
    "paused, then frozen": f"import gc; gc.disable(); {_IMPORTS}; gc.enable(); gc.collect(0); "
                           "gc.freeze()",
}
_COMPILES = r"""
import json, sys
from cases.model import Case, Shape, Variant
from tests.test_backends_cpu import execute
tiny = Shape(1, 2, 2, 64, 64, 16)
cases = [Case(Variant(name), tiny) for name in ("causal", "alibi", "full")]
print(json.dumps([r.compile_seconds for r in execute("cpu-inductor", cases)]))
"""


def measured(args: list[str], cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """CPU seconds of the process tree, wall seconds, and the finished process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, wall, proc


def tiny_run(tree: Path, scratch: Path) -> tuple[float, float]:
    from cases.model import Case, Shape, Variant

    tiny = Shape(1, 2, 2, 64, 64, 16)
    case_file = scratch / "cases.json"
    case_file.write_text(json.dumps([Case(Variant(name), tiny).to_json()
                                     for name in ("full", "causal")]))
    cpu, wall, proc = measured(
        [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
         "--backend", "cpu-eager", "--case-file", str(case_file), "--report-dir",
         str(scratch / "report"), "--reference-cache", "none"], tree)
    if proc.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return cpu, wall


def compile_seconds(tree: Path) -> list[float]:
    _, _, proc = measured([sys.executable, "-c", _COMPILES], tree)
    if proc.returncode != 0:
        raise SystemExit(f"the compiles in {tree} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tree_of(rev: str) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--before {rev}: git archive failed: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    directory = Path(tempfile.mkdtemp(suffix="_process_gc_before"))
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--compile-turns", type=int, default=3)
    args = parser.parse_args()
    before = tree_of(args.before)
    scratch = Path(tempfile.mkdtemp(suffix="_process_gc"))
    trees = {"this tree": ROOT, f"{args.before}": before}
    try:
        starts = {name: [] for name in _START_AND_EXIT}
        runs = {name: [] for name in trees}
        for _ in range(args.turns):
            for name, code in _START_AND_EXIT.items():
                starts[name].append(measured([sys.executable, "-c", code], ROOT)[0])
            for name, tree in trees.items():
                runs[name].append(tiny_run(tree, scratch))
        compiles = {name: [] for name in trees}
        for _ in range(args.compile_turns):
            for name, tree in trees.items():
                compiles[name].append(compile_seconds(tree))
    finally:
        shutil.rmtree(before, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"start and exit (import torch, torch._dynamo, flex_attention), CPU-s, median of "
          f"{args.turns}:")
    for name, values in starts.items():
        print(f"  {name:22s} {statistics.median(values):.2f} "
              f"({min(values):.2f}-{max(values):.2f})")
    print(f"a run of two tiny cpu-eager cases, median of {args.turns}:")
    for name, values in runs.items():
        cpu, wall = zip(*values)
        print(f"  {name:22s} CPU {statistics.median(cpu):.2f} s ({min(cpu):.2f}-{max(cpu):.2f}),"
              f" wall {statistics.median(wall):.2f} s")
    print(f"cold cpu-inductor compile seconds of causal, alibi, full in one child, median of "
          f"{args.compile_turns}:")
    for name, values in compiles.items():
        medians = [statistics.median(column) for column in zip(*values)]
        print(f"  {name:22s} " + ", ".join(f"{m:.2f}" for m in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
