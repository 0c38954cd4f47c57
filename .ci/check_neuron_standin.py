"""Checks of .ci/run's Neuron stand-in runs: what issue 9 promises of a real Trainium run.

    python .ci/check_neuron_standin.py cold REPORT_DIR   # the core smoke matrix, cold
    python .ci/check_neuron_standin.py compile REPORT_DIR   # a --phase compile pass
    python .ci/check_neuron_standin.py warm REPORT_DIR   # the warm run after it
"""
from __future__ import annotations

import sys

from records.results import Label, load_results


def main(kind: str, report_dir: str) -> int:
    results = load_results(f"{report_dir}/results.json")
    records = results.records
    problems = []
    if not results.complete:
        problems.append("the run is incomplete")
    check = str(results.environment.get("device_check", ""))
    if not check.startswith("device check bypassed for"):
        problems.append(f"device check not bypassed and recorded: {check!r}")
    wanted = Label.COMPILED if kind == "compile" else Label.PASS
    problems += [f"{r.case_id}: {r.label.value} {r.message[:200]}" for r in records
                 if r.label is not wanted]
    problems += [f"{r.case_id}: no compile_breakdown" for r in records if not r.compile_breakdown]
    if kind == "cold":
        problems += [f"{r.case_id}: a cold compile " + ("hit a cache" if r.cache_hit else
                                                         "was not counted (cache_hit unknown)")
                     for r in records if r.cache_hit is not False]
    if kind == "warm":
        problems += [f"{r.case_id}: a warm compile after the compile pass missed the cache"
                     for r in records if r.cache_hit is not True]
    for line in problems:
        print(f"check_neuron_standin {kind}: {line}")
    print(f"check_neuron_standin {kind}: {len(records)} cases, {len(problems)} problems")
    return 1 if problems or not records else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
