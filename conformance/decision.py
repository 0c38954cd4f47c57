"""The label of a case from what was observed: the one decision function, called by the
executor (``conformance/executor.py``) and by a reproduction script (``repro_runtime``).

    Observation that decides by itself (error, timeout, crash, ...) ─▶ protocol.label_of
    ok, compile-only pass ─▶ COMPILED
    ok ─▶ the output file against the golden and baseline ─▶ reference.verdict.judge ─▶ PASS | MISMATCH
    the reference, the output file or the verdict failed ─▶ HARNESS_ERROR (the suite's fault)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cases.model import Case
from conformance.protocol import Observation, label_of, load_output
from records.labels import Label


@dataclass(frozen=True)
class Decision:
    label: Label
    message: str = ""
    metrics: dict[str, Any] | None = None
    observed: Any = None  # the backend's output as read back (a Reference), when judged


def decide(case: Case, obs: Observation, reference: tuple | BaseException | None) -> Decision:
    """``reference``: the (golden, baseline) pair, the exception computing it raised, or None
    in a compile-only pass (no reference is computed there)."""
    label = label_of(obs)
    if label is not None:
        return Decision(label, obs.message)
    if reference is None:
        return Decision(Label.COMPILED)
    if isinstance(reference, BaseException):  # the reference is ours: a harness fault
        return Decision(Label.HARNESS_ERROR,
                        f"the reference computation failed: {one_line(reference)}")
    golden, baseline = reference
    try:
        observed = load_output(obs.output_path)
    except Exception as exc:  # noqa: BLE001
        return Decision(Label.HARNESS_ERROR, f"cannot read the child's output: {one_line(exc)}")
    from reference.verdict import judge

    try:
        verdict = judge(case, golden, baseline, observed)
    except Exception as exc:  # noqa: BLE001
        return Decision(Label.HARNESS_ERROR, f"the verdict failed: {one_line(exc)}",
                        observed=observed)
    if verdict.passed:
        return Decision(Label.PASS, "", verdict.metrics, observed)
    return Decision(Label.MISMATCH, verdict.summary, verdict.metrics, observed)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
