"""Longest first: the costs come from a measured run (or the estimate), bad input is one line,
and under xdist the longest cases start first."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conformance.schedule import (AUTO, ESTIMATE, ScheduleError, cost_model, longest_first,
                                  measured_seconds)
from records import Label, Record, RunResults, load_results, write_results
from tests.test_plugin_runs import CASES, pytest_args, run


def _run_file(path: Path, seconds: dict[str, float], matrix="core", profile="smoke",
              backend="x") -> Path:
    records = tuple(Record(case_id=cid, label=Label.PASS, setup_seconds=0.0,
                           compile_seconds=s, run_seconds=0.0) for cid, s in seconds.items())
    write_results(RunResults({}, {"backend": backend, "profile": profile, "matrix": matrix,
                                  "seed": 0}, records, "t"), path)
    return path


def test_measured_seconds_order_the_cases_and_the_rest_are_scaled_estimates(tmp_path):
    ids = [c.id for c in CASES]
    last = _run_file(tmp_path / "r.json", {ids[0]: 10.0, ids[1]: 40.0, ids[2]: 20.0})
    model = cost_model(CASES, lambda case: 2.0, str(last), "core", "smoke", None, backend="x")
    assert model.seconds[ids[1]] == 40.0 and model.seconds[ids[3]] == pytest.approx(20.0)
    assert "(3 of the 4 cases of the matrix measured)" in model.source
    assert longest_first(list(range(4)), lambda i: model.cost(ids[i])) == [1, 2, 3, 0]


def test_bad_schedule_files_are_one_line_errors_unless_auto_falls_back(tmp_path):
    other = _run_file(tmp_path / "other.json", {CASES[0].id: 1.0}, matrix="extended")
    with pytest.raises(ScheduleError, match="is a run of --matrix extended --profile smoke, "
                                            "this one is --matrix core"):
        cost_model(CASES, lambda c: 1.0, str(other), "core", "smoke", None, backend="x")
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{not json")
    with pytest.raises(ScheduleError, match="not JSON"):
        cost_model(CASES, lambda c: 1.0, str(corrupt), "core", "smoke", None, backend="x")
    fallback = cost_model(CASES, lambda c: 1.0, AUTO, "core", "smoke", corrupt, backend="x")
    assert fallback.source.startswith("the estimate (the last run in the report directory "
                                      "cannot order this one: ") and "not JSON" in fallback.source
    assert "pass the results.json" not in fallback.source  # auto: nobody passed a file
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\xd9\x00\xff" * 10)
    for path, problem in ((garbage, "not UTF-8 text (byte 0xd9 at offset 0)"),
                          (tmp_path, "is a directory, not a file")):
        with pytest.raises(ScheduleError) as error:
            cost_model(CASES, lambda c: 1.0, str(path), "core", "smoke", None, backend="x")
        assert str(error.value) == (f"--schedule-from {path}: {problem}; pass the results.json "
                                    "of a run, or --schedule-from auto")
        assert problem in cost_model(CASES, lambda c: 1.0, AUTO, "core", "smoke", path,
                                     backend="x").source
    estimate = cost_model(CASES, lambda c: 3.0, ESTIMATE, "core", "smoke", None, backend="x")
    assert estimate.seconds[CASES[0].id] == 3.0


def test_a_run_of_another_backend_orders_this_one_only_where_named(tmp_path):
    """The report directory's last run on another backend (eager first calls, where this run
    compiles) falls back to the estimate, saying why; a file the user names is used, and the
    line says whose run it is (it was taken unasked and unsaid: an outside audit)."""
    ids = [c.id for c in CASES]
    eager = _run_file(tmp_path / "r.json", {ids[0]: 1.0, ids[1]: 9.0}, backend="cpu-eager")
    auto = cost_model(CASES, lambda c: 2.0, AUTO, "core", "smoke", eager,
                      backend="cpu-inductor")
    assert auto.seconds == {cid: 2.0 for cid in ids}
    assert auto.source == ("the estimate (the last run in the report directory cannot order "
                           f"this one: {eager} is a run of cpu-eager, this one is "
                           "cpu-inductor)")
    named = cost_model(CASES, lambda c: 2.0, str(eager), "core", "smoke", None,
                       backend="cpu-inductor")
    assert named.seconds[ids[1]] == 9.0
    assert named.source == f"{eager} (a run of cpu-eager; 2 of the 4 cases of the matrix measured)"
    same = cost_model(CASES, lambda c: 2.0, AUTO, "core", "smoke", eager, backend="cpu-eager")
    assert same.seconds[ids[1]] == 9.0 and same.source == \
        f"{eager} (2 of the 4 cases of the matrix measured)"


def test_measured_seconds_count_setup_compile_and_every_timed_run():
    record = Record(case_id="a", label=Label.PASS, setup_seconds=1.0, compile_seconds=2.0,
                    run_seconds=0.5)
    run_ = RunResults({}, {"backend": "x", "profile": "smoke", "seed": 0, "timed_runs": 4},
                      (record, Record(case_id="b", label=Label.UNSUPPORTED)), "t")
    assert measured_seconds(run_) == {"a": 5.0}


@pytest.mark.slow
def test_under_xdist_the_longest_cases_start_first(tmp_path):
    ids = [c.id for c in CASES]
    # the last two cases of collection order are the longest by this "baseline"
    baseline = _run_file(tmp_path / "baseline.json", {ids[0]: 1.0, ids[1]: 2.0, ids[2]: 30.0,
                                                       ids[3]: 40.0}, backend="cpu-eager")
    baseline_run = load_results(baseline)
    write_results(replace(baseline_run, selection=None), baseline)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES, "-n", "2", "--profile", "smoke",
                           "--schedule-from", str(baseline)))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (f"schedule: longest first, from {baseline} (4 of the 4 cases of the matrix "
            "measured)") in proc.stdout
    results = load_results(tmp_path / "report" / "results.json")
    by_start = [r.case_id for r in sorted(results.records, key=lambda r: r.started_at)]
    assert set(by_start[:2]) == {ids[3], ids[2]}, by_start
    # a run stopped before its first case leaves the last results in previous/: auto uses them
    report = tmp_path / "report"
    (report / "results.json").unlink()
    (report / "previous").mkdir(exist_ok=True)
    (report / "previous" / "results.json").write_bytes(baseline.read_bytes())
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES, "-n", "2", "--profile", "smoke"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (f"schedule: longest first, from {report / 'previous' / 'results.json'} (4 of the 4 "
            "cases of the matrix measured)") in proc.stdout
    # the last run's results.json is set aside when the run starts: the line says where to
    # (it named the path that then held this run's own results: an outside audit)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES, "-n", "2", "--profile", "smoke"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (f"schedule: longest first, from {report / 'results.json'} (4 of the 4 cases of the "
            "matrix measured); "
            f"set aside since, into {report / 'previous' / 'results.json'}") in proc.stdout
    # named as a file, previous/results.json is replaced by the run set aside there
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES, "-n", "2", "--profile", "smoke",
                           "--schedule-from", str(report / "previous" / "results.json")))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (f"schedule: longest first, from {report / 'previous' / 'results.json'} (4 of the 4 "
            "cases of the matrix measured); replaced since by the last run's results, set aside "
            "there") in proc.stdout
    bad = run(pytest_args(tmp_path, "cpu-eager", CASES, "-n", "2",
                          "--schedule-from", str(tmp_path / "missing.json")))
    assert bad.returncode == 4 and "--schedule-from" in bad.stderr and "no such file" in bad.stderr


@pytest.mark.parametrize("workers", [(), ("-n", "1")])
def test_a_bad_schedule_file_is_a_usage_error_without_xdist_too(tmp_path, workers):
    """One process has no order to choose, but a file the user named that cannot be read is
    still bad input: one line, exit 4, nothing run."""
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], *workers,
                           "--schedule-from", str(garbage)))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.strip()]
    assert error == [f"ERROR: --schedule-from {garbage}: not UTF-8 text (byte 0x89 at offset "
                     "0); pass the results.json of a run, or --schedule-from auto"]
    assert not (tmp_path / "report" / "results.json").exists()


def test_an_empty_schedule_from_names_what_to_give():
    from conformance.options import option_value

    with pytest.raises(ValueError, match="^--schedule-from is empty; give a run's results.json, "
                                         "or auto, estimate or off, or leave the option out$"):
        option_value("--schedule-from", "")
