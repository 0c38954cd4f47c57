"""What the supervised child reported for one case, and the label it implies.

The child (or, when the child hung or died, the watchdog) produces an ``Observation``; the
executor turns it into a ``Record``. Only an observation with outcome ``ok`` needs the verdict
(PASS or MISMATCH); every other outcome decides the label by itself (``label_of``).
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.results import Label

#: outcome values: ok, error, timeout, exec-timeout (the device runtime's own), crash, oom,
#: unsupported, harness
#: phase values: start (child imports), warm-up (the backend's one-time compiler start-up),
#: setup (inputs, mods, block mask, prepare), compile (first call), run (timed calls, saving)
PHASES = ("start", "warm-up", "setup", "compile", "run")


@dataclass(frozen=True)
class Observation:
    outcome: str
    phase: str
    message: str = ""  # first line: what happened; further lines: detail (traceback, log tail)
    setup_seconds: float | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None
    cache_hit: bool | None = None
    compile_breakdown: dict[str, float] | None = None
    output_path: str | None = None  # the output tensor, saved by the child (outcome ok)


def label_of(obs: Observation) -> Label | None:
    """The label an observation decides by itself; None for ``ok`` (the verdict decides)."""
    if obs.outcome == "ok":
        return None
    if obs.outcome == "timeout":
        if obs.phase in ("compile", "warm-up"):
            return Label.COMPILE_TIMEOUT
        return Label.RUN_TIMEOUT if obs.phase in ("setup", "run") else Label.HARNESS_ERROR
    if obs.outcome == "error":
        if obs.phase == "compile":
            return Label.COMPILE_ERROR
        return Label.RUNTIME_ERROR if obs.phase in ("setup", "run") else Label.HARNESS_ERROR
    fixed = {"exec-timeout": Label.RUN_TIMEOUT, "crash": Label.CRASH, "oom": Label.OUT_OF_MEMORY,
             "unsupported": Label.UNSUPPORTED, "harness": Label.HARNESS_ERROR}
    try:
        return fixed[obs.outcome]
    except KeyError:
        raise ValueError(f"unknown observation outcome {obs.outcome!r}") from None
