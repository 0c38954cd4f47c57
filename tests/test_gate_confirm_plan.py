"""Whether the gate measures its time findings again, and under which pythons
(reports/confirm_plan.py): ``--confirm auto`` (the default) measures them 3 times when that is
fair here and says why not otherwise; ``--confirm N`` refuses an unfair measurement (exit 2).

The decisive one: a python with another release than the candidate's would measure other
software, and dismiss a real slowdown as noise; it must never be used silently.
"""
from __future__ import annotations

import json
import platform
import sys
from dataclasses import replace

import pytest

from records.results import load_results, write_results
from reports.confirm_plan import AUTO_REPEATS, plan_confirmation, probe_release
from tests.test_gate import gate
from tests.test_plugin_runs import TINY, clean_env, pytest_args, run as run_pytest
from tests.test_report_doctored import case_id, record, run

A = case_id(seq=128)
HERE = platform.node()


def here(results, **environment):
    """``results`` recorded on this host, with ``environment`` on top."""
    return replace(results, environment={**results.environment, "host": HERE, **environment})


def probe_giving(releases: dict, calls: list):
    """A stand-in release probe: python -> the release keys it has (or why it cannot say)."""
    def probe(python, results):
        calls.append(python)
        return releases[python]
    return probe


RELEASE = {"torch": "2.13.0", "neuronx_cc": "2.21 & co"}  # what tests.test_report_doctored records


def test_auto_measures_three_times_when_the_python_has_the_candidates_release():
    calls = []
    plan = plan_confirmation(None, here(run([record(A)])), here(run([record(A)])), "cand-py",
                             probe=probe_giving({"cand-py": RELEASE}, calls))
    assert (plan.repeats, [s.name for s in plan.sides], plan.declined) == (
        AUTO_REPEATS, ["candidate"], "")
    assert calls == ["cand-py"]
    assert plan_confirmation(4, here(run([record(A)])), here(run([record(A)])), "cand-py",
                             probe=probe_giving({"cand-py": RELEASE}, [])).repeats == 4


def test_auto_declines_a_python_with_another_release_and_n_refuses_it():
    """The gate's own python has the baseline's torch: measuring it as the candidate would
    measure the baseline again."""
    baseline, candidate = here(run([record(A)])), here(run([record(A)]), torch="2.14.1")
    probe = probe_giving({sys.executable: RELEASE}, [])
    plan = plan_confirmation(None, baseline, candidate, probe=probe)
    assert plan.repeats == 0 and plan.declined == (
        f"the gate's python {sys.executable} (the candidate's unless --candidate-python names "
        "another) has another release than the candidate ran (torch '2.13.0' where the run "
        "recorded '2.14.1'), and would measure that one; give --candidate-python with the "
        "python that has the candidate's release, e.g. .tox/ENV/bin/python")
    with pytest.raises(ValueError, match=r"^the gate's python .* has another release"):
        plan_confirmation(3, baseline, candidate, probe=probe)


def test_the_baseline_python_is_checked_too_and_then_the_baseline_may_come_from_elsewhere():
    baseline = run([record(A)])  # host-1: measured again here, so its host does not matter
    candidate = here(run([record(A)]), torch="2.14.1")
    releases = {"old-py": {**RELEASE, "torch": "2.14.1"}, "new-py": {**RELEASE, "torch": "2.14.1"}}
    with pytest.raises(ValueError, match=r"^--baseline-python old-py has another release than "
                                         r"the baseline ran \(torch '2.14.1' where the run "
                                         r"recorded '2.13.0'\)"):
        plan_confirmation(3, baseline, candidate, "new-py", "old-py",
                          probe=probe_giving(releases, []))
    releases["old-py"] = RELEASE
    plan = plan_confirmation(3, baseline, candidate, "new-py", "old-py",
                             probe=probe_giving(releases, []))
    assert [(s.name, s.python) for s in plan.sides] == [("baseline", "old-py"),
                                                        ("candidate", "new-py")]


@pytest.mark.parametrize("environment, words", [
    ({"host": "host-1"}, "the baseline ran on host host-1 and this is host "),
    ({"host": None}, "the baseline does not say which host it ran on"),
    ({"hosts": [HERE, "ci-2"]}, f"the baseline ran on host {HERE}, ci-2 and this is host"),
])
def test_a_baseline_not_measured_again_must_have_run_here(environment, words):
    """Its recorded figure is the yardstick of the candidate's new ones, measured here."""
    baseline = replace(run([record(A)]), environment={**run([]).environment, **environment})
    calls = []
    plan = plan_confirmation(None, baseline, here(run([record(A)])),
                             probe=probe_giving({sys.executable: RELEASE}, calls))
    assert plan.repeats == 0 and plan.declined.startswith(words), plan.declined
    assert calls == []  # decided before any python is started
    with pytest.raises(ValueError, match="give --baseline-python"):
        plan_confirmation(2, baseline, here(run([record(A)])),
                          probe=probe_giving({sys.executable: RELEASE}, []))


