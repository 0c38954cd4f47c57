"""Report rendering speed and size at scale: 10,000 synthetic records (about 8% failing, every
label) must render in under 3 s into an index.html under 5 MB (docs/performance.md).

    python benchmarks/bench_report.py [--records 10000] [--repeat 3] [--keep DIR]

Prints one line per measurement and exits 1 when a budget is exceeded.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reports.render import write_report  # noqa: E402
from records.results import load_results, write_results  # noqa: E402
from reports.synthetic import synthetic_run  # noqa: E402

SECONDS_BUDGET = 3.0
BYTES_BUDGET = 5_000_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="leave the report in DIR")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp) / "report"
        results_path = Path(tmp) / "results.json"
        write_results(synthetic_run(args.records), results_path)
        baseline = synthetic_run(args.records, seed=1)
        load_times, render_times, baseline_times = [], [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            results = load_results(results_path)  # includes schema validation
            load_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            write_report(results, out)
            render_times.append(time.perf_counter() - start)
            size = (out / "index.html").stat().st_size
            start = time.perf_counter()
            write_report(results, Path(tmp) / "with-baseline", baseline=baseline)
            baseline_times.append(time.perf_counter() - start)
            size_baseline = (Path(tmp) / "with-baseline" / "index.html").stat().st_size
        render = statistics.median(render_times)
        print(f"records            {args.records}")
        print(f"load+validate      {statistics.median(load_times):.2f} s (median of {args.repeat})")
        print(f"render             {render:.2f} s (median of {args.repeat}; budget {SECONDS_BUDGET} s)")
        print(f"render w/ baseline {statistics.median(baseline_times):.2f} s")
        print(f"index.html         {size / 1e6:.2f} MB (budget {BYTES_BUDGET / 1e6:.0f} MB)")
        print(f"  with baseline    {size_baseline / 1e6:.2f} MB")
        print(f"summary.md         {(out / 'summary.md').stat().st_size / 1e3:.1f} kB")
    over = render > SECONDS_BUDGET or size > BYTES_BUDGET
    if over:
        print("OVER BUDGET", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
