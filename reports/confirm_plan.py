"""Whether ``flexconf gate`` measures its time findings again, how often and under which
pythons (``--confirm auto|N``), decided before anything is measured.

A time finding is dismissed only when both releases are measured again here, side by side: a
candidate measured again on a quiet machine against the baseline's one recorded figure would
hide a real slowdown whenever the baseline's run was slowed by load. So a measurement again
needs a python for each release, named by the user, since only the user knows where each
release is installed:

- the candidate's: ``--candidate-python``, by default the python running the gate;
- the baseline's: ``--baseline-python``. Never the candidate's by default, even where the two
  runs recorded the same versions: what they did not record (a plugin's helper outside its
  package, an environment variable, an option) may differ, and the candidate's setup would
  then be measured as both releases.

Each python is asked what it would record (``conformance.release_probe``, run under it with
its side's backend and PYTHONPATH), and one with another release than its side recorded
(records/release.py: torch, the compiler stack, a plugin's code) is never used: it would
measure other software (with the baseline's torch in the candidate's place, a real slowdown
is measured away as noise). With ``--confirm N`` a missing or wrong python is bad input (one
line, exit 2); with ``auto`` (the default) the findings are not measured again, block, and the
gate's note says why and what to give. Both sides' reruns get the candidate run's worker
count, so each case has the same share of the cores on both sides.
"""
from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass, replace
from typing import Callable

from records.release import PROBE_MARKER, release_difference, release_of
from records.results import RunResults
from records.text import one_line
from reports.confirm import SUITE_ROOT, Side, default_python, run_workers, side_env
from reports.gate import GateDecision, Note
from reports.summary import rerun_backend

#: reruns per side under ``--confirm auto``: a median of three outvotes one slow measurement
AUTO_REPEATS = 3
#: seconds the release probe may take (it imports torch and the backend's SDK)
PROBE_TIMEOUT_SECONDS = 300
#: an example of where a release's python lives, for the fixes
PYTHON_EXAMPLE = "e.g. /path/to/.tox/ENV/bin/python"

#: what a python would measure: (python, the side's run) -> release keys, or why it cannot say
Probe = Callable[[str, RunResults], "dict | str"]


class Unfair(ValueError):
    """Why the findings cannot be measured again fairly, and what to give: one line."""


@dataclass(frozen=True)
class ConfirmPlan:
    repeats: int  # reruns per side; 0: the findings are not measured again
    sides: tuple[Side, ...] = ()  # the baseline, then the candidate
    declined: str = ""  # --confirm auto only: why the findings are not measured again


def plan_confirmation(confirm: int | None, baseline: RunResults, candidate: RunResults,
                      candidate_python: str | None = None, baseline_python: str | None = None,
                      probe: Probe | None = None,
                      progress: Callable[[str], None] = lambda line: None) -> ConfirmPlan:
    """The plan for ``--confirm`` ``confirm`` (None: auto). ValueError, one line with the fix,
    when an explicit count cannot be measured fairly (see the module doc)."""
    if confirm == 0:
        return ConfirmPlan(0)
    try:
        sides = fair_sides(baseline, candidate, candidate_python, baseline_python,
                           probe or probe_release, progress)
    except Unfair as exc:
        if confirm is None:
            return ConfirmPlan(0, declined=str(exc))
        raise ValueError(str(exc)) from None
    return ConfirmPlan(AUTO_REPEATS if confirm is None else confirm, sides)