def test_without_a_checkout_of_the_suite_nothing_can_be_measured_again(tmp_path, monkeypatch):
    import reports.confirm_plan

    monkeypatch.setattr(reports.confirm_plan, "SUITE_ROOT", tmp_path)  # no conformance/ there
    plan = plan_confirmation(None, here(run([record(A)])), here(run([record(A)])),
                             probe=probe_giving({sys.executable: RELEASE}, []))
    assert plan.repeats == 0 and plan.declined == (
        f"no conformance/ beside {tmp_path / 'reports'}, and the reruns run the suite: run the "
        "gate from a checkout of this suite (pip install -e .)")


def test_confirm_0_plans_nothing_and_probes_nothing():
    calls = []
    assert plan_confirmation(0, run([]), run([]), probe=probe_giving({}, calls)).repeats == 0
    assert calls == []


def test_the_release_probe_says_what_this_python_would_record():
    import torch

    cpu = here(replace(run([]), options={**run([]).options, "backend": "cpu-eager"}))
    assert probe_release(sys.executable, cpu) == {"torch": torch.__version__}
    nowhere = replace(cpu, options={**cpu.options, "backend": "no-such-backend"})
    found = probe_release(sys.executable, nowhere)
    assert isinstance(found, str) and found.startswith("unknown backend 'no-such-backend'")


def test_gating_with_a_python_of_another_release_is_refused_before_anything_is_measured(
        tmp_path, capsys):
    """End to end, with the real probe: the candidate recorded torch 9.9.9 here; this python
    has another torch. ``--confirm 2`` is bad input (exit 2, one line, nothing rerun); the
    default leaves the finding blocking and says why."""
    def cpu_run(seconds, torch):
        results = run([record(A, compile_seconds=seconds)])
        return here(replace(results, options={**results.options, "backend": "cpu-eager"}),
                    torch=torch, backend="cpu-eager")

    import torch
    old, new = cpu_run(4.0, torch.__version__), cpu_run(8.0, "9.9.9")
    assert gate(tmp_path, old, new, "--confirm", "2", "--confirm-dir",
                str(tmp_path / "reruns")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and (
        f"has another release than the candidate ran (torch {torch.__version__!r} where the run "
        "recorded '9.9.9')") in err, err
    assert not (tmp_path / "reruns").exists()
    assert gate(tmp_path, old, new) == 1
    assert "--confirm auto did not measure them again: the gate's python" in \
        capsys.readouterr().out


@pytest.mark.slow
def test_by_default_a_slow_measurement_the_candidate_does_not_reproduce_here_is_dismissed(
        tmp_path, capsys):
    """Measured for real (the stand-in compiler of tests/slow_backends.py, no slowdown): the
    candidate recorded its case at twice the time it takes (a measurement on a loaded
    machine). The default gate measures it again 3 times with this python, which has the
    candidate's release, against the baseline's recorded figure: dismissed, MAY SHIP."""
    from cases.model import Case, Variant

    proc = run_pytest(pytest_args(tmp_path, "tests.slow_backends:SlowFirstCall",
                                  [Case(Variant("full"), TINY)]), env=clean_env())
    assert proc.returncode == 0, proc.stdout[-3000:]
    baseline = load_results(tmp_path / "report" / "results.json")
    [measured] = baseline.records
    noisy = replace(measured, compile_seconds=2 * measured.compile_seconds,
                    compile_breakdown={k: 2 * v for k, v in measured.compile_breakdown.items()})
    write_results(baseline, tmp_path / "old.json")
    write_results(replace(baseline, records=(noisy,)), tmp_path / "new.json")
    args = ["--baseline", str(tmp_path / "old.json"), "--candidate", str(tmp_path / "new.json")]
    from conformance.cli import main

    assert main(["gate", *args, "--confirm", "0"]) == 1  # one measurement: it blocks
    capsys.readouterr()
    assert main(["gate", *args, "--json", str(tmp_path / "gate.json")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("confirm: 1 flagged case measured again 3 times, cold, for the candidate "
                          "(--confirm auto; --confirm 0 skips this)\n"), err
    assert "confirm: rerun 3/3 of the candidate (1 case" in err
    [finding] = json.loads((tmp_path / "gate.json").read_text())["findings"]
    assert (finding["category"], finding["confirmation"]["status"]) == ("dismissed", "dismissed")
    assert len(finding["confirmation"]["candidate"]["seconds"]) == AUTO_REPEATS
