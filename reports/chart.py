"""Compile time per case as the geometry of an inline SVG bar chart (the template draws it).

One bar per case, in case order, coloured by label; a compile that a cache served (the
record's ``cache_hit``) is drawn pale and says so, as it is not a cold compile. A case that ran
out of compile time
without a measured figure is drawn up to the compile timeout. The scale is logarithmic when
the times span two orders of magnitude or more. Above ``MAX_BARS_WITH_TOOLTIPS`` cases the bars
become one path per label (no tooltip per bar) to keep the report small.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from reports.formatting import fmt_seconds
from reports.matrix import coordinates
from records.results import Label, Record

WIDTH, HEIGHT = 1200, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 14, 34
MAX_BARS_WITH_TOOLTIPS = 2000
LOG_SCALE_SPAN = 100.0


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    title: str
    cache_hit: bool = False


@dataclass
class CompileChart:
    width: int = WIDTH
    height: int = HEIGHT
    log_scale: bool = False
    bars: list[Bar] = field(default_factory=list)
    paths: dict[str, tuple[str, float]] = field(default_factory=dict)  # label -> (d, stroke)
    ticks: list[tuple[float, str]] = field(default_factory=list)  # (y, text)
    groups: list[tuple[float, str, bool]] = field(default_factory=list)  # (x, name, labelled)
    timeout_y: float | None = None
    timeout_text: str = ""
    plot_bottom: float = HEIGHT - BOTTOM
    plotted: int = 0
    not_plotted: int = 0
    cache_hits: int = 0  # plotted cases whose compile a cache served


def _value(record: Record, compile_timeout: float | None) -> tuple[float | None, str]:
    if record.compile_seconds is not None and record.compile_seconds > 0:
        return record.compile_seconds, f"{fmt_seconds(record.compile_seconds)} s"
    if record.label is Label.COMPILE_TIMEOUT and compile_timeout:
        return float(compile_timeout), f"over {fmt_seconds(compile_timeout)} s (timed out)"
    return None, ""


def _nice_step(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value``."""
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def compile_chart(records: tuple[Record, ...] | list[Record],
                  compile_timeout: float | None = None) -> CompileChart:
    chart = CompileChart()
    values = [_value(r, compile_timeout) for r in records]
    positive = [v for v, _ in values if v is not None]
    chart.plotted, chart.not_plotted = len(positive), len(values) - len(positive)
    if not positive:
        return chart
    vmin, vmax = min(positive), max(positive)
    show_timeout = bool(compile_timeout) and compile_timeout <= 2 * vmax
    if show_timeout:
        vmax = max(vmax, float(compile_timeout))
    chart.log_scale = vmax / vmin >= LOG_SCALE_SPAN
    bottom, plot_h = HEIGHT - BOTTOM, HEIGHT - BOTTOM - TOP
    if chart.log_scale:
        lo, hi = math.floor(math.log10(vmin)), math.ceil(math.log10(vmax))
        hi = hi if hi > lo else lo + 1

        def y_of(v: float) -> float:
            return bottom - plot_h * (math.log10(v) - lo) / (hi - lo)
        chart.ticks = [(y_of(10.0 ** e), f"{10.0 ** e:g} s") for e in range(lo, hi + 1)]
    else:
        step = _nice_step(vmax / 4)
        top = step * math.ceil(vmax / step)

        def y_of(v: float) -> float:
            return bottom - plot_h * v / top
        chart.ticks = [(y_of(step * i), f"{step * i:g} s")
                       for i in range(round(top / step) + 1)]
    if show_timeout:
        chart.timeout_y = round(y_of(float(compile_timeout)), 1)
        chart.timeout_text = f"compile timeout {fmt_seconds(compile_timeout)} s"
    step = (WIDTH - LEFT - RIGHT) / len(records)
    with_tooltips = len(records) <= MAX_BARS_WITH_TOOLTIPS
    segments: dict[str, list[str]] = {}
    last_group = None
    for i, (record, (value, text)) in enumerate(zip(records, values)):
        x = LEFT + i * step
        where = coordinates(record)
        group = where.variant if where else record.case_id.split("/", 1)[0]
        if group != last_group:
            chart.groups.append((round(x, 1), group, True))
            last_group = group
        if value is None:
            continue
        y = round(min(y_of(value), bottom - 1), 1)
        hit = record.cache_hit is True
        chart.cache_hits += hit
        if with_tooltips:
            chart.bars.append(Bar(round(x, 1), y, round(max(step * 0.8, 0.5), 2),
                                  round(bottom - y, 1), record.label.value,
                                  f"{record.case_id}: {text} ({record.label.value}"
                                  f"{', cache hit: not a cold compile' if hit else ''})", hit))
        else:
            segments.setdefault(record.label.value, []).append(
                f"M{x + step / 2:.1f} {bottom}V{y}")
    stroke = round(max(step * 0.8, 0.3), 2)
    chart.paths = {label: ("".join(segs), stroke) for label, segs in segments.items()}
    chart.ticks = [(round(y, 1), text) for y, text in chart.ticks]
    chart.plot_bottom = bottom
    edges = [x for x, _, _ in chart.groups] + [WIDTH - RIGHT]
    chart.groups = [(x, name, edges[i + 1] - x >= 8 * len(name) * 0.6)
                    for i, (x, name, _) in enumerate(chart.groups)]
    return chart
