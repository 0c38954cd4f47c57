"""The results file: labels, one record per case, and a run (versioned JSON, no torch).

This module is the contract between the executor (which writes records) and the report and
gate (which read them). ``load_results`` validates against ``results.schema.json``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

SCHEMA_NAME = "flexattention-conformance/results"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("results.schema.json")


class Label(str, Enum):
    """The closed set of outcomes of a case (docs/labels.md says what each one means)."""

    PASS = "PASS"
    MISMATCH = "MISMATCH"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    RUN_TIMEOUT = "RUN_TIMEOUT"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    CRASH = "CRASH"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNSUPPORTED = "UNSUPPORTED"
    HARNESS_ERROR = "HARNESS_ERROR"
    #: only in a compile-only pass (``--phase compile``): the first call finished; no verdict
    COMPILED = "COMPILED"

    @property
    def acceptable(self) -> bool:
        """Whether a conformance run may contain this label and still conform (dEQP rule)."""
        return self in (Label.PASS, Label.UNSUPPORTED)


@dataclass(frozen=True)
class Record:
    """The outcome of one case in one run.

    Times are seconds: ``compile_seconds`` is the first call (trace, compile, one execution),
    ``run_seconds`` the median of the timed calls after it. ``cache_hit`` is None when the
    backend cannot tell. ``metrics`` are the verdict's numbers (reference/verdict.py).
    ``compile_breakdown`` splits the compile phase by stage (stage name to seconds, the
    remainder as ``other``) when the backend's compiler reports its stages. ``artifacts`` is
    the directory, relative to the report directory, holding the case's compile artefacts
    (kept for failed cases, or for all with ``--keep-artifacts``).
    """

    case_id: str
    label: Label
    case: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    setup_seconds: float | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None
    cache_hit: bool | None = None
    metrics: dict[str, Any] | None = None
    compile_breakdown: dict[str, float] | None = None
    artifacts: str | None = None
    worker: str = ""
    started_at: str = ""
    finished_at: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["label"] = self.label.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Record":
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["label"] = Label(data["label"])
        return cls(**kwargs)


@dataclass(frozen=True)
class RunResults:
    """A whole run: environment, options and every record (in case order)."""

    environment: dict[str, Any]
    options: dict[str, Any]
    records: tuple[Record, ...]
    suite_version: str
    started_at: str = ""
    finished_at: str = ""
    complete: bool = True
    #: what the run selected (reports/selection.py reads it); None in files written before it
    selection: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "suite_version": self.suite_version,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "environment": self.environment,
            "options": self.options,
            "records": [r.to_json() for r in self.records],
        }
        if self.selection is not None:
            data["selection"] = self.selection
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunResults":
        return cls(
            environment=data["environment"],
            options=data["options"],
            records=tuple(Record.from_json(r) for r in data["records"]),
            suite_version=data["suite_version"],
            started_at=data.get("started_at", ""),
            finished_at=data.get("finished_at", ""),
            complete=data.get("complete", True),
            selection=data.get("selection"),
        )

    def by_id(self) -> dict[str, Record]:
        return {r.case_id: r for r in self.records}


class ResultsError(ValueError):
    """A results file that cannot be used; the message names the file and the problem."""


def validate_results_json(data: Any, source: str = "results") -> None:
    """Raise ResultsError if ``data`` does not follow results.schema.json."""
    import jsonschema  # a dependency of the project; imported here to keep import time low

    schema = json.loads(SCHEMA_PATH.read_text())
    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ResultsError(
            f"{source}: schema_version {data.get('schema_version')!r} is not supported "
            f"(this suite reads version {SCHEMA_VERSION}); re-run or re-render with a matching suite"
        )
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise ResultsError(f"{source}: not a valid results file at {where}: {first.message}")


def load_results(path: str | Path) -> RunResults:
    """Read and validate a results.json."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file; pass the results.json of a run") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not JSON ({exc}); pass the results.json of a run") from None
    validate_results_json(data, str(path))
    return RunResults.from_json(data)


def write_results(results: RunResults, path: str | Path) -> None:
    """Write atomically (temporary file + rename) so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results.to_json(), indent=1, sort_keys=False) + "\n")
    tmp.replace(path)
