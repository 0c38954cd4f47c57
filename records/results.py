"""The results file: one record per case, and a run (versioned JSON, no torch).

The contract between the executor (which writes records) and the report, merge and gate
(which read them). ``load_results`` validates against ``results.schema.json``, whose label
enum comes from ``records.labels``. Every text a record or a run carries is cleaned when the
record is made (``records.text.clean_text``), so no message can cost a report.
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from records.files import UserFileError, read_json, strict_json_text, write_text_atomic
from records.labels import Label, label_names
from records.text import clean_json, clean_text, one_line

SCHEMA_NAME = "flexattention-conformance/results"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
RESULTS_FILE_FIX = "pass the results.json of a run"
#: The id of a fuzzed example's record: ``fuzz/`` then the case's own id. The case (and so its
#: inputs, golden and spec) is the same as without the prefix; the prefix says where the
#: record came from, so a fuzzed example never passes for a matrix case, and no run's
#: selection names it (a run draws its examples as it goes).
FUZZ_PREFIX = "fuzz/"


def is_fuzzed(record_id: str) -> bool:
    return record_id.startswith(FUZZ_PREFIX)


@dataclass(frozen=True)
class Record:
    """The outcome of one case in one run.

    Times are seconds: ``compile_seconds`` is the first call (trace, compile, one execution),
    ``run_seconds`` the median of the timed calls after it. ``cache_hit`` is None when the
    backend cannot tell. ``metrics`` are the verdict's numbers (reference/verdict.py).
    ``compile_breakdown`` splits the compile phase by stage (stage name to seconds, the
    remainder as ``other``) when the backend's compiler reports its stages; ``compiled_bytes``
    the size of what it made (the NEFF on Neuron), when it says. ``artifacts`` is
    the directory, relative to the report directory, holding the case's compile artefacts
    (kept for failed cases, or for all with ``--keep-artifacts``). ``performance``: the mask's
    density and block density, the visible pairs, the flops of one call on them and the
    achieved throughput at ``run_seconds`` (cases/density.py says how each is counted).
    ``expected_failure``: the reason ``--expectations`` gives, when the case failed with
    exactly the label an entry lists for it (pytest says xfail); None otherwise.
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
    compiled_bytes: int | None = None
    artifacts: str | None = None
    #: the case's work and speed (PERFORMANCE_KEYS), for cases that ran their timed calls
    performance: dict[str, float] | None = None
    worker: str = ""
    started_at: str = ""
    finished_at: str = ""
    expected_failure: str | None = None

    def __post_init__(self) -> None:
        for name in ("case_id", "message", "worker", "expected_failure"):
            value = getattr(self, name)
            if value is None:
                continue
            cleaned = clean_text(value)
            if cleaned != value:
                object.__setattr__(self, name, cleaned)
        if self.case:
            object.__setattr__(self, "case", clean_json(self.case))

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


#: The environment key under which a run records its oracle's version (reference/golden.py
#: REFERENCE_VERSION, raised whenever what the golden or the verdict computes changes): labels
#: of two runs compare only when the same oracle judged them (reports/gate.py, and
#: conformance/merge.py for the shards of one run).
REFERENCE_VERSION_KEY = "reference_version"


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
    #: How many cases the run selected (None: not known, e.g. an older results file).
    selected_count: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "environment", clean_json(self.environment))
        object.__setattr__(self, "options", clean_json(self.options))
    #: what the run selected (reports/selection.py reads it); None in files written before it
    selection: dict[str, Any] | None = None

    @property
    def reference_version(self) -> int | None:
        """The oracle's version that judged the run; None in files written before it was
        recorded (2026-12-04)."""
        return self.environment.get(REFERENCE_VERSION_KEY)

    def to_json(self) -> dict[str, Any]:
        data = {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "suite_version": self.suite_version,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "selected_count": self.selected_count,
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
            selected_count=data.get("selected_count"),
            selection=data.get("selection"),
        )

    def by_id(self) -> dict[str, Record]:
        return {r.case_id: r for r in self.records}


