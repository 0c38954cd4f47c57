"""Render a run (or several) to ``<dir>/index.html`` and ``<dir>/summary.md``.

The HTML comes from ``templates/index.html.j2`` through Jinja2 with autoescaping on, so every
text from a results file (compiler messages, case ids, environment values) shows as text.
The page is one self-contained file: inline CSS, inline SVG, a little inline script for
sorting and filtering; nothing is fetched.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import jinja2

from reports.anatomy import build_anatomy
from reports.chart import compile_chart
from reports.performance import (DENSE_THRESHOLD, case_performance,
                                 variant_performance)
from reports.compare import Comparison, compare_runs, side_by_side
from reports.formatting import (breakdown_text, environment_facts, fmt_seconds, metric_text,
                                metrics_items, REPORT_TITLE, run_title, truncate)
from reports.matrix import build_matrix, seq_text
from reports.merge_facts import duplicates_note
from records.files import write_text_atomic
from records.results import Label, Record, RunResults
from reports.summary import (comparison_line, conforms, known_text, label_counts,
                             non_passing, rerun_command, summary_markdown, verdict_line,
                             with_expectations)
from reports.summary import failing as failing_records

TEMPLATES = Path(__file__).with_name("templates")
#: index.html's generator tag, which tells a report of this suite from a page of the user's own.
REPORT_GENERATOR = "flexattention-conformance"
#: A message longer than this is cut in the report (results.json keeps all of it).
MESSAGE_LIMIT = 4000
#: Cases that compile faster are listed up to this many (most improved first).
MAX_FASTER_ROWS = 100

#: What Record.artifacts may be for the report to link it: a directory the suite named
#: (conformance/artifacts.py), never a URL a doctored results file slipped in.
_ARTIFACTS_LINK = re.compile(r"artifacts/[A-Za-z0-9._+=-]+")


@dataclass(frozen=True)
class FailureView:
    record: Record
    metrics: list[tuple[str, str]]
    message: str
    message_cut: bool
    rerun: str
    artifacts_href: str | None = None  # the case's compile artefacts, relative to the report


@dataclass(frozen=True)
class RunView:
    name: str
    results: RunResults
    verdict: str
    conforms: bool


@functools.lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True)
    env.globals.update(fmt_seconds=fmt_seconds, metric_text=metric_text,
                       breakdown_text=breakdown_text, known_text=known_text,
                       seq_text=seq_text, codes={label.value: label.short for label in Label},
                       label_css=label_css())
    return env.get_template("index.html.j2")


@dataclass(frozen=True)
class PerformanceView:
    cases: list
    variants: list
    dense: list
    threshold: float


def _performance_view(records) -> PerformanceView | None:
    rows = case_performance(records)
    if not rows:
        return None
    return PerformanceView(rows, variant_performance(rows), [r for r in rows if r.dense],
                           DENSE_THRESHOLD)


def label_css() -> str:
    """The report's label colours, from the label table (records/labels.py)."""
    cells = "".join(f".l-{label.value}{{background:{label.info.cell_colour};"
                    f"color:{label.info.text_colour}}}" for label in Label)
    bars = "".join(f"svg .b-{label.value}{{fill:{label.info.bar_colour};"
                   f"stroke:{label.info.bar_colour}}}" for label in Label)
    return cells + "\n" + bars


def _environment_rows(runs: Sequence[RunView]) -> list[tuple[str, list[str], bool]]:
    facts = [environment_facts(run.results) for run in runs]
    keys: dict[str, None] = {}
    for f in facts:
        keys.update(dict.fromkeys(f))
    rows = []
    for key in keys:
        values = [f.get(key, "") for f in facts]
        rows.append((key, values, len(set(values)) > 1))
    return rows