def fair_sides(baseline: RunResults, candidate: RunResults, candidate_python: str | None,
               baseline_python: str | None, probe: Probe,
               progress: Callable[[str], None]) -> tuple[Side, Side]:
    """The baseline's and the candidate's side, each with a python that has its release;
    Unfair (see the module doc) when there is none."""
    if not all((SUITE_ROOT / part).is_file() for part in ("conftest.py",
                                                          "conformance/plugin.py")):
        raise Unfair(f"{one_line(SUITE_ROOT)} is not a checkout of this suite (no conftest.py "
                     "and conformance/ there), and the reruns run the suite from one: run the "
                     "gate from a checkout (git clone ...; pip install -e .)")
    for name, results in (("baseline", baseline), ("candidate", candidate)):
        if not release_of(results.environment):
            raise Unfair(f"the {name}'s results record no release (no torch version: its "
                         "backend's environment() records none), so no python can be shown "
                         "to have it")
    if not baseline_python:
        raise Unfair("no python for the baseline, and a time finding is dismissed only when "
                     "both releases are measured again side by side: give --baseline-python "
                     f"with the python that has the baseline's release, {PYTHON_EXAMPLE}")
    workers = run_workers(candidate)
    python = candidate_python or default_python()
    who = (f"--candidate-python {one_line(python)}" if candidate_python else
           f"the gate's python {one_line(python)} (the candidate's unless --candidate-python "
           "names another)")
    _check(_release(probe, python, candidate, progress), candidate, "candidate", who)
    _check(_release(probe, baseline_python, baseline, progress), baseline, "baseline",
           f"--baseline-python {one_line(baseline_python)}")
    return (Side("baseline", baseline, baseline_python, workers),
            Side("candidate", candidate, python, workers))


def _release(probe: Probe, python: str, results: RunResults,
             progress: Callable[[str], None]) -> dict | str:
    progress(f"confirm: asking {one_line(python)} which release it has")
    return probe(python, results)


def _check(found: dict | str, results: RunResults, name: str, who: str) -> None:
    fix = f"give --{name}-python with the python that has the {name}'s release, {PYTHON_EXAMPLE}"
    if isinstance(found, str):
        recorded = rerun_backend(results)[1].get("PYTHONPATH")
        if recorded:  # never taken from the file: a file must not choose what the gate runs
            fix = (f"the run imported its backend or case modules from PYTHONPATH="
                   f"{shlex.quote(one_line(recorded))}: set it yourself if you trust that "
                   f"code, or {fix}")
        raise Unfair(f"{who} cannot load the {name}'s backend: {found}; {fix}")
    difference = release_difference(results.environment, found)
    if difference:
        raise Unfair(f"{who} has another release than the {name} ran ({difference}), and would "
                     f"measure that one; {fix}")


def probe_release(python: str, results: RunResults) -> dict | str:
    """The release keys ``python`` would record running ``results``' backend, or one line
    saying why it cannot tell (conformance/release_probe.py, run from the suite's root)."""
    backend, _ = rerun_backend(results)
    try:
        proc = subprocess.run([python, "-m", "conformance.release_probe", backend],
                              cwd=SUITE_ROOT, env=side_env(python, results), capture_output=True,
                              text=True, encoding="utf-8", errors="replace",
                              timeout=PROBE_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return one_line(f"running it failed: {type(exc).__name__}")
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_MARKER):
            try:
                found = json.loads(line[len(PROBE_MARKER):])
            except ValueError:
                found = None
            if isinstance(found, dict):
                return found
            return one_line(f"it said {line[:120]!r}, not the release as a JSON object")
    tail = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return one_line(tail[-1] if tail else f"it exited {proc.returncode} and said nothing")


def unconfirmed_note(decision: GateDecision, plan: ConfirmPlan) -> GateDecision:
    """``decision`` with its UNCONFIRMED note saying why its time findings were not measured
    again (``--confirm 0``, or what ``auto`` found unfair, with the fix); flagged, so a reader
    sees it before the findings that it explains."""
    why = (f"--confirm auto did not measure them again: {plan.declined}" if plan.declined
           else "--confirm 0 turned measuring them again off")
    note = Note("UNCONFIRMED", "time findings are unconfirmed, and block: each case was "
                f"measured once per run, and {why}", flagged=bool(plan.declined))
    notes = tuple(note if n.kind == "UNCONFIRMED" else n for n in decision.notes)
    return replace(decision, notes=notes)
