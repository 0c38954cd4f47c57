"""The properties a case carries in ``pytest --junitxml`` output.

The pytest plugin appends them to ``item.user_properties`` once the case's record exists;
pytest's junitxml writes each as ``<property name=... value=...>`` of the test case.
"""
from __future__ import annotations

from records.results import Record


def junit_properties(record: Record) -> list[tuple[str, str]]:
    """(name, value) pairs: case id, label, compile and run seconds (empty when unknown),
    cache hit, and the error ratio when the verdict computed one."""
    def seconds(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    props = [("case_id", record.case_id), ("label", record.label.value),
             ("compile_seconds", seconds(record.compile_seconds)),
             ("run_seconds", seconds(record.run_seconds))]
    if record.cache_hit is not None:
        props.append(("cache_hit", "true" if record.cache_hit else "false"))
    if record.metrics and "error_ratio" in record.metrics:
        props.append(("error_ratio", str(record.metrics["error_ratio"])))
    return props
