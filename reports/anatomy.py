"""Where compile time went: one stacked bar per case from ``Record.compile_breakdown`` (stage
to seconds, the remainder as ``other``), slowest first, and each stage's share of the whole.

The template draws each bar as coloured segments whose widths are percentages of the slowest
case's compile time, so bars compare across cases. Above ``MAX_ROWS`` cases with stages only
the slowest are drawn (the all-cases table keeps every breakdown as text).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from records.results import Record
from reports.formatting import breakdown_text

MAX_ROWS = 300
#: Segment colours in stage order; ``other`` is always grey.
PALETTE = ("#4285f4", "#34a853", "#fbbc05", "#ea4335", "#8e44ad", "#00acc1", "#f06292", "#8d6e63")
OTHER_COLOUR = "#bdbdbd"


@dataclass(frozen=True)
class Segment:
    css: str  # s0 ... s7, or so (other)
    width: float  # percent of the slowest case's compile time
    name: str
    seconds: float


@dataclass(frozen=True)
class AnatomyRow:
    case_id: str
    compile_seconds: float
    segments: list[Segment]
    text: str  # the breakdown as text, for the tooltip
    cache_hit: bool = False  # a cache served the compile: the stages are a warm compile's


@dataclass
class Anatomy:
    stages: list[tuple[str, str, str]] = field(default_factory=list)  # (name, css, colour)
    shares: list[tuple[str, float]] = field(default_factory=list)  # (stage, % of all seconds)
    rows: list[AnatomyRow] = field(default_factory=list)
    with_stages: int = 0  # cases that have a breakdown
    cache_hits: int = 0  # of them, those whose compile a cache served

    @property
    def css(self) -> str:
        return "".join(f".stk i.{css}{{background:{colour}}}" for _, css, colour in self.stages)


def build_anatomy(records: tuple[Record, ...] | list[Record]) -> Anatomy:
    staged = [r for r in records if r.compile_breakdown]
    anatomy = Anatomy(with_stages=len(staged),
                      cache_hits=sum(1 for r in staged if r.cache_hit is True))
    if not staged:
        return anatomy
    order: dict[str, None] = {}
    for record in staged:
        order.update(dict.fromkeys(k for k in record.compile_breakdown if k != "other"))
    css = {name: f"s{i % len(PALETTE)}" for i, name in enumerate(order)}
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(order)}
    css["other"], colours["other"] = "so", OTHER_COLOUR
    names = list(order) + ["other"]
    anatomy.stages = [(name, css[name], colours[name]) for name in names]
    totals = {name: sum(r.compile_breakdown.get(name, 0.0) for r in staged) for name in names}
    whole = sum(totals.values()) or 1.0
    anatomy.shares = [(name, 100.0 * totals[name] / whole) for name in names if totals[name]]
    slowest = sorted(staged, key=lambda r: -sum(r.compile_breakdown.values()))[:MAX_ROWS]
    scale = sum(slowest[0].compile_breakdown.values()) or 1.0
    for record in slowest:
        stages = record.compile_breakdown
        segments = [Segment(css[name], round(100.0 * stages[name] / scale, 2), name, stages[name])
                    for name in names if stages.get(name)]
        anatomy.rows.append(AnatomyRow(record.case_id, sum(stages.values()), segments,
                                       breakdown_text(stages, record.compiled_bytes),
                                       record.cache_hit is True))
    return anatomy
