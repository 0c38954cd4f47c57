"""Whether the gate measures its time findings again, and under which pythons
(reports/confirm_plan.py). A finding is dismissed only when both releases are measured again
here, side by side, each under a python the user named that has its release: ``--confirm
auto`` (the default) does that 3 times when ``--baseline-python`` is given and says why not
otherwise; ``--confirm N`` refuses when it cannot (exit 2).

The decisive cases: a python with another release (torch, or a plugin's code) would measure
other software and dismiss a real slowdown as noise; it must never be used.
"""
from __future__ import annotations

import json
import stat
import sys
from dataclasses import replace

import pytest

from reports.confirm_plan import AUTO_REPEATS, plan_confirmation, probe_release
from tests.test_gate import gate
from tests.test_report_doctored import case_id, record, run

A = case_id(seq=128)
OLD = {"torch": "2.13.0", "neuronx_cc": "2.21 & co"}  # what tests.test_report_doctored records
NEW = {**OLD, "torch": "2.14.1"}


def recorded(release: dict, workers: int = 1):
    """A run of one case that recorded ``release``, with ``workers`` xdist workers."""
    results = run([record(A)])
    return replace(results, environment={"backend": "neuron", "host": "host-1",
                                         "workers": workers, **release})


def probe_giving(releases: dict, calls: list | None = None):
    """A stand-in release probe: python -> the release keys it has (or why it cannot say)."""
    def probe(python, results):
        if calls is not None:
            calls.append(python)
        return releases[python]
    return probe


def test_both_releases_are_measured_by_the_pythons_named_with_the_candidates_workers():
    calls = []
    plan = plan_confirmation(None, recorded(OLD, workers=1), recorded(NEW, workers=2),
                             "new-py", "old-py",
                             probe=probe_giving({"new-py": NEW, "old-py": OLD}, calls))
    assert plan.repeats == AUTO_REPEATS and plan.declined == ""
    assert [(s.name, s.python, s.workers) for s in plan.sides] == [
        ("baseline", "old-py", 2), ("candidate", "new-py", 2)]  # the candidate's workers
    assert calls == ["new-py", "old-py"]
    assert plan_confirmation(4, recorded(OLD), recorded(NEW), "new-py", "old-py",
                             probe=probe_giving({"new-py": NEW, "old-py": OLD})).repeats == 4


def test_without_candidate_python_the_gates_own_python_measures_the_candidate():
    """The default candidate side: the python running the gate, asked for its release like
    any other, and used when it has the candidate's."""
    calls = []
    plan = plan_confirmation(None, recorded(OLD), recorded(NEW), None, "old-py",
                             probe=probe_giving({sys.executable: NEW, "old-py": OLD}, calls))
    assert plan.repeats == AUTO_REPEATS and plan.declined == ""
    assert [(s.name, s.python) for s in plan.sides] == [("baseline", "old-py"),
                                                       ("candidate", sys.executable)]
    assert sorted(calls) == sorted([sys.executable, "old-py"])


def test_without_a_python_for_the_baseline_nothing_is_measured_again():
    """Not even when both runs recorded the same versions: what they did not record (a
    plugin's helper elsewhere, an environment variable) may differ, and a review measured a
    real 2x slowdown dismissed when the candidate's python measured both."""
    calls = []
    plan = plan_confirmation(None, recorded(OLD), recorded(OLD), "py",
                             probe=probe_giving({"py": OLD}, calls))
    assert plan.repeats == 0 and plan.declined == (
        "no python for the baseline, and a time finding is dismissed only when both releases "
        "are measured again side by side: give --baseline-python with the python that has the "
        "baseline's release, e.g. /path/to/.tox/ENV/bin/python")
    assert calls == []  # decided before any python is started
    with pytest.raises(ValueError, match=r"^no python for the baseline"):
        plan_confirmation(3, recorded(OLD), recorded(NEW), "py", probe=probe_giving({}))


def test_a_python_with_another_release_than_its_side_is_never_used():
    """The gate's own python has the baseline's torch: measuring it as the candidate would
    measure the baseline again. And a --baseline-python that has the candidate's."""
    old, new = recorded(OLD), recorded(NEW)
    plan = plan_confirmation(None, old, new, baseline_python="old-py",
                             probe=probe_giving({sys.executable: OLD, "old-py": OLD}))
    assert plan.repeats == 0 and plan.declined == (
        f"the gate's python {sys.executable} (the candidate's unless --candidate-python names "
        "another) has another release than the candidate ran (torch '2.13.0' where the run "
        "recorded '2.14.1'), and would measure that one; give --candidate-python with the "
        "python that has the candidate's release, e.g. /path/to/.tox/ENV/bin/python")
    with pytest.raises(ValueError, match=r"^--baseline-python new-py has another release than "
                                         r"the baseline ran \(torch '2.14.1' where the run "
                                         r"recorded '2.13.0'\)"):
        plan_confirmation(2, old, new, "new-py", "new-py", probe=probe_giving({"new-py": NEW}))


