"""Whether ``flexconf gate`` measures its time findings again, how often and under which
pythons (``--confirm auto|N``), decided before anything is measured.

``--confirm N`` asks for N reruns per side; ``auto`` (the default) gives ``AUTO_REPEATS`` when
measuring again here is fair, else none, with the reason. Fair means:

- the suite's ``conformance/`` is beside the gate (the reruns run it);
- each python measures the release its side ran: the candidate's python (``--candidate-python``,
  by default the gate's own) has the torch and compiler versions the candidate recorded, and
  ``--baseline-python`` those of the baseline (``conformance.release_probe``, run under it,
  says which it has). A python with another release would measure other software: with the
  baseline's torch as the candidate's python, a real slowdown is dismissed as noise;
- a baseline that is not measured again ran on this host: its recorded figures are the
  yardstick of the candidate's new ones, which are measured here.

With ``--confirm N`` a measurement that would not be fair is bad input (one line, exit 2);
with ``auto`` the findings stay unconfirmed and block, and the gate's note says why and how
to have them measured.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass, replace
from typing import Callable

from records.release import PROBE_MARKER, hosts_of, release_difference
from records.results import RunResults
from records.text import one_line
from reports.confirm import SUITE_ROOT, Side, default_python
from reports.gate import GateDecision, Note
from reports.summary import rerun_backend

#: reruns per side under ``--confirm auto``: a median of three outvotes one slow measurement
AUTO_REPEATS = 3
#: seconds the release probe may take (it imports torch and the backend's SDK)
PROBE_TIMEOUT_SECONDS = 300

#: what a python would measure: (python, the side's run) -> release keys, or why it cannot say
Probe = Callable[[str, RunResults], "dict | str"]


@dataclass(frozen=True)
class ConfirmPlan:
    repeats: int  # reruns per side; 0: the findings are not measured again
    sides: tuple[Side, ...] = ()  # baseline (when given) first, then the candidate
    declined: str = ""  # --confirm auto only: why the findings are not measured again


def plan_confirmation(confirm: int | None, baseline: RunResults, candidate: RunResults,
                      candidate_python: str | None = None, baseline_python: str | None = None,
                      probe: Probe | None = None) -> ConfirmPlan:
    """The plan for ``--confirm`` ``confirm`` (None: auto). ValueError, one line with the fix,
    when an explicit count cannot be measured fairly (see the module doc)."""
    if confirm == 0:
        return ConfirmPlan(0)
    sides = [Side("candidate", candidate, candidate_python or default_python())]
    if baseline_python:
        sides.insert(0, Side("baseline", baseline, baseline_python))
    problem = unfairness(sides, baseline, candidate_python is not None, probe or probe_release)
    if problem is None:
        return ConfirmPlan(AUTO_REPEATS if confirm is None else confirm, tuple(sides))
    if confirm is None:
        return ConfirmPlan(0, declined=problem)
    raise ValueError(problem)


def unfairness(sides: list[Side], baseline: RunResults, candidate_python_given: bool,
               probe: Probe) -> str | None:
    """Why measuring ``sides`` again here would not be fair, with the fix; None when it is."""
    if not (SUITE_ROOT / "conformance" / "plugin.py").is_file():
        return (f"no conformance/ beside {one_line(SUITE_ROOT / 'reports')}, and the reruns run "
                "the suite: run the gate from a checkout of this suite (pip install -e .)")
    if not any(side.name == "baseline" for side in sides):
        here, hosts = platform.node(), hosts_of(baseline.environment)
        if hosts != [here]:
            ran = (f"ran on host {one_line(', '.join(hosts))}" if hosts
                   else "does not say which host it ran on")
            return (f"the baseline {ran} and this is host {one_line(here)}, so its recorded "
                    "times are no yardstick for times measured here: give --baseline-python "
                    "with the python that has the baseline's release, to measure both here")
    for side in sides:
        given = side.name == "baseline" or candidate_python_given
        who = (f"--{side.name}-python {one_line(side.python)}" if given else
               f"the gate's python {one_line(side.python)} (the candidate's unless "
               "--candidate-python names another)")
        fix = (f"give --{side.name}-python with the python that has the {side.name}'s release, "
               "e.g. .tox/ENV/bin/python")
        found = probe(side.python, side.results)
        if isinstance(found, str):
            return f"{who} cannot load the {side.name}'s backend: {found}; {fix}"
        difference = release_difference(side.results.environment, found)
        if difference:
            return (f"{who} has another release than the {side.name} ran ({difference}), and "
                    f"would measure that one; {fix}")
    return None


def probe_release(python: str, results: RunResults) -> dict | str:
    """The release keys ``python`` would record running ``results``' backend, or one line
    saying why it cannot tell (conformance/release_probe.py, run from the suite's root)."""
    backend, env_extra = rerun_backend(results)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(env_extra)
    try:
        proc = subprocess.run([python, "-m", "conformance.release_probe", backend],
                              cwd=SUITE_ROOT, env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return one_line(f"running it failed: {type(exc).__name__}")
    for line in proc.stdout.splitlines():
        if line.startswith(PROBE_MARKER):
            try:
                return json.loads(line[len(PROBE_MARKER):])
            except ValueError:
                break
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
