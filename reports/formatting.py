"""How numbers, metrics and environment values are written, in one place (HTML, markdown
and the gate's terminal table all call these)."""
from __future__ import annotations

import json
import math
from typing import Any

from records.results import RunResults, is_fuzzed
from records.text import one_line

#: The verdict's metrics, in the order a reader wants them; other keys follow, sorted.
METRIC_ORDER = (
    ("error_ratio", "error ratio"),
    ("max_abs_err", "max abs err"),
    ("mean_abs_err", "mean abs err"),
    ("baseline_mean_abs_err", "baseline mean abs err"),
    ("global_margin", "global margin"),
    ("worst_row_ratio", "worst row ratio"),
    ("worst_row_margin", "worst row margin"),
    ("worst_place", "worst row at"),
    ("failing_rows", "failing rows"),
    ("worst_head_ratio", "worst head ratio"),
    ("worst_head_margin", "worst head margin"),
    ("worst_head", "worst head"),
    ("max_err_place", "max err at"),
    ("nan_count", "NaN"),
    ("inf_count", "Inf"),
    ("failed_rules", "failed rules"),
)

#: Environment and option keys shown first, in this order; the rest follow sorted.
ENVIRONMENT_ORDER = (
    "backend", "device", "torch", "torch_neuronx", "neuronx_cc", "neuron_sdk", "device_check",
    "cuda", "triton", "compiler", "python", "host", "platform", "profile", "phase",
    "compile_timeout", "run_timeout", "compile_cache", "seed", "suite_version", "git_revision",
)


def breakdown_text(stages: dict[str, float] | None, compiled_bytes: int | None = None) -> str:
    """``neuronx-cc 41.2 · stablehlo_lowering 3.10 · other 0.52`` (seconds, largest stage
    first, the remainder last), then ``· made 1.4 MiB`` when the backend said how large its
    compiled code is; empty when the compiler reported neither."""
    parts = []
    if stages:
        named = sorted((k for k in stages if k != "other"), key=lambda k: -stages[k])
        order = named + (["other"] if "other" in stages else [])
        parts = [f"{name} {fmt_seconds(stages[name])}" for name in order]
    if compiled_bytes is not None:
        parts.append(f"made {fmt_bytes(compiled_bytes)}")
    return " · ".join(parts)


def fmt_bytes(size: int) -> str:
    """``812 B``, ``3.4 KiB``, ``1.4 MiB``, ``2.1 GiB``."""
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


def fmt_seconds(seconds: float | None) -> str:
    """``4.21`` style seconds; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds >= 100:
        return f"{seconds:.0f}"
    if seconds >= 10:
        return f"{seconds:.1f}"
    return f"{seconds:.2f}"


def fmt_value(value: Any) -> str:
    """Any JSON value as short text: numbers with 3 significant digits, lists joined."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v) for v in value) or "-"
    if isinstance(value, dict):
        if value and all(len(k) <= 2 and isinstance(v, int) for k, v in value.items()):
            return " ".join(f"{k}{v}" for k, v in value.items())  # a place: b0 h3 q1021
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def metrics_items(metrics: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(name, text) pairs of a record's metrics, known keys first."""
    if not metrics:
        return []
    known = dict(METRIC_ORDER)
    items = [(name, fmt_value(metrics[key])) for key, name in METRIC_ORDER if key in metrics]
    items += [(key, fmt_value(metrics[key])) for key in sorted(metrics) if key not in known]
    return items


def metric_text(metrics: dict[str, Any] | None, key: str) -> str:
    if not metrics or key not in metrics:
        return ""
    return fmt_value(metrics[key])


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters, and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit], True


def environment_facts(results: RunResults) -> dict[str, str]:
    """Everything that describes where and how a run ran, as key -> text, in display order."""
    facts: dict[str, Any] = {}
    facts.update(results.environment)
    facts.update(results.options)
    facts["suite_version"] = results.suite_version
    if results.started_at:
        facts["started_at"] = results.started_at
    if results.finished_at:
        facts["finished_at"] = results.finished_at
    facts["complete"] = results.complete
    ordered = [k for k in ENVIRONMENT_ORDER if k in facts]
    ordered += sorted(k for k in facts if k not in ENVIRONMENT_ORDER)
    return {k: _fmt_fact(k, facts[k]) for k in ordered}


