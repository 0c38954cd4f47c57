"""The gate's time findings (COMPILE_TIME, RUN_TIME): the rule that flags them, the compile
stage that grew most, and what measuring the flagged cases again found (``--confirm``).

A time finding is flagged from one measurement per run. Measured again, it is
  - ``confirmed`` when the candidate's repeated median still grew past the rule against the
    baseline's repeated median (or, when the baseline has no repeated figure, its recorded
    one): it blocks;
  - ``dismissed`` (as noise) when it did not, against the baseline's repeated median, and
    every candidate rerun gave a figure, and the figures can tell: each side's reruns (two
    or more) lie within what the rule lets a time grow between releases (max - min <=
    max((factor - 1) * median, slack)), or even the candidate's slowest rerun did not grow
    past the rule against the baseline's fastest, or the candidate's median is not above
    the baseline's at all (the growth did not reproduce; a regression that load hid that
    well is dismissed too): it does not block. Never against a recorded figure (a baseline
    run slowed by load would hide a real slowdown), nor when a candidate rerun gave none (a
    COMPILE_TIMEOUT is slower than any figure);
  - ``inconclusive`` when the medians did not confirm it but could not dismiss it either: the
    reruns spread wider than the rule can resolve, and the candidate's median is above the
    baseline's (a loaded machine: torch 2.15.0's real x1.4 compile regressions, measured
    again under load at 5.8-11.1 s against 7.4-8.8 s, had medians x1.13-x1.25 and were
    dismissed; docs/results/README.md): it still blocks;
  - ``unmeasured`` otherwise, when the figures do not confirm it: it still blocks, since
    nothing disproved it;
  - ``unconfirmed`` when not measured again (``--confirm 0``; ``auto`` without a fitting
    python for each release, reports/confirm_plan.py; or left out by ``--confirm-max-cases``):
    it blocks on its one measurement.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from reports.compare import grew
from reports.formatting import precise_seconds

KINDS = {"compile": "COMPILE_TIME", "run": "RUN_TIME"}
STATUSES = ("confirmed", "dismissed", "inconclusive", "unmeasured", "unconfirmed")


@dataclass(frozen=True)
class TimeRule:
    """A time may grow to less than ``factor`` times the baseline's, or by ``slack_seconds``
    at most."""

    measure: str  # compile | run (reports.compare.MEASURES)
    factor: float
    slack_seconds: float

    @property
    def kind(self) -> str:
        return KINDS[self.measure]

    def grew(self, before: float, after: float) -> bool:
        return grew(before, after, self.factor, self.slack_seconds)

    def verdict(self, before: float, after: float) -> str:
        """``x1.30 >= x1.25`` or ``x1.02 < x1.25`` (with the slack when it decided)."""
        ratio = after / before if before > 0 else float("inf")
        shown = f"{ratio:.2f}"
        if shown == f"{self.factor:.2f}" and ratio != self.factor:
            shown = f"{ratio:.4f}"  # not "x1.25 < x1.25"
        if self.grew(before, after):
            return f"x{shown} >= x{self.factor:g}"
        if ratio >= self.factor:
            return (f"x{shown}, but +{_seconds(after - before)} s <= "
                    f"{self.slack_seconds:g} s slack")
        return f"x{shown} < x{self.factor:g}"

    def resolves(self, figures: "Figures") -> bool:
        """Whether one side's reruns agree among themselves within what the rule lets a time
        grow between releases: ``max - min <= max((factor - 1) * median, slack)`` (a time
        grew when past both, so either one is allowed). Wider, they cannot tell a
        regression of the rule's size from the machine's noise; one figure shows no spread
        at all, so it resolves nothing."""
        if len(figures.seconds) < 2:
            return False
        spread = max(figures.seconds) - min(figures.seconds)
        return spread <= max((self.factor - 1) * figures.median, self.slack_seconds)


@dataclass(frozen=True)
class StageGrowth:
    """The compile stage whose seconds grew most from the baseline to the candidate."""

    stage: str
    before: float
    after: float

    @property
    def text(self) -> str:
        return (f"stage that grew most: {self.stage} {_seconds(self.before)} s -> "
                f"{_seconds(self.after)} s")


def stage_growth(before: dict[str, float] | None,
                 after: dict[str, float] | None) -> StageGrowth | None:
    """The stage of two compile breakdowns (stage -> seconds; a stage one side lacks counts
    as 0 there) that grew most; None unless both have a breakdown and some stage grew."""
    if not before or not after:
        return None
    stages = list(dict.fromkeys([*after, *before]))
    stage = max(stages, key=lambda s: after.get(s, 0.0) - before.get(s, 0.0))
    growth = StageGrowth(stage, before.get(stage, 0.0), after.get(stage, 0.0))
    return growth if growth.after > growth.before else None


@dataclass(frozen=True)
class Figures:
    """One side's repeated measurements of one case: the figures the reruns gave, and why
    the others gave none."""

    python: str
    seconds: tuple[float, ...]
    failures: tuple[str, ...] = ()
    #: the median seconds of each compile stage over the reruns that reported stages
    breakdown: dict[str, float] | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def text(self) -> str:
        """``median 0.61 s (0.55-0.66 over 3)``; ``no figure (CRASH)`` when none."""
        if not self.seconds:
            return f"no figure ({'; '.join(self.failures) or 'no rerun'})"
        spread = f"{_seconds(min(self.seconds))}-{_seconds(max(self.seconds))}"
        missed = f", {len(self.failures)} without a figure" if self.failures else ""
        return (f"median {_seconds(self.median)} s ({spread} over "
                f"{len(self.seconds)}{missed})")

    def to_json(self) -> dict:
        return {"python": self.python, "seconds": list(self.seconds), "median": self.median,
                "min": min(self.seconds, default=None), "max": max(self.seconds, default=None),
                "failures": list(self.failures), "breakdown": self.breakdown}


@dataclass(frozen=True)
class Confirmation:
    """What measuring a flagged case again found (see the module's docstring)."""

    status: str  # one of STATUSES
    rule: TimeRule
    repeats: int = 0
    candidate: Figures | None = None
    baseline: Figures | None = None  # None: the baseline was not measured again
    recorded_baseline: float | None = None  # the baseline run's figure
    stage: StageGrowth | None = None  # from the repeated breakdowns, when both sides have them

    @property
    def blocking(self) -> bool:
        return self.status != "dismissed"

    @property
    def compared_baseline(self) -> float | None:
        """What the candidate's median was held against: the baseline's repeated median,
        else its recorded figure."""
        repeated = self.baseline.median if self.baseline is not None else None
        return repeated if repeated is not None else self.recorded_baseline

    @property
    def text(self) -> str:
        """One line: the status and the figures it rests on."""
        if self.status == "unconfirmed":
            return "unconfirmed: measured once per run"
        if self.status == "inconclusive":
            head = f"inconclusive, still blocking ({self._noise_reason})"
        elif self.status == "unmeasured":
            head = "not confirmed, still blocking: " + self._unmeasured_reason
        else:
            head = {"confirmed": "confirmed", "dismissed": "dismissed as noise"}[self.status]
        parts = [f"candidate {self.candidate.text}" if self.candidate else ""]
        if self.baseline is not None:
            parts.append(f"baseline {self.baseline.text}")
        if self.baseline is None or self.baseline.median is None:
            parts.append(f"baseline as recorded {_seconds(self.recorded_baseline)} s")
        line = f"{head}, measured again x{self.repeats}: " + ", ".join(p for p in parts if p)
        after, before = self.candidate.median if self.candidate else None, self.compared_baseline
        if after is not None and before is not None:
            line += f": {self.rule.verdict(before, after)}"
        if self.stage is not None and self.status == "confirmed":  # what grew, when it did
            line += f"; {self.stage.text}"
        return line

    @property
    def _noise_reason(self) -> str:
        if min(len(f.seconds) for f in (self.candidate, self.baseline) if f is not None) < 2:
            return ("one rerun a side shows nothing of the machine's noise: measure again "
                    "with --confirm 3 or more")
        wide = [side for side, figures in (("candidate", self.candidate),
                                            ("baseline", self.baseline))
                if figures is not None and not self.rule.resolves(figures)]
        sides = " and the ".join(f"{side}'s" for side in wide)
        return (f"the {sides} reruns spread wider than the rule can resolve, "
                f"x{self.rule.factor:g} and "
                f"{self.rule.slack_seconds:g} s: measure again on a quieter machine")

    @property
    def _unmeasured_reason(self) -> str:
        if not (self.candidate and self.candidate.seconds):
            return "the reruns gave no figure"
        if self.candidate.failures:
            return (f"{len(self.candidate.failures)} of the candidate's reruns gave no figure "
                    f"({'; '.join(self.candidate.failures)})")
        if self.baseline is None:
            return "the baseline was not measured again"
        return "the reruns gave the baseline no figure"

    def to_json(self) -> dict:
        after = self.candidate.median if self.candidate else None
        before = self.compared_baseline
        return {"status": self.status, "measure": self.rule.measure,
                "factor": self.rule.factor, "slack_seconds": self.rule.slack_seconds,
                "repeats": self.repeats,
                "candidate": self.candidate.to_json() if self.candidate else None,
                "baseline": self.baseline.to_json() if self.baseline else None,
                "recorded_baseline_seconds": self.recorded_baseline,
                "compared": {"baseline_seconds": before, "candidate_seconds": after,
                             "ratio": after / before if after is not None and before else None},
                "stage_grew_most": stage_json(self.stage)}


def judge(rule: TimeRule, repeats: int, recorded_baseline: float, candidate: Figures,
          baseline: Figures | None) -> Confirmation:
    """Confirmed or dismissed on the repeated medians (see the module doc); inconclusive when
    they would dismiss it but spread too wide to tell; unmeasured when a side has no
    figure."""
    confirmation = Confirmation("unmeasured", rule, repeats, candidate, baseline,
                                recorded_baseline,
                                stage_growth(baseline.breakdown if baseline else None,
                                             candidate.breakdown))
    after, before = candidate.median, confirmation.compared_baseline
    if after is None or before is None:
        return confirmation
    if rule.grew(before, after):
        status = "confirmed"
    elif baseline is not None and baseline.median is not None and not candidate.failures:
        resolved = rule.resolves(candidate) and rule.resolves(baseline)
        separated = (min(len(candidate.seconds), len(baseline.seconds)) > 1
                     and not rule.grew(min(baseline.seconds), max(candidate.seconds)))
        status = "dismissed" if resolved or separated or after <= before else "inconclusive"
    else:  # a recorded baseline figure may itself be slow, and a candidate rerun without a
        return confirmation  # figure (a timeout) may be the slowdown: neither clears it
    return Confirmation(status, rule, repeats, candidate, baseline, recorded_baseline,
                        confirmation.stage)


def stage_json(stage: StageGrowth | None) -> dict | None:
    if stage is None:
        return None
    return {"stage": stage.stage, "old_seconds": stage.before, "new_seconds": stage.after}


def _seconds(value: float | None) -> str:
    """Seconds with the digits the figure needs (0.0140, not 0.01: a sub-second run time's
    figures must support the ratio printed beside them); ``-`` when unknown."""
    return "-" if value is None else precise_seconds(value)