class ResultsError(UserFileError):
    """A results file that cannot be used: ``problem`` names the file, then ``fix``."""


def results_schema() -> dict[str, Any]:
    """The JSON Schema of a results file, with the label enum from ``records.labels``."""
    schema = json.loads(SCHEMA_PATH.read_text())
    schema["$defs"]["record"]["properties"]["label"] = {"enum": label_names()}
    return schema


def validate_results_json(data: Any, source: str = "results") -> None:
    """Raise ResultsError if ``data`` does not follow results.schema.json."""
    import jsonschema  # a dependency of the project; imported here to keep import time low

    schema = results_schema()
    version = data.get("schema_version") if isinstance(data, dict) else None
    number = isinstance(version, (int, float)) and not isinstance(version, bool)
    if version is not None and (not number or version != SCHEMA_VERSION):
        wrong_type = "" if number else f", a {type(version).__name__} where a number belongs"
        raise ResultsError(
            f"{one_line(source)}: schema_version {one_line(repr(version))} is not supported "
            f"(this suite reads version {SCHEMA_VERSION}{wrong_type})",
            "re-run or re-render it with a matching suite")
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = one_line("/".join(str(p) for p in first.absolute_path) or "(top level)")
        problem = one_line(first.message)
        if len(problem) > 160:  # jsonschema quotes the whole offending value
            problem = problem[:160] + "..."
        raise ResultsError(f"{one_line(source)}: not a valid results file at {where}: "
                           f"{problem}", RESULTS_FILE_FIX)
    seen: dict[str, int] = {}
    for index, record in enumerate(data["records"]):
        first = seen.setdefault(record["case_id"], index)
        if first != index:
            raise ResultsError(f"{one_line(source)}: not a valid results file at records/{index}: "
                               f"case {one_line(record['case_id'])} is also records/{first}; a "
                               "run records each case once", RESULTS_FILE_FIX)
        where = _non_finite_time(record)
        if where:
            raise ResultsError(f"{one_line(source)}: not a valid results file at records/{index}/"
                               f"{where}: not a finite number of seconds", RESULTS_FILE_FIX)


#: A record's times (the schema says numbers >= 0, which NaN and Infinity, read by Python's
#: json, pass). A verdict's metric that is not finite (an Inf in the output) is no time: it is
#: written as the string "inf" (records.files.strict_json_text) and not checked here.
_TIME_FIELDS = ("setup_seconds", "compile_seconds", "run_seconds")


def _non_finite_time(record: dict) -> str | None:
    """The path of a record's first time that is NaN or infinite, None when all are finite."""
    times = [(name, record.get(name)) for name in _TIME_FIELDS]
    times += [(f"compile_breakdown/{stage}", value)
              for stage, value in (record.get("compile_breakdown") or {}).items()]
    for where, value in times:
        if isinstance(value, float) and not math.isfinite(value):
            return one_line(where)
    return None


def load_results(path: str | Path) -> RunResults:
    """Read and validate a results.json."""
    try:
        data = read_json(path, RESULTS_FILE_FIX)
    except UserFileError as exc:
        raise ResultsError(exc.problem, _unwritten_run_fix(Path(path)) or exc.fix) from None
    validate_results_json(data, str(path))
    return RunResults.from_json(data)


def _unwritten_run_fix(path: Path) -> str | None:
    """The fix for a missing results.json whose directory holds a run's records (a run killed
    before it wrote its results, or one still going on); None otherwise."""
    from records.store import holds_a_run  # store builds on this module

    if path.exists() or not holds_a_run(path.parent):
        return None
    where = one_line(str(path.parent))
    return (f"{where} holds the records of a run that wrote no results.json (killed, or still "
            f"going on): keep what finished with flexconf recover {shlex.quote(where)}, or "
            f"finish it with --resume {shlex.quote(where)} and its options")


def write_results(results: RunResults, path: str | Path) -> None:
    """Write atomically (temporary file + rename) so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, strict_json_text(results.to_json()) + "\n", encoding="ascii")
