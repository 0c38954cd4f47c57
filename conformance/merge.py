"""Joining the results of the shards of one run (``--shard I/N`` on N machines) into one.

Shards are joined only when they are parts of the same run: the same suite version, profile,
backend, seed, compile-cache mode and budgets, the same selection (matrix, case modules, case
file, ``-k``, ``-m``, and the case ids selected before sharding), the same shard count, and
the same torch and compiler/SDK versions. Anything else is refused (``MergeError``, one line
naming the two files and the value that differs). Hosts, drivers and device names may differ;
the merged environment lists what differed.

A case found in more than one file is a duplicate: the first copy that finished and failed is
kept (a failure seen once is evidence of a bug, a flaky one too), else the first that finished,
else the first given (``_rank``: a copy an interruption cut off says nothing of the backend); a
case of the run's selection found in no file, or a shard given by no file, is missing. Both are
reported; a missing one makes the merged run incomplete. The merged file is written either
way, and says what it was merged from (``options.merged_parts``: each file, its shard, whether
its run finished, how many records it gave) and which cases were duplicated, with each copy's
label (``options.merged_duplicates``), so its report and a gate see them too. The selection
is the one the shards recorded (reports/selection.py); for files written before they
recorded it, the whole matrix of their options, and a note says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from records.release import RELEASE_KEYS
from records.results import Record, RunResults
from records.selection import DEFINITION, first_difference, ids_difference, selection_of

#: Options that must agree (they change which cases ran, or what a label means).
SAME_OPTIONS = ("profile", "backend", "seed", "compile_cache", "compile_timeout", "run_timeout",
                "phase", "timed_runs")  # timed_runs: every call is judged, so more calls see more


class MergeError(ValueError):
    """Shards that must not be merged; the message names the files and the difference."""


@dataclass(frozen=True)
class Merged:
    results: RunResults
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # case id -> files
    missing: list[str] = field(default_factory=list)  # case ids in no file
    missing_shards: list[str] = field(default_factory=list)  # e.g. ["2/3"]
    expected_from: str = ""  # where the expected case list came from ("" when unknown)
    notes: list[str] = field(default_factory=list)  # how completeness was judged, when guessed
    incomplete: list[str] = field(default_factory=list)  # files of runs that did not finish

    @property
    def clean(self) -> bool:
        return not (self.duplicates or self.missing or self.missing_shards or self.incomplete)


def merge_runs(runs: Sequence[tuple[str, RunResults]],
               expected_ids: Sequence[str] | None = None) -> Merged:
    """Merge ``(source name, run)`` pairs, in the order given. ``expected_ids`` is the list of
    case ids the whole run should have (default: the selection the shards recorded, else
    ``expected_case_ids`` of the first run)."""
    if not runs:
        raise MergeError("nothing to merge; pass the results.json of every shard")
    _check_same(runs)
    first_source, first = runs[0]
    notes: list[str] = []
    recorded = next((sel for sel in map(selection_of, (r for _, r in runs))
                     if sel.case_ids is not None), None)
    if expected_ids is not None:
        expected_from = "the given case list"
    elif recorded is not None:
        expected_ids = list(recorded.case_ids)
        expected_from = f"the selection ({recorded.describe()})"
    else:
        expected_ids, expected_from = expected_case_ids(first)
        why = (f"{first_source} records no selection (written before results files did)"
               if not selection_of(first).recorded
               else "no file records its selected cases (each run ended before they were known)")
        notes.append(f"{why}: expecting {expected_from}" if expected_from
                     else f"{why}, and its cases cannot be listed here: completeness not judged")

    records: dict[str, Record] = {}
    owners: dict[str, list[str]] = {}
    for source, run in runs:
        for record in run.records:
            owners.setdefault(record.case_id, []).append(source)
            kept = records.setdefault(record.case_id, record)
            if _rank(record) < _rank(kept):
                records[record.case_id] = record
    duplicates = {cid: files for cid, files in owners.items() if len(files) > 1}

    order = list(expected_ids or [])
    known = set(order)
    missing = [cid for cid in order if cid not in records]
    order += [cid for cid in records if cid not in known]

    shards = [_shard(run) for _, run in runs]
    missing_shards: list[str] = []
    if shards[0] is not None:
        count = shards[0][1]
        given = {s[0] for s in shards if s}
        missing_shards = [f"{i}/{count}" for i in range(1, count + 1) if i not in given]

    options = dict(first.options)
    options["shard"] = None
    options["merged_shards"] = [f"{s[0]}/{s[1]}" for s in sorted(s for s in shards if s)]
    options["merged_parts"] = [
        {"file": source, "shard": run.options.get("shard"), "complete": run.complete,
         "records": len(run.records), "report_dir": run.options.get("report_dir")}
        for source, run in runs]
    copies = {(source, r.case_id): r.label.value for source, run in runs for r in run.records}
    options["merged_duplicates"] = {
        cid: [{"file": source, "label": copies[source, cid]} for source in files]
        for cid, files in duplicates.items()}
    selection = None
    if first.selection is not None:
        selection = {**first.selection, "shard": None}
        if recorded is not None:
            selection["case_ids"] = list(recorded.case_ids)
    merged = RunResults(
        environment=_merged_environment(runs),
        options=options,
        records=tuple(records[cid] for cid in order if cid in records),
        suite_version=first.suite_version,
        started_at=min((r.started_at for _, r in runs if r.started_at), default=""),
        finished_at=max((r.finished_at for _, r in runs if r.finished_at), default=""),
        complete=all(r.complete for _, r in runs) and not missing and not missing_shards,
        selection=selection,
        selected_count=len(expected_ids) if expected_ids else None,
    )
    incomplete = [source for source, run in runs if not run.complete]
    return Merged(merged, duplicates, missing, missing_shards, expected_from, notes, incomplete)


def _rank(record: Record) -> int:
    """Which copy of a duplicated case a merge keeps, lowest first (the first given among
    equals): one that finished and failed (a failure seen once is evidence of a bug), one
    that finished, then one an interruption cut off (its CRASH says only that the worker
    stopped, nothing of the backend), or one a full disk kept from being judged (no outcome
    of the case either)."""
    from records.errors import is_not_judged
    from records.results import Label

    if (record.label is Label.CRASH and not record.finished_at) or is_not_judged(record):
        return 2
    return 1 if record.label.acceptable else 0


def expected_case_ids(run: RunResults) -> tuple[list[str] | None, str]:
    """The case ids a whole run of ``run``'s options has, regenerated here, and where that
    list comes from; (None, "") when it cannot be known here (a case file that is not on this
    machine, case modules). For files that record no selection."""
    case_file = run.options.get("case_file")
    if case_file:
        if not Path(case_file).is_file():
            return None, ""
        from conformance.case_file import load_case_file

        return [c.id for c in load_case_file(case_file)], f"the cases of case file {case_file}"
    from cases.catalog import MATRICES, PROFILES, matrix

    profile, name = run.options.get("profile"), run.options.get("matrix", "core")
    if profile not in PROFILES or name not in MATRICES or run.options.get("cases_modules"):
        return None, ""
    return ([c.id for c in matrix(profile, name)],
            f"the whole matrix {name!r} of profile {profile!r}")


def _check_same(runs: Sequence[tuple[str, RunResults]]) -> None:
    first_source, first = runs[0]
    for source, run in runs[1:]:
        difference = _difference(first, run, first_source, source)
        if difference:
            raise MergeError(f"cannot merge {source} into {first_source}: {difference}; merge "
                             "only the shards of one run (same suite, options, selection and "
                             "versions)")


def _release_fact(key: str) -> str:
    """How a merge error names a release key: ``torch version``, ``NEURON_CC_FLAGS``, ``plugin
    code (backend_code)``."""
    if key == "backend_code":
        return "plugin code (backend_code)"
    return key if key.isupper() else f"{key} version"


def _expectations(run: RunResults) -> str:
    """Which known failures judged a run (each record's ``expected_failure``): the content of
    its --expectations file, which shards on other machines may name by other paths."""
    digest = run.options.get("expectations_sha256")
    if digest:
        return f"a file of sha256 {str(digest)[:12]}"
    return "not recorded" if run.options.get("expectations") else "none"


_FACTS = {
    "suite_version": lambda r: r.suite_version,
    "reference version": lambda r: r.reference_version,
    **{name: (lambda r, n=name: r.options.get(n)) for name in SAME_OPTIONS},
    "shard count": lambda r: _shard(r)[1] if _shard(r) else None,
    "--expectations": _expectations,
    **{_release_fact(name): (lambda r, n=name: r.environment.get(n)) for name in RELEASE_KEYS},
}


def _difference(first: RunResults, run: RunResults, first_source: str, source: str) -> str | None:
    """How ``run`` differs from ``first`` in what makes shards parts of one run: ``<what> is
    <value> there but <value> here``; None when they agree."""
    if (_shard(run) is None) != (_shard(first) is None):
        (whole_name, whole), part = ((source, run), first) if _shard(run) is None \
            else ((first_source, first), run)
        merged = whole.options.get("merged_shards")
        what = (f"already a merge of shards {', '.join(map(str, merged))}: merge the shards' "
                "own results.json files, all in one command" if merged
                else "a whole run, not a --shard part")
        return f"{whole_name} is {what}, and the other is shard {part.options.get('shard')}"
    for what, get in _FACTS.items():
        if get(run) != get(first):
            return f"{what} is {get(run)!r} there but {get(first)!r} here"
    mine, theirs = selection_of(first), selection_of(run)
    if mine.recorded != theirs.recorded:
        state = {True: "recorded", False: "not recorded"}
        return f"the selection is {state[theirs.recorded]} there but {state[mine.recorded]} here"
    definition = first_difference(theirs, mine, DEFINITION)
    if definition:
        what, there, here = definition
        return f"{what} is {there} there but {here} here"
    if mine.case_ids is not None and theirs.case_ids is not None:
        return ids_difference(mine.case_ids, theirs.case_ids, first_source, source)
    return None


def _shard(run: RunResults) -> tuple[int, int] | None:
    """(I, N) of a shard's ``options.shard`` 'I/N' (1-based), None for an unsharded run."""
    text = run.options.get("shard")
    if not text:
        return None
    from records.selection import MAX_SHARDS

    try:
        index, count = (int(part) for part in str(text)[:20].split("/"))
    except ValueError:
        index, count = 0, 0
    if not 1 <= index <= count <= MAX_SHARDS:  # a doctored count would be listed shard by shard
        raise MergeError(f"options.shard {str(text)[:40]!r} is not I/N; is this a results.json "
                         "of this suite?")
    return index, count


def _merged_environment(runs: Sequence[tuple[str, RunResults]]) -> dict:
    environment = dict(runs[0][1].environment)
    differs: dict[str, list] = {}
    for key in sorted({k for _, run in runs for k in run.environment}):
        values = []
        for _, run in runs:
            value = run.environment.get(key)
            if value not in values:
                values.append(value)
        if len(values) > 1:
            differs[key] = values
    hosts = differs.pop("host", None)
    environment["hosts"] = hosts if hosts else [environment.get("host")]
    if differs:
        environment["differs_between_shards"] = differs
    return environment