def _fmt_fact(key: str, value: Any) -> str:
    """Sizes in bytes (keys ending in bytes, budget or size) also in GiB."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 \
            and key.endswith(("bytes", "budget", "size")):
        return f"{value / (1 << 30):.1f} GiB ({value})"
    return fmt_value(value)


#: The first words of every report's title, in index.html and summary.md alike.
REPORT_TITLE = "FlexAttention conformance"


def run_title(results: RunResults) -> str:
    """``FlexAttention conformance: neuron · full``, with what narrowed the run where
    something did, so a part never reads as the whole: ``cpu-eager · smoke · -k 'causal' ·
    shard 1/2 · 8 cases`` (a case file replaces the profile and matrix); a fuzzing run says
    so, and a run of fuzzed variants alone names no profile: ``cpu-eager · fuzzing (50
    examples, seed 1)``."""
    from records.selection import selection_of

    options = results.options
    selection = selection_of(results)
    parts = [str(options.get("backend", "?"))]
    fuzzed = options.get("fuzz_examples")
    # not where -k, the test path or a later --shard part left the fuzzing test out (an
    # outside audit: "with fuzzing" on a run that fuzzed nothing)
    fuzzed_any = any(is_fuzzed(r.case_id) for r in results.records) or selection.case_ids == ()
    fuzzing = (f"fuzzing ({fuzzed} examples, seed {options.get('seed', '?')})"
               if isinstance(fuzzed, int) and fuzzed > 0 and fuzzed_any else "")
    if fuzzing and selection.case_ids is not None and not selection.case_ids:
        return one_line(f"{REPORT_TITLE}: " + " · ".join(parts + [fuzzing]))  # no matrix case
    if selection.case_file:
        parts.append(f"case file {selection.case_file}")
    else:
        parts.append(str(selection.profile or "?"))
        if selection.matrix not in (None, "core"):
            parts.append(f"{selection.matrix} matrix")
    if selection.cases_modules:
        parts.append(f"cases from {', '.join(selection.cases_modules)}")
    narrowed = [f"{flag} {value!r}" for flag, value in (("-k", selection.keyword),
                                                        ("-m", selection.markexpr)) if value]
    narrowed += [f"--case-id {case_id!r}" for case_id in options.get("case_ids") or ()]
    if selection.shard:
        narrowed.append(f"shard {selection.shard}")
    parts += narrowed + ([f"with {fuzzing}"] if fuzzing else [])
    if narrowed:  # an interrupted run: of how many selected (an outside audit: "2 cases" of 12)
        selected = results.selected_count
        matrix_cases = sum(1 for r in results.records if not is_fuzzed(r.case_id))
        parts.append(recorded_of_selected(results.records, selected if (
            not results.complete and selected and selected != matrix_cases) else None))
    return one_line(f"{REPORT_TITLE}: " + " · ".join(parts))


def recorded_of_selected(records, selected: int | None) -> str:
    """``3 of 12 selected cases`` (``3 cases`` where ``selected`` is None), ``and 35 fuzzed
    examples`` beside where the run fuzzed: what a run recorded, for the run's summary line,
    its report's title and the INCOMPLETE line (each said "35 of 12 selected cases", fuzzed
    examples counted as cases of the selection)."""
    fuzzed = sum(1 for r in records if is_fuzzed(r.case_id))
    cases = len(records) - fuzzed
    parts = [f"{cases} of {selected} selected cases" if selected
             else f"{cases} case{'' if cases == 1 else 's'}" if cases or not fuzzed else ""]
    if fuzzed:
        parts.append(f"{fuzzed} fuzzed example{'' if fuzzed == 1 else 's'}")
    return " and ".join(p for p in parts if p)


def precise_seconds(value: float) -> str:
    """Seconds with the digits a sub-millisecond run time needs (0.00072, not 0.00), never in
    scientific notation (0.00002, not 2e-05)."""
    if value >= 0.1:
        return fmt_seconds(value)
    digits = max(3, 2 - math.floor(math.log10(value))) if value > 0 else 3
    return f"{value:.{digits}f}"
