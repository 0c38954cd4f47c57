"""Longest first against collection order: makespan over its lower bound, in one run.

    python benchmarks/bench_schedule.py                 # simulation, then the real smoke runs
    python benchmarks/bench_schedule.py --simulate-only

Lower bound of a makespan: ``max(longest case, total case time / workers)``.

**Simulation**: the recorded per-case seconds of a run (default docs/results/
cpu-inductor-smoke-core.json: setup + compile + the timed runs), the 7 cases of the largest
estimate set to the 600 s compile budget (the public Trainium run's shape: 7 of 96 cases hit
it), on 8 workers. The schedulers are xdist's own ``LoadScheduling`` (collection order) and
the suite's ``LongestFirstScheduling``, driven by the same event loop with fake workers that
behave as xdist's do: a worker runs a case only once it holds the next one (or is told to shut
down), and reports each finished case to the scheduler.

**Real**: the core smoke matrix on cpu-inductor with ``pytest -n 2``, first with
``--schedule-from off`` (collection order), then longest first from that run's measured
seconds; each makespan from the records' start and finish times.
"""
from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from conformance.plugin import _case_id  # noqa: E402
from conformance.schedule import CostModel, make_scheduler, measured_seconds  # noqa: E402
from records.results import load_results  # noqa: E402

BUDGET = 600.0
SLOW_CASES = 7


class _Config:
    def __init__(self, workers: int):
        self.workers = workers

    def getvalue(self, name):
        return [f"{self.workers}*popen"] if name == "tx" else None

    def getoption(self, name, default=None):
        return {"maxschedchunk": None, "dist": "load"}.get(name, default)


class _QuietLog:
    def __getattr__(self, _name):
        return self

    def __call__(self, *args):
        pass


class _Node:
    """A worker as xdist's scheduler sees it."""

    def __init__(self, index: int):
        self.gateway = type("Gateway", (), {"id": f"gw{index}"})()
        self.queue: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        self.queue.extend(indices)

    def send_runtest_all(self):
        raise NotImplementedError

    def shutdown(self):
        self.shutting_down = True

    def __repr__(self):
        return self.gateway.id


def simulate(scheduler, nodeids: list[str], seconds: list[float], workers: int) -> float:
    """The makespan of ``scheduler`` on ``workers`` fake xdist workers."""
    nodes = [_Node(i) for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, nodeids)
    scheduler.schedule()
    clock, running, events = 0.0, {}, []

    def start_what_can_start():
        for node in nodes:
            if node in running or not node.queue:
                continue
            if len(node.queue) >= 2 or node.shutting_down:  # xdist's worker loop
                index = node.queue.pop(0)
                running[node] = index
                heapq.heappush(events, (clock + seconds[index], node.gateway.id, node, index))

    start_what_can_start()
    while events:
        clock, _, node, index = heapq.heappop(events)
        del running[node]
        scheduler.mark_test_complete(node, index, seconds[index])
        start_what_can_start()
    return clock


def lower_bound(seconds: list[float], workers: int) -> float:
    return max(max(seconds), sum(seconds) / workers)


def simulation(results_path: Path, workers: int) -> dict:
    from xdist.scheduler import LoadScheduling

    from cases.model import Case
    from conformance.estimates import relative_cost

    results = load_results(results_path)
    measured = measured_seconds(results)
    records = [r for r in results.records if r.case_id in measured and r.case]
    slowest = sorted(records, key=lambda r: -relative_cost(Case.from_json(r.case)))[:SLOW_CASES]
    seconds_by_id = {r.case_id: measured[r.case_id] for r in records}
    for record in slowest:
        seconds_by_id[record.case_id] = BUDGET
    nodeids = [f"conformance/test_matrix.py::test_case[{r.case_id}]" for r in records]
    seconds = [seconds_by_id[r.case_id] for r in records]
    bound = lower_bound(seconds, workers)
    config = _Config(workers)
    plain = simulate(LoadScheduling(config, _QuietLog()), nodeids, seconds, workers)
    model = CostModel(seconds_by_id, "the recorded seconds")
    ours = simulate(make_scheduler(config, _QuietLog(), model, _case_id), nodeids, seconds, workers)
    return {"cases": len(records), "workers": workers, "lower_bound": bound,
            "collection_order": plain, "longest_first": ours}


def real_run(report: Path, schedule_from: str, workers: int) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
               "conformance/", "--backend", "cpu-inductor", "--profile", "smoke",
               "--report-dir", str(report), "--schedule-from", schedule_from]
    subprocess.run(command, cwd=REPO, check=False, capture_output=True, text=True)
    results = load_results(report / "results.json")
    spans = [(datetime.fromisoformat(r.started_at), datetime.fromisoformat(r.finished_at))
             for r in results.records if r.started_at and r.finished_at]
    durations = [(end - start).total_seconds() for start, end in spans]
    makespan = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds()
    bound = lower_bound(durations, workers)
    return {"schedule": schedule_from, "makespan": makespan, "lower_bound": bound,
            "ratio": makespan / bound, "cases": len(durations)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(REPO / "docs/results/cpu-inductor-smoke-core.json"))
    parser.add_argument("--simulate-only", action="store_true")
    args = parser.parse_args()
    sim = simulation(Path(args.results), 8)
    print(f"simulation: {sim['cases']} cases ({SLOW_CASES} at the {BUDGET:g} s budget) on "
          f"{sim['workers']} workers, lower bound {sim['lower_bound']:.0f} s")
    for key in ("collection_order", "longest_first"):
        print(f"  {key:<17} makespan {sim[key]:7.0f} s  = {sim[key] / sim['lower_bound']:.3f}x "
              "the lower bound")
    if args.simulate_only:
        return
    with tempfile.TemporaryDirectory() as tmp:
        plain = real_run(Path(tmp) / "plain", "off", 2)
        ours = real_run(Path(tmp) / "ours", str(Path(tmp) / "plain" / "results.json"), 2)
    print("real: core smoke matrix, cpu-inductor, pytest -n 2")
    for run in (plain, ours):
        print(f"  --schedule-from {'off (collection order)' if run['schedule'] == 'off' else 'the first run':<24}"
              f" makespan {run['makespan']:6.1f} s, lower bound {run['lower_bound']:6.1f} s, "
              f"{run['ratio']:.3f}x ({run['cases']} cases)")
    print(json.dumps({"simulation": sim, "real": [plain, ours]}))


if __name__ == "__main__":
    main()
