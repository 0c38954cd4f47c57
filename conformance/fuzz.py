"""The fuzzing search: hypothesis draws cases from the grammar (conformance/fuzz_grammar.py),
each runs through ``execute`` (the worker's supervised Executor, so the same child, budgets,
golden and verdict as the matrix), and a case whose label is not acceptable (PASS or
UNSUPPORTED) is shrunk by hypothesis to a minimal case, which is saved as a case spec.

Repeatable: the same examples count, seed and code draw the same cases (``hypothesis.seed``,
no example database).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed

from cases.composed import composed
from cases.model import DTYPES, MODES, Case, Shape, file_stem
from conformance import fuzz_grammar
from records.errors import is_not_judged
from records.files import write_text_atomic
from records.results import Label, Record

FAILURES_DIR = "fuzz-failures"
#: The tiny case ``runnable`` asks the backend about, in each mode and dtype.
PROBE_SHAPE = Shape(1, 1, 1, 16, 16, 16)


@dataclass
class FuzzResult:
    examples_run: int = 0
    failure: Record | None = None  # the minimal failing case's record
    flaky: str = ""  # set when the failure did not repeat when replayed
    tried: list[Record] = field(default_factory=list)


class CaseFailed(Exception):
    def __init__(self, record: Record):
        super().__init__(f"[{record.label.value}] {record.case_id}")
        self.record = record


@dataclass(frozen=True)
class Runnable:
    """The modes and dtypes a backend runs, and why it does not run the others."""

    modes: tuple[str, ...]
    dtypes: tuple[str, ...]
    refused: dict[str, str]  # "mode/dtype" -> the backend's reason

    def refusals(self) -> list[str]:
        """One line per distinct reason: ``fwd+bwd/bf16, fwd+bwd/fp16: <reason>``."""
        by_reason: dict[str, list[str]] = {}
        for key, reason in self.refused.items():
            by_reason.setdefault(reason, []).append(key)
        return [f"{', '.join(keys)}: {reason}" for reason, keys in by_reason.items()]


def runnable(unsupported: Callable[[Case], str | None], modes: tuple[str, ...] = MODES,
             dtypes: tuple[str, ...] = DTYPES) -> Runnable:
    """Ask ``unsupported`` (the backend's unsupported_reason) about a tiny case of each mode and
    dtype, so the fuzzer draws only what the backend can run instead of spending examples on
    UNSUPPORTED. A mode (a dtype) is kept when some dtype (some mode) runs with it; a pair the
    backend refuses among those kept is drawn again, like a case it refuses for its shape."""
    refused = {}
    for mode in modes:
        for dtype in dtypes:
            reason = unsupported(Case(composed(), PROBE_SHAPE, dtype, mode))
            if reason:
                refused[f"{mode}/{dtype}"] = reason
    runs = [(m, d) for m in modes for d in dtypes if f"{m}/{d}" not in refused]
    return Runnable(tuple(m for m in modes if any(m == r for r, _ in runs)),
                    tuple(d for d in dtypes if any(d == r for _, r in runs)), refused)


def search(execute: Callable[[Case], Record], examples: int, seed: int,
           modes: tuple[str, ...] = ("fwd",),
           unsupported: Callable[[Case], str | None] = lambda case: None,
           dtypes: tuple[str, ...] = DTYPES,
           sources: Sequence[fuzz_grammar.VariantSource] = (),
           with_composed: bool = True) -> FuzzResult:
    """Run ``examples`` drawn cases (those ``unsupported`` names a reason for are drawn again);
    on the first failure, shrink it and return the minimal one in ``FuzzResult.failure``.
    ``sources`` and ``with_composed`` choose the variants (fuzz_grammar.cases)."""
    result = FuzzResult()
    first_failure: list[Label] = []  # the label a shrunk case must keep

    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              phases=(Phase.explicit, Phase.generate, Phase.shrink), print_blob=False,
              suppress_health_check=list(HealthCheck))
    @hypothesis_seed(seed)
    @given(case=fuzz_grammar.cases(modes, dtypes, sources, with_composed))
    def run_one(case: Case) -> None:
        if unsupported(case):
            reject()
        record = execute(case)
        result.tried.append(record)
        if record.label.acceptable or is_not_judged(record):  # a full disk: no finding (its
            return  # record says so, and the run's summary names it)
        first_failure[:] = first_failure or [record.label]
        # Shrinking keeps the label, as flexconf shrink does: a smaller case that fails
        # otherwise (a custom variant's mod that raises at a small shape) is not the failure
        if record.label is first_failure[0]:
            raise CaseFailed(record)

    try:
        run_one()
    except CaseFailed as failed:
        result.failure = failed.record
    except Exception as exc:  # noqa: BLE001 - hypothesis' Flaky: the failure did not repeat
        failures = [r for r in result.tried if first_failure and r.label is first_failure[0]]
        if not failures or _holds_a_stop(exc):  # a timeout or stop while shrinking: no flake
            raise
        result.failure = failures[-1]
        result.flaky = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    result.examples_run = len(result.tried)
    return result


def _holds_a_stop(exc: BaseException) -> bool:
    """Whether a BaseException that is no Exception (pytest-timeout's failure, a stop) is in
    ``exc``'s exception group: hypothesis reports one raised while it shrinks as a flaky
    failure (a review: a timeout there read as "the failure did not repeat")."""
    inner = getattr(exc, "exceptions", ())
    return any(not isinstance(e, Exception) or _holds_a_stop(e) for e in inner)


def save_failure(record: Record, report_dir: str | Path, backend: str, seed: int) -> Path:
    """Write the failing case as a case spec file that ``--case-file`` runs again; returns it."""
    directory = Path(report_dir) / FAILURES_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (file_stem(record.case_id) + ".json")
    spec = {"cases": [record.case],
            "fuzz": {"label": record.label.value, "message": record.message,
                     "backend": backend, "seed": seed}}
    return write_text_atomic(path, json.dumps(spec, indent=1) + "\n")