def test_a_plugin_edited_since_the_baseline_ran_is_another_release():
    """Same torch, but the plugin's code changed between the runs (a review's case: a plugin
    directory holding the candidate's version, given as both sides' PYTHONPATH, measured the
    candidate twice and dismissed a 2x slowdown)."""
    old, new = recorded({**OLD, "backend_code": "aaaa"}), recorded({**OLD, "backend_code": "bbbb"})
    found = {"py": {**OLD, "backend_code": "bbbb"}}
    plan = plan_confirmation(None, old, new, "py", "py", probe=probe_giving(found))
    assert plan.repeats == 0 and "(backend_code 'bbbb' where the run recorded 'aaaa')" in \
        plan.declined
    with pytest.raises(ValueError, match=r"^--baseline-python py has another release than the "
                                         r"baseline ran \(backend_code 'bbbb' where the run "
                                         r"recorded 'aaaa'\)"):
        plan_confirmation(3, old, new, "py", "py", probe=probe_giving(found))


def test_the_plugin_digest_covers_its_whole_package_and_not_the_suites_own_code(tmp_path,
                                                                                monkeypatch):
    """A helper module of the plugin counts (a review: a slowdown in a helper kept the digest
    of the class's file); a built-in backend records none (its code is the gate's checkout,
    the same for both reruns)."""
    import importlib

    from conformance.backends.base import backend_code
    from conformance.backends.cpu import CpuEager

    package = tmp_path / "myplug"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("EXTRA_SECONDS = 0\n")
    (package / "backend.py").write_text(
        "from conformance.backends.cpu import CpuEager\nclass Plug(CpuEager):\n"
        "    name = 'plug'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plug = importlib.import_module("myplug.backend").Plug
    before = backend_code(plug)
    (package / "helpers.py").write_text("EXTRA_SECONDS = 2\n")
    after = backend_code(plug)
    assert before and after and before != after
    assert backend_code(CpuEager) is None


def test_runs_that_record_no_release_cannot_be_measured_again():
    bare = replace(recorded(OLD), environment={"backend": "neuron", "host": "host-1"})
    calls = []
    plan = plan_confirmation(None, bare, recorded(OLD), "py", "py",
                             probe=probe_giving({}, calls))
    assert plan.repeats == 0 and plan.declined.startswith("the baseline's results record no "
                                                          "release")
    assert calls == []  # decided before any python is started


def test_without_a_checkout_of_the_suite_nothing_can_be_measured_again(tmp_path, monkeypatch):
    import reports.confirm_plan

    monkeypatch.setattr(reports.confirm_plan, "SUITE_ROOT", tmp_path)
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "plugin.py").write_text("")  # as a plain pip install has it
    plan = plan_confirmation(None, recorded(OLD), recorded(OLD), "py", "py",
                             probe=probe_giving({"py": OLD}))
    assert plan.repeats == 0 and plan.declined == (
        f"{tmp_path} is not a checkout of this suite (no conftest.py and conformance/ there), "
        "and the reruns run the suite from one: run the gate from a checkout (git clone ...; "
        "pip install -e .)")


def test_confirm_0_plans_nothing_and_probes_nothing():
    calls = []
    assert plan_confirmation(0, run([]), run([]), probe=probe_giving({}, calls)).repeats == 0
    assert calls == []


