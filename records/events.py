"""The run's event log: each pytest worker appends JSON lines to
``<report-dir>/records/<worker>.jsonl`` (``RecordWriter``), flushed and fsynced one by one
(dEQP's rule: a crash never loses earlier results), and the log is read back
(``read_events``) and merged into one record per case (``merge_records``).
records/store.py owns the rest of the directory (the lock, the manifest, results set aside).

    {"event": "environment", "environment": {...}}         once per worker
    {"event": "selection", "case_ids": [...]}              once per worker of a new run: the
                                                           whole run's, before sharding
    {"event": "started", "case_id": ..., "case": {...}, "worker": ..., "started_at": ...}
    {"event": "finished", "record": {...Record.to_json()...}}
    {"event": "fuzzing_finished", "examples": N}         once, where the fuzzing test ran
                                                           its search to the end (its records
                                                           all written before it)

A case with a finished record takes it (the last one); a case started but never finished
(its worker was killed, or the run interrupted) becomes CRASH. A line that is no such event
(a hand edit, a disk fault) is skipped and counted, never a traceback; a torn last line, as a
kill leaves it, is skipped without a count. A worker writes a case's finished event right
after its started one, so a damaged line there is that case's record: the case has none (it
is no CRASH: its worker went on), and a resume runs it again. Given the run's selection, a
record of a case outside it (a fuzzed example's aside) is damage too.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterable

from records.errors import is_not_judged
from records.files import shape_problem
from records.labels import Label
from records.results import Record

RECORDS_DIR = "records"
#: What ``read_events`` yields for a line of the store that is no event: not JSON (the torn
#: last line aside), or JSON that is no object.
DAMAGED_EVENT = "damaged"
#: The events a worker writes (the module's table); any other object is a damaged line.
_EVENT_KINDS = ("environment", "selection", "started", "finished", "fuzzing_finished",
                DAMAGED_EVENT)


def records_dir(report_dir: str | Path) -> Path:
    return Path(report_dir) / RECORDS_DIR


def finished_ids(report_dir: str | Path) -> set[str]:
    """The case ids with a finished record in the store (what ``--resume`` need not run), by
    merge_records' rules: a record of a case a full disk kept from being judged
    (records.errors.NOT_JUDGED_KEY) is none, nor is a case started again after it."""
    return finished_in(merge_records(report_dir, []))


def finished_in(merged) -> set[str]:
    """finished_ids of a store already merged (merge_records' result)."""
    cut_off = set(merged.unfinished)
    return {r.case_id for r in merged.records
            if r.case_id not in cut_off and not is_not_judged(r)}


class RecordWriter:
    """Appends one worker's events; every line is on disk before the call returns."""

    def __init__(self, report_dir: str | Path, worker: str):
        self.path = records_dir(report_dir) / f"{worker}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_line(self.path)
        self._file = open(self.path, "ab", buffering=0)  # nothing held back for close to write
        self._before_start: int | None = None  # the file's size before the last started event

    def environment(self, environment: dict[str, Any]) -> None:
        self._write({"event": "environment", "environment": environment})

    def selection(self, case_ids: list[str]) -> None:
        """The case ids the whole run selected before sharding, as this worker collected
        them: what a controller under xdist learns only at the end, kept for a resume of a
        run killed before it."""
        self._write({"event": "selection", "case_ids": list(case_ids)})

    def started(self, case_id: str, case: dict[str, Any], worker: str, started_at: str) -> None:
        """``case_id``: the id the record will have (a fuzzed example's ``fuzz/...``);
        ``case``: the case's JSON spec."""
        self._before_start = os.fstat(self._file.fileno()).st_size
        self._write({"event": "started", "case_id": case_id, "case": case,
                     "worker": worker, "started_at": started_at})

    def finished(self, record: Record) -> None:
        """The record of the case started last. Where the disk refuses it, the started event
        goes too: the case is then one the run did not record (its results say incomplete, and
        --resume runs it), not one whose worker stopped in it (a CRASH, the backend's label, in
        a run that said it was complete: a review)."""
        before_start, self._before_start = self._before_start, None  # a record with no start
        try:  # of its own just before (fuzzing's minimal case) takes nothing else with it
            self._write({"event": "finished", "record": record.to_json()})
        except OSError:
            if before_start is not None:
                try:
                    os.ftruncate(self._file.fileno(), before_start)
                except OSError:
                    pass
            raise

    def fuzzing_finished(self, examples: int) -> None:
        """The fuzzing test ran its search to the end (``examples`` executions, replayed
        ones counted): without this line a run that fuzzed is not complete (fuzzing_done)."""
        self._write({"event": "fuzzing_finished", "examples": int(examples)})

    def close(self) -> None:
        self._file.close()

    def _write(self, event: dict) -> None:
        """One whole line, or none: a write the disk refuses half-way is cut off again, so a
        line of the store is never torn by a full disk and then read as damage."""
        data = (json.dumps(event) + "\n").encode("utf-8")
        end = os.fstat(self._file.fileno()).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[self._file.write(view):]
            os.fsync(self._file.fileno())
        except OSError as exc:
            try:
                os.ftruncate(self._file.fileno(), end)
            except OSError:
                pass
            if exc.filename is None and exc.errno is not None:  # say which file
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
            raise


def _drop_torn_line(path: Path) -> None:
    """Cut a torn last line (a worker killed mid-write, a full disk) off the worker file that a
    resumed run appends to: appended to, it would swallow the first new event (an outside
    audit: a resume's environment event became part of the torn line, and was lost). The torn
    line is unreadable already; every complete line stays, the last one too when only its
    newline is missing (read_events reads it: a finished case a resume counts as done)."""
    try:
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            keep = end
            while keep > 0:
                start = max(0, keep - 65536)
                f.seek(start)
                chunk = f.read(keep - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
            if keep < end:
                f.seek(keep)
                try:  # read as read_events reads it: a byte not UTF-8 makes it damage
                    json.loads(f.read(end - keep).decode("utf-8"))
                except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                    f.truncate(keep)
                else:  # a whole event, short of its newline
                    f.seek(end)
                    f.write(b"\n")
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Merged:
    records: list[Record]  # in case order, then unknown ids sorted
    environment: dict[str, Any] | None  # the first worker's
    unfinished: list[str]  # case ids started but never finished (now CRASH records)
    damaged: int = 0  # lines of the store that are no event of this suite (skipped)
    #: case ids whose finished line is among the damaged ones: no record (resume runs them)
    damaged_records: tuple[str, ...] = ()


def recorded_environments(report_dir: str | Path) -> list[dict]:
    """The environments the run's processes recorded in its store (one per worker)."""
    return [event["environment"] for event in read_events(report_dir)
            if isinstance(event, dict) and event.get("event") == "environment"
            and isinstance(event.get("environment"), dict)]


def read_events(report_dir: str | Path) -> Iterable[dict]:
    """Every event of every worker file; a torn last line (a worker killed mid-write) is skipped."""
    for _, event in _events_by_file(report_dir):
        yield event


def _events_by_file(report_dir: str | Path) -> Iterable[tuple[int, dict]]:
    """read_events' events, each with the number of the worker file it is read from."""
    for source, path in enumerate(sorted(records_dir(report_dir).glob("*.jsonl"))):
        if not path.is_file():  # a directory of that name (a hand's, a disk fault): no events
            yield source, {"event": DAMAGED_EVENT}
            continue
        lines = path.read_bytes().splitlines(keepends=True)
        for number, line in enumerate(lines, 1):
            try:  # a byte that is not UTF-8 (a disk fault, a hand's) makes the line damage: read
                # as U+FFFD, it changed a case id, and the record of no selected case was green
                event = json.loads(line.decode("utf-8"))  # (an outside audit)
            except (ValueError, RecursionError):
                # a last line short of its newline may be torn by a kill: not damage
                if number < len(lines) or line.endswith(b"\n"):
                    yield source, {"event": DAMAGED_EVENT}
                continue
            # JSON that is no event (a hand edit, a disk fault): said, so a reader can count it
            yield source, event if isinstance(event, dict) else {"event": DAMAGED_EVENT}


def fuzzing_done(report_dir: str | Path) -> bool:
    """Whether the run's fuzzing test ran its search to the end (a ``fuzzing_finished``
    event): a run killed or stopped mid-fuzzing has drawn only part of its examples."""
    return any(event.get("event") == "fuzzing_finished" for event in read_events(report_dir))


def recorded_selection(report_dir: str | Path) -> list[str] | None:
    """The whole run's case ids as its first worker recorded them (a ``selection`` event);
    None when no worker did (a run without xdist records them in its manifest)."""
    for event in read_events(report_dir):
        if event.get("event") == "selection" and isinstance(event.get("case_ids"), list):
            return [str(cid) for cid in event["case_ids"]]
    return None


def merge_records(report_dir: str | Path, case_order: list[str],
                  selected: Collection[str] | None = None) -> Merged:
    """One record per case of the store (see the module's rules); ``selected``: the ids of
    the run's selection where known (a record or start of another case is then damage)."""
    from records.results import is_fuzzed

    started: dict[str, dict] = {}
    finished: dict[str, Record] = {}
    environment = None
    damaged_lines = 0
    open_start: dict[int, dict] = {}  # each worker file's last start not yet finished
    damaged_starts: dict[str, str] = {}  # case id -> started_at of a start whose record is damaged

    def outside(case_id: str) -> bool:
        return selected is not None and case_id not in selected and not is_fuzzed(case_id)

    for source, event in _events_by_file(report_dir):
        kind = event.get("event")
        if kind not in _EVENT_KINDS:  # JSON of no event of ours ({}, a changed key): damage
            kind = DAMAGED_EVENT
        if kind == "environment":
            if not isinstance(event.get("environment"), dict):
                damaged_lines += 1
            elif environment is None:
                environment = event["environment"]
        elif kind == "started":
            open_start.pop(source, None)
            if not _valid_start(event) or outside(event["case_id"]):
                damaged_lines += 1
                continue
            open_start[source] = event
            if event.get("started_at", "") >= started.get(event["case_id"], {}).get(
                    "started_at", ""):  # the latest start, whichever worker's file is read first
                started[event["case_id"]] = event
        elif kind == DAMAGED_EVENT or kind == "finished":
            record = None if kind == DAMAGED_EVENT else _valid_record(event.get("record"))
            start = open_start.pop(source, None)
            if record is None or outside(record.case_id):  # a hand edit or a disk fault: the
                damaged_lines += 1  # other records are kept; right after a start, it was its record
                if start is not None:
                    damaged_starts[start["case_id"]] = start.get("started_at", "")
                continue
            previous = finished.get(record.case_id)
            if previous is None or _kept_over(record, previous):
                finished[record.case_id] = record
    # (a selection event needs nothing here: recorded_selection reads it)
    # a case started again after the record a full disk kept from being judged (a resume
    # running it again) and not finished since was cut off too (a review: the old record
    # stood, and a run stopped there said it was complete); only such a record is run again,
    # so a clock that stepped back in a judged case's run leaves that case alone
    unfinished = [cid for cid, event in started.items() if cid not in finished or (
        is_not_judged(finished[cid])
        and event.get("started_at", "") > finished[cid].finished_at)]
    # a case whose latest start was followed by a damaged line was not cut off: its record was
    # written and damaged since (an outside audit: it read as a CRASH, and a worker that went on);
    # one that keeps the record a full disk kept from being judged is run again for it, unnamed
    damaged_cases = [cid for cid in unfinished
                     if damaged_starts.get(cid) == started[cid].get("started_at", "")]
    unfinished = [cid for cid in unfinished if cid not in damaged_cases]
    damaged_records = [cid for cid in damaged_cases if cid not in finished]
    for cid in unfinished:
        event = started[cid]
        finished[cid] = Record(
            case_id=cid, label=Label.CRASH, case=event.get("case", {}),
            message=(f"worker {event.get('worker', '?')} stopped while running this case "
                     "(killed, crashed or interrupted); no result was recorded"),
            worker=event.get("worker", ""), started_at=event.get("started_at", ""))
    position = {cid: i for i, cid in enumerate(case_order)}
    ordered = sorted(finished.values(),
                     key=lambda r: (position.get(r.case_id, len(position)), r.case_id))
    return Merged(ordered, environment, unfinished, damaged_lines, tuple(damaged_records))


def damage_line(merged: Merged, report_dir: str | Path) -> str:
    """The line that says what the store's damaged lines cost: how many were skipped, and the
    cases whose record was among them (no record now: a resume runs them again)."""
    from records.text import one_line

    line = (f"skipped {merged.damaged} damaged line(s) of {records_dir(report_dir)}/*.jsonl (no "
            "event of this run: a hand edit or a disk fault)")
    cases = merged.damaged_records
    if not cases:
        return line
    one = len(cases) == 1
    return (f"{line}; among them the record of {len(cases)} finished case{'' if one else 's'} "
            f"({one_line(cases[0])}{'' if one else ', ...'}): {'it has' if one else 'they have'} "
            f"no record, and --resume runs {'it' if one else 'them'} again")


def _kept_over(record: Record, previous: Record) -> bool:
    """Which of two finished records of a case the store keeps: a judged one over one a full
    disk kept from being judged, whatever the clocks say (a resume on a host whose clock is
    behind); else the later."""
    if is_not_judged(record) != is_not_judged(previous):
        return is_not_judged(previous)
    return record.finished_at >= previous.finished_at


def _valid_start(event: dict) -> bool:
    """Whether a ``started`` event holds what the CRASH record of a case it cut off needs."""
    return (isinstance(event.get("case_id"), str) and bool(event["case_id"])
            and isinstance(event.get("case", {}), dict) and not shape_problem(event)
            and all(isinstance(event.get(key, ""), str) for key in ("worker", "started_at")))


def _valid_record(data: Any) -> Record | None:
    """The record of a ``finished`` event where it is one a results file may hold (the
    schema's rules, on it alone); None otherwise."""
    from records.results import SCHEMA_NAME, SCHEMA_VERSION, ResultsError, validate_results_json

    if not isinstance(data, dict) or shape_problem(data):  # too deep, or a number no float holds
        return None
    try:
        validate_results_json({"schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION,
                               "suite_version": "", "complete": False, "environment": {},
                               "options": {"backend": "", "profile": "", "seed": 0},
                               "records": [data]})
        return Record.from_json(data)
    except (ResultsError, ValueError, TypeError, KeyError, RecursionError):
        return None
