"""Compile anatomy and performance conformance of one run, as the Markdown tables of
docs/performance.md.

    pytest -n 2 conformance/ --backend cpu-inductor --profile smoke --report-dir /tmp/smoke
    python benchmarks/summarise_run.py /tmp/smoke/results.json

Compile anatomy: per stage, its median seconds over the cases and its share of all compile
seconds, whether torch's timed stages ever overran a case's compile phase (``other`` is the
phase's remainder, so stages and ``other`` sum to the phase by construction, and only an
overrun, up to the child's 2% tolerance, can show), and how much of the phase ``other``
holds. Performance: per
variant, the median throughput and sparsity efficiency (reports/performance.py) and the DENSE
notes.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from records.results import load_results  # noqa: E402
from reports.performance import DENSE_THRESHOLD, case_performance, variant_performance  # noqa: E402


def anatomy_table(records) -> list[str]:
    staged = [r for r in records if r.compile_breakdown and r.compile_seconds]
    if not staged:
        return ["(no case reports compile stages)"]
    stages: dict[str, list[float]] = {}
    for record in staged:
        for name, seconds in record.compile_breakdown.items():
            stages.setdefault(name, []).append(seconds)
    whole = sum(sum(v) for v in stages.values())
    lines = [f"{len(staged)} cases with stages; median compile phase "
             f"{statistics.median(r.compile_seconds for r in staged):.2f} s", "",
             "| stage | median s | share of all compile seconds |", "|---|---|---|"]
    for name, values in sorted(stages.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {name} | {statistics.median(values):.3f} | {100 * sum(values) / whole:.1f}% |")
    # other = max(0, phase - stages) (conformance/child.py): the sum is the phase unless the
    # timed stages overran it, which is all this can find (an outside audit: it printed
    # "within 0.00%", true by construction, as if measured)
    overruns = [sum(r.compile_breakdown.values()) / r.compile_seconds - 1 for r in staged]
    overruns = [o for o in overruns if o > 1e-9]
    others = [r.compile_breakdown.get("other", 0.0) / r.compile_seconds for r in staged]
    overrun = (f"on {len(overruns)} cases, by at most {100 * max(overruns):.2f}%" if overruns
               else "on no case")
    lines += ["", f"torch's timed stages overran the compile phase {overrun}; `other` (the "
              f"phase outside them) is a median {100 * statistics.median(others):.1f}% of the "
              f"phase (max {100 * max(others):.1f}%)"]
    return lines


def performance_table(records) -> list[str]:
    rows = case_performance(records)
    if not rows:
        return ["(no case has performance figures)"]
    lines = ["| variant | cases | median GFLOP/s | median efficiency | worst | DENSE |",
             "|---|---|---|---|---|---|"]
    for v in variant_performance(rows):
        eff = "-" if v.median_efficiency is None else f"{v.median_efficiency:.2f}"
        worst = "-" if v.worst_efficiency is None else f"{v.worst_efficiency:.2f}"
        lines.append(f"| {v.variant} | {v.cases} | {v.median_gflops_per_second:.3g} | {eff} | "
                     f"{worst} | {v.dense_cases} |")
    dense = [r for r in rows if r.dense]
    lines += ["", f"DENSE (more than {DENSE_THRESHOLD:g}x the cost of skipping the empty tiles): "
              f"{len(dense)} of {len(rows)} cases"
              + (": " + ", ".join(f"`{r.case_id}` {r.tile_efficiency:.2f}x" for r in dense[:8])
                 if dense else "")]
    return lines


def main() -> None:
    results = load_results(sys.argv[1])
    print("\n".join(["### Compile anatomy", ""] + anatomy_table(results.records)
                    + ["", "### Performance conformance", ""] + performance_table(results.records)))


if __name__ == "__main__":
    main()