def python_saying(tmp_path, line: str) -> str:
    script = tmp_path / "python-says"
    script.write_text(f"#!/bin/sh\necho '{line}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_the_release_probe_says_what_this_python_would_record(tmp_path):
    import torch

    cpu = replace(run([]), options={**run([]).options, "backend": "cpu-eager"})
    found = probe_release(sys.executable, cpu)
    assert found == {"torch": torch.__version__}  # a built-in backend: no plugin code
    plugin = replace(cpu, options={**cpu.options, "backend_requested":
                                   "tests.slow_backends:SlowFirstCall"})
    assert set(probe_release(sys.executable, plugin)) == {"torch", "backend_code"}
    nowhere = replace(cpu, options={**cpu.options, "backend": "no-such-backend"})
    assert probe_release(sys.executable, nowhere).startswith("unknown backend 'no-such-backend'")
    for junk in ("FLEXCONF-RELEASE null", "FLEXCONF-RELEASE [1]", "FLEXCONF-RELEASE {"):
        said = probe_release(python_saying(tmp_path, junk), cpu)
        assert isinstance(said, str) and "not the release as a JSON object" in said, said


def test_the_gate_never_imports_code_from_where_a_results_file_points(tmp_path):
    """A results file naming a plugin and a backend_pythonpath beside it made the gate's
    release probe import that code (an outside trial: a CI artefact carrying a .py file)."""
    from reports.confirm_plan import Unfair, _check

    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "imported"
    (planted / "plantedbackend.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nclass B: pass\n")
    cpu = replace(run([]), options={**run([]).options, "backend": "plantedbackend",
                                    "backend_requested": "plantedbackend:B",
                                    "backend_pythonpath": str(planted)})
    found = probe_release(sys.executable, cpu)
    assert isinstance(found, str) and not marker.exists()
    with pytest.raises(Unfair) as unfair:
        _check(found, cpu, "candidate", "the gate's python")
    assert (f"the run imported its backend or case modules from PYTHONPATH={planted}: set it "
            "yourself if you trust that code, or give --candidate-python") in str(unfair.value)


def test_gating_with_a_python_of_another_release_is_refused_before_anything_is_measured(
        tmp_path, capsys):
    """End to end, with the real probe: the candidate recorded torch 9.9.9; this python has
    another torch. ``--confirm 2`` is bad input (exit 2, one line after the probe's progress,
    nothing rerun); the default leaves the finding blocking and says why."""
    import torch

    def cpu_run(seconds, version):
        results = run([record(A, compile_seconds=seconds)])
        return replace(results, options={**results.options, "backend": "cpu-eager"},
                       environment={"backend": "cpu-eager", "torch": version})

    old, new = cpu_run(4.0, torch.__version__), cpu_run(8.0, "9.9.9")
    assert gate(tmp_path, old, new, "--confirm", "2", "--baseline-python", sys.executable,
                "--confirm-dir", str(tmp_path / "reruns")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"confirm: asking {sys.executable} which release it has"
    assert len(err) == 2 and (f"has another release than the candidate ran (torch "
                              f"{torch.__version__!r} where the run recorded '9.9.9')") in err[1]
    assert list((tmp_path / "reruns").iterdir()) == []  # made, and nothing measured
    assert gate(tmp_path, old, new, "--baseline-python", sys.executable, confirm="auto") == 1
    assert "--confirm auto did not measure them again: the gate's python" in \
        capsys.readouterr().out
    assert gate(tmp_path, old, new, confirm="auto") == 1  # and without a baseline python
    assert "--confirm auto did not measure them again: no python for the baseline" in \
        capsys.readouterr().out


def test_bad_places_and_relative_pythons(tmp_path, capsys, monkeypatch):
    old, new = recorded(OLD), recorded(NEW)
    (tmp_path / "file").write_text("")
    assert gate(tmp_path, old, new, "--confirm", "2", "--confirm-dir",
                str(tmp_path / "file" / "sub"), "--json", str(tmp_path / "g.json")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flexconf gate: error: --confirm-dir {tmp_path / 'file' / 'sub'}: it cannot "
                          "be made") and err.endswith("e.g. --confirm-dir reports/confirm"), err
    assert json.loads((tmp_path / "g.json").read_text())["verdict"] == "REFUSED"
    # a relative python is the one it names from here, not from the suite's root
    import argparse

    from reports.cmd_gate import add_arguments, check_confirm_arguments

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--baseline", "o", "--candidate", "n",
                              "--candidate-python", "bin/python"])
    check_confirm_arguments(args)
    assert args.candidate_python == str(tmp_path / "bin" / "python")


def test_with_a_limit_compile_and_run_findings_take_turns_in_what_is_measured_again():
    """torch 2.14.1 -> 2.15.0 (docs/results/README.md): every compile grew about x1.4 and
    one run time x1.32; by the factor alone the 20 cases measured again were all compile
    findings, and the run-time finding blocked unmeasured though it was likely noise. Each
    measure now gives its largest growth in turn, and a case is measured once for both."""
    from reports.confirm import flagged_cases
    from reports.gate import decide

    compiled = [case_id(seq=s) for s in (128, 256, 512, 1024)]
    slow_run, both = case_id(variant="alibi"), case_id(variant="full")
    old = run([record(c, compile_seconds=4.0) for c in [*compiled, slow_run, both]])
    new = run([record(c, compile_seconds=4.0 * f) for c, f in zip(compiled, (2.0, 1.9, 1.8, 1.7))]
              + [replace(record(slow_run), run_seconds=0.0132),
                 replace(record(both, compile_seconds=6.0), run_seconds=0.02)])
    decision = decide(old, new, run_slack_seconds=0.001)
    kinds = sorted((f.kind, f.subject) for f in decision.findings)
    assert kinds == sorted([*(("COMPILE_TIME", c) for c in [*compiled, both]),
                            ("RUN_TIME", slow_run), ("RUN_TIME", both)]), kinds
    # compile's largest x2.0, then run's largest (both: x2.0), then compile's next x1.9, then
    # run's next (slow_run: x1.32), ...: the run-time finding that grew least still gets in
    assert flagged_cases(decision, 4) == [compiled[0], both, compiled[1], slow_run]
    assert flagged_cases(decision, 2) == [compiled[0], both]
    assert set(flagged_cases(decision)) == {*compiled, slow_run, both}
    assert flagged_cases(decision, 5) == [compiled[0], both, compiled[1], slow_run, compiled[2]]