def render_html(runs: Sequence[RunView], baseline: RunView | None = None,
                comparison: Comparison | None = None, order_note: str = "") -> str:
    """The HTML text of the report of ``runs[-1]`` (with ``runs`` side by side if several)."""
    main = runs[-1].results
    failing = non_passing(main)
    failures = []
    for rec in failing:
        message, cut = truncate(rec.message, MESSAGE_LIMIT)
        link = rec.artifacts if rec.artifacts and _ARTIFACTS_LINK.fullmatch(rec.artifacts) else None
        failures.append(FailureView(rec, metrics_items(rec.metrics), message, cut,
                                    rerun_command(main, rec.case_id), link))
    rows = side_by_side([r.results for r in runs]) if len(runs) > 1 else []
    return _template().render(
        title=run_title(main), generator=REPORT_GENERATOR, runs=runs, main=runs[-1], baseline=baseline,
        order_note=order_note, merge_note=duplicates_note(main),
        comparison=comparison,
        comparison_line=comparison_line(comparison) if comparison else "",
        environment_rows=_environment_rows(([baseline] if baseline else []) + list(runs)),
        environment_names=[r.name for r in ([baseline] if baseline else []) + list(runs)],
        matrix=build_matrix(main.records),
        chart=compile_chart(main.records, main.options.get("compile_timeout")),
        anatomy=build_anatomy(main.records),
        performance=_performance_view(main.records),
        failures=failures, failing_ids={r.case_id for r in failing},
        failing_count=len(failing_records(main)),
        with_expectations=with_expectations(main),
        records=main.records,
        counts={k.value: v for k, v in label_counts(main.records).items()},
        labels=[(label.value, label.short, label.meaning) for label in Label],
        side_rows=rows, disagreements=[row for row in rows if not row.agree],
        max_faster_rows=MAX_FASTER_ROWS,
    )


def _run_view(results: RunResults, name: str) -> RunView:
    return RunView(name, results, verdict_line(results), conforms(results))


def write_report(results: RunResults, out_dir: str | Path,
                 baseline: RunResults | None = None) -> None:
    """Write ``index.html`` and ``summary.md`` of one run into ``out_dir`` (created)."""
    write_runs_report([results], out_dir, baseline=baseline)


def write_runs_report(runs: Sequence[RunResults], out_dir: str | Path,
                      names: Sequence[str] | None = None,
                      baseline: RunResults | None = None,
                      baseline_name: str = "baseline") -> None:
    """Write the report of ``runs[-1]`` with all ``runs`` side by side.

    The comparison is against ``baseline`` when given, else against ``runs[-2]`` when there
    are several runs (for example consecutive SDK releases, oldest first).
    """
    if not runs:
        raise ValueError("no runs to report; pass at least one results.json")
    names = list(names) if names else (
        ["run"] if len(runs) == 1 else [f"run {i + 1}" for i in range(len(runs))])
    if len(names) != len(runs):
        raise ValueError(f"{len(names)} names for {len(runs)} runs; give one name per run")
    views = [_run_view(r, n) for r, n in zip(runs, names)]
    base_view = _run_view(baseline, baseline_name) if baseline is not None else None
    against = base_view or (views[-2] if len(views) > 1 else None)
    comparison = compare_runs(against.results, runs[-1]) if against is not None else None
    html = render_html(views, base_view, comparison,
                       _order_note(runs, names, compared=baseline is None))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "index.html", html)
    _write_atomic(out / "summary.md", summary_markdown(
        runs[-1], comparison, against.name if against else "the baseline"))


def _order_note(runs: Sequence[RunResults], names: Sequence[str], compared: bool) -> str:
    """With several runs: which one the report's sections describe (the last), and a warning
    when runs of one backend compared with each other (``compared``: no --baseline) were not
    given in the order they started (the comparison then reads a regression as a fix). Runs
    of two backends have no order."""
    if len(runs) < 2:
        return ""
    note = f"The sections below describe the last run given, {names[-1]}"
    started = [r.started_at for r in runs]
    one_backend = len({r.options.get("backend") for r in runs}) == 1
    if compared and one_backend and all(started) and started != sorted(started):
        note += (f"; the runs were not given oldest first (by started_at: "
                 f"{', '.join(n for _, n in sorted(zip(started, names)))}), so the comparison "
                 "reads each change backwards: give them oldest first")
    return note + "."


def foreign_report_file(out_dir: str | Path) -> Path | None:
    """The first of ``out_dir``'s index.html and summary.md that no report of this suite
    wrote (a page of the user's own, which a report written there would replace), or None.
    A report is known by its generator tag, or, from before the tag, by its title."""
    out = Path(out_dir)
    marks = {"index.html": (f'<meta name="generator" content="{REPORT_GENERATOR}">',
                            f"<title>{REPORT_TITLE}"),
             "summary.md": (f"## {REPORT_TITLE}",)}
    for name, known_by in marks.items():
        path = out / name
        if not path.exists() and not path.is_symlink():
            continue
        try:
            with open(path, "rb") as f:
                head = f.read(4096).decode("utf-8", errors="replace")
        except OSError:
            return path
        if not any(mark in head for mark in known_by):
            return path
    return None


def _write_atomic(path: Path, text: str) -> None:
    # records are clean text (records/text.py); backslashreplace is the last line of defence
    write_text_atomic(path, text, errors="backslashreplace")
