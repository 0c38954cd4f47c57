"""The closed set of outcomes of a case, declared once.

Each label's row says what it means, whether a run that contains it may still conform (the dEQP
rule: PASS and UNSUPPORTED), how pytest shows it, and the short code and colours the report
uses. Everything else (the schema's enum, the report's legend and CSS, docs/labels.md's table
test) derives from this table; a label added here is known everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class LabelInfo:
    meaning: str  # one line, shown in the report's legend
    conforms: bool  # may a conforming run contain it
    short: str  # the report grid's code
    cell_colour: str  # the report's table cell background
    bar_colour: str  # the compile-time chart's bar
    text_colour: str = "#000"
    #: whether a record's compile_seconds measures a finished compile (compare, gate)
    compile_finished: bool = True


class Label(str, Enum):
    """The closed set of outcomes of a case (docs/labels.md says when each is given)."""

    # name = name, LabelInfo(meaning, conforms, short code, cell colour, bar colour, ...)
    PASS = "PASS", LabelInfo(
        "output agrees with the float64 reference within the tolerance",
        True, "P", "#b7e4c0", "#34a853")
    MISMATCH = "MISMATCH", LabelInfo(
        "ran, but the numbers are wrong",
        False, "MM", "#f28b82", "#d93025")
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT", LabelInfo(
        "compilation ran past the time allowed",
        False, "CT", "#fbbc58", "#f29900", compile_finished=False)
    RUN_TIMEOUT = "RUN_TIMEOUT", LabelInfo(
        "compiled, but running ran past the time allowed",
        False, "RT", "#fdd39a", "#e37400")
    COMPILE_ERROR = "COMPILE_ERROR", LabelInfo(
        "compilation raised an error",
        False, "CE", "#c6a4e8", "#8e44ad", compile_finished=False)
    RUNTIME_ERROR = "RUNTIME_ERROR", LabelInfo(
        "running raised an error",
        False, "RE", "#f4a6d7", "#c2185b")
    CRASH = "CRASH", LabelInfo(
        "the process running the case died",
        False, "CR", "#7a1f1f", "#5a1010", text_colour="#fff", compile_finished=False)
    OUT_OF_MEMORY = "OUT_OF_MEMORY", LabelInfo(
        "ran out of device or host memory",
        False, "OOM", "#c89f7a", "#8d6e63")
    UNSUPPORTED = "UNSUPPORTED", LabelInfo(
        "the backend does not support this case (acceptable)",
        True, "U", "#d5d5d8", "#9aa0a6", compile_finished=False)
    HARNESS_ERROR = "HARNESS_ERROR", LabelInfo(
        "the suite's own fault, not the backend's",
        False, "HE", "#9db7d6", "#4a78b0", compile_finished=False)
    #: only in a compile-only pass (--phase compile): the first call finished; no verdict
    COMPILED = "COMPILED", LabelInfo(
        "compile-only pass (--phase compile): compiled, numbers not judged",
        False, "C", "#cfe3f7", "#7fa7d1")

    def __new__(cls, value: str, info: LabelInfo):
        member = str.__new__(cls, value)
        member._value_ = value
        member.info = info
        return member

    @property
    def acceptable(self) -> bool:
        """Whether a conforming run may contain this label (dEQP rule: PASS, UNSUPPORTED)."""
        return self.info.conforms

    @property
    def compile_finished(self) -> bool:
        return self.info.compile_finished

    @property
    def short(self) -> str:
        return self.info.short

    @property
    def meaning(self) -> str:
        return self.info.meaning


def label_names() -> list[str]:
    """Every label's name, in the table's order (the schema's enum)."""
    return [label.value for label in Label]
