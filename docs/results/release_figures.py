"""The figures docs/results/README.md quotes, from two results files (torch-free):
labels, the median compile time and the median of each compile stage, the median run time,
and how the per-case ratios spread.

    python docs/results/release_figures.py OLD.json NEW.json
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, installed or not
from records.results import load_results  # noqa: E402
from reports.compare import finished_compile_seconds, finished_run_seconds  # noqa: E402
from reports.summary import verdict_line  # noqa: E402


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def show(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(old_path: str, new_path: str) -> None:
    old, new = load_results(old_path), load_results(new_path)
    print(f"{'':24} {old.environment.get('torch', '?'):>14} {new.environment.get('torch', '?'):>14}")
    print(f"{'labels':24} {verdict_line(old):>14} {verdict_line(new):>14}")
    changed = [(r.case_id, old.by_id()[r.case_id].label.value, r.label.value)
               for r in new.records if r.case_id in old.by_id()
               and old.by_id()[r.case_id].label is not r.label]
    for cid, before, after in changed:
        print(f"  label change: {cid}: {before} -> {after}")
    rows = [("compile s (median)", finished_compile_seconds),
            ("run ms (median)", lambda r: (finished_run_seconds(r) or 0) * 1000 or None)]
    for name, get in rows:
        print(f"{name:24} {show(median(map(get, old.records))):>14} "
              f"{show(median(map(get, new.records))):>14}")
    stages = list(dict.fromkeys(s for run in (old, new) for r in run.records
                                for s in (r.compile_breakdown or {})))
    for stage in stages:
        print(f"  {stage:22} " + " ".join(
            f"{show(median((r.compile_breakdown or {}).get(stage) for r in run.records)):>14}"
            for run in (old, new)))
    for name, get in rows:
        ratios = []
        for r in new.records:
            before = old.by_id().get(r.case_id)
            a, b = (get(before) if before else None), get(r)
            if a and b:
                ratios.append(b / a)
        if ratios:
            q = statistics.quantiles(ratios, n=4)
            print(f"{name + ' new/old':24} median x{statistics.median(ratios):.2f}, quartiles "
                  f"x{q[0]:.2f}-x{q[2]:.2f}, range x{min(ratios):.2f}-x{max(ratios):.2f} "
                  f"over {len(ratios)} cases")


if __name__ == "__main__":
    main(*sys.argv[1:3])
