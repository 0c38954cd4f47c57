"""What a run ran: results.json's ``selection`` block, and where two runs' selections differ.

The block records the case set definition (matrix, profile, case modules, case file) and the
selection within it (``-k``, ``-m``, ``--shard``), with the ids of every case selected for the
whole run before sharding. ``flexconf merge`` judges completeness against those ids and
refuses shards of different selections; ``flexconf gate`` refuses runs of different
definitions. Files written before the block existed still read: ``selection_of`` derives what
their options say and leaves the rest unknown (None), and a comparison skips unknown values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from records.results import RunResults, is_fuzzed

#: what a run means to run: the gate refuses two runs that differ in any of these
DEFINITION = ("matrix", "profile", "cases_modules", "case_file", "keyword", "markexpr")
#: The most parts a run is split into (``--shard I/N``: N): more than any run has; a larger N
#: is refused by the run, and a file that records one is not a merge's (a doctored file).
MAX_SHARDS = 100_000
#: the name people know each field by, for one-line refusals
SPOKEN = {"matrix": "matrix", "profile": "profile", "cases_modules": "cases modules",
          "case_file": "case file", "keyword": "-k expression", "markexpr": "-m expression",
          "shard": "shard"}


def matrix_selects(matrix: str | None, case_file: str | None) -> bool:
    """Whether ``--matrix`` chooses anything beside ``--case-file``: a case file replaces the
    catalog's matrices, so core, extended and all select nothing there (custom still says
    what fuzzing draws from). Run options, resume, gate and merge all read it here: a run
    refuses the pair, and a file an older suite wrote with it is compared and resumed as
    without it."""
    return not (case_file and matrix in ("core", "extended", "all"))


@dataclass(frozen=True)
class Selection:
    """None in a field means unknown (an older results file without the block)."""

    matrix: str | None
    profile: str | None
    cases_modules: tuple[str, ...] | None
    case_file: str | None  # the path given to --case-file, None without one
    case_file_sha256: str | None  # of the case file's bytes; compared instead of the path
    keyword: str | None  # -k, "" when not given
    markexpr: str | None  # -m, "" when not given
    shard: str | None  # "I/N", None when unsharded
    case_ids: tuple[str, ...] | None  # selected for the whole run, before sharding
    recorded: bool = True  # False: derived from the options of a file without the block

    def to_json(self) -> dict[str, Any]:
        return {"matrix": self.matrix, "profile": self.profile,
                "cases_modules": list(self.cases_modules or ()), "case_file": self.case_file,
                "case_file_sha256": self.case_file_sha256, "keyword": self.keyword,
                "markexpr": self.markexpr, "shard": self.shard,
                "case_ids": None if self.case_ids is None else list(self.case_ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Selection":
        ids = data.get("case_ids")
        return cls(matrix=data.get("matrix"), profile=data.get("profile"),
                   cases_modules=tuple(data.get("cases_modules") or ()),
                   case_file=data.get("case_file"),
                   case_file_sha256=data.get("case_file_sha256"),
                   keyword=data.get("keyword", ""), markexpr=data.get("markexpr", ""),
                   shard=data.get("shard"), case_ids=None if ids is None else tuple(ids))

    def describe(self) -> str:
        """``matrix 'extended', profile 'smoke', -k 'causal'`` (what people need to tell runs
        apart)."""
        parts = [f"case file {self.case_file}" if self.case_file else f"matrix {self.matrix!r}",
                 f"profile {self.profile!r}"]
        if self.cases_modules:
            parts.append(f"cases modules {', '.join(self.cases_modules)}")
        parts += [f"{flag} {value!r}" for flag, value in (("-k", self.keyword),
                                                          ("-m", self.markexpr)) if value]
        return ", ".join(parts)


def selection_of(run: RunResults) -> Selection:
    """The run's recorded selection, else what its options tell (the rest unknown)."""
    if run.selection is not None:
        return Selection.from_json(run.selection)
    options = run.options
    modules = options.get("cases_modules")
    return Selection(matrix=options.get("matrix", "core"), profile=options.get("profile"),
                     cases_modules=None if modules is None else tuple(modules),
                     case_file=options.get("case_file"), case_file_sha256=None, keyword=None,
                     markexpr=None, shard=options.get("shard"), case_ids=None, recorded=False)


def selected_without_record(run: RunResults) -> tuple[int, int] | None:
    """(cases without a record, cases selected) of a run whose selection names cases its
    records lack; None when each has its record (or the selection is unknown). A complete run
    with any lacking is an edited or damaged file: the gate refuses it, and its report does
    not call it conforming. A shard's recorded case_ids are the whole run's, so a shard is
    held to its own count (selected_count)."""
    recorded = {r.case_id for r in run.records}
    selection = selection_of(run)
    if selection.case_ids and not selection.shard:
        missing = sum(cid not in recorded for cid in selection.case_ids)
        return (missing, len(selection.case_ids)) if missing else None
    selected = run.selected_count
    if isinstance(selected, int) and not isinstance(selected, bool) and selected > len(recorded):
        return selected - len(recorded), selected
    return None


def recorded_outside_selection(run: RunResults) -> list[str]:
    """The ids of the run's records of cases its selection does not name (a fuzzed example's
    record aside: no selection names one): each an edited or damaged id, such as one whose
    byte a disk fault changed (an outside audit: resumed, it showed 5/5 PASS of 4 selected
    cases). Empty when the selection's ids are unknown."""
    selection = selection_of(run)
    if not selection.case_ids:
        return []
    selected = set(selection.case_ids)
    return [r.case_id for r in run.records
            if r.case_id not in selected and not is_fuzzed(r.case_id)]


def selection_damage(run: RunResults) -> str | None:
    """What shows a complete run's records and its selection apart: ``1 of its 96 selected
    cases has no record`` or ``1 of its records is of a case it did not select ('x')``; None
    when they agree. Such a file was edited or damaged after its run wrote it (a run writes a
    record for each case it selects, and none beside): the gate refuses it, and its report
    does not call it conforming."""
    lacking = selected_without_record(run)
    if lacking:
        return (f"{lacking[0]} of its {lacking[1]} selected cases "
                f"{'has' if lacking[0] == 1 else 'have'} no record")
    outside = recorded_outside_selection(run)
    if outside:
        return (f"{len(outside)} of its records {'is' if len(outside) == 1 else 'are'} of "
                f"{'a case' if len(outside) == 1 else 'cases'} it did not select "
                f"({outside[0]!r}{', ...' if len(outside) > 1 else ''})")
    return None


def run_differences(baseline: RunResults, candidate: RunResults) -> list[tuple[str, str, str]]:
    """(what, the baseline's value, the candidate's), as text for people, of everything that
    makes two runs not two measurements of one thing: the backend, the suite version, the case
    set's definition (DEFINITION), the exact cases of ``--case-id``. The gate refuses such a
    pair; a report compared against one says so."""
    differences = [(what, repr(old), repr(new)) for what, old, new in (
        ("backend", baseline.options.get("backend"), candidate.options.get("backend")),
        ("suite version", baseline.suite_version, candidate.suite_version)) if old != new]
    definition = first_difference(selection_of(baseline), selection_of(candidate), DEFINITION)
    if definition:
        differences.append(definition)
    old_ids, new_ids = (_case_id_option(run) for run in (baseline, candidate))
    if old_ids != new_ids:  # --case-id: the exact cases chosen, beside -k
        differences.append(("--case-id", repr(old_ids) if old_ids else "none",
                            repr(new_ids) if new_ids else "none"))
    return differences


def _case_id_option(run: RunResults) -> list[str]:
    """The run's ``--case-id`` values, sorted, as text: options are not in the schema, and a
    doctored value (numbers among the ids, a string) was a TypeError traceback (a review)."""
    ids = run.options.get("case_ids")
    return sorted(str(cid) for cid in ids) if isinstance(ids, list) else []


def first_difference(a: Selection, b: Selection, fields: Sequence[str] = DEFINITION,
                     ) -> tuple[str, str, str] | None:
    """(what, a's value, b's value), as text for people, of the first of ``fields`` in which
    ``a`` and ``b`` differ; values unknown in either are skipped. None when they agree."""
    for name in fields:
        if name == "matrix" and not (matrix_selects(a.matrix, a.case_file)
                                     or matrix_selects(b.matrix, b.case_file)):
            continue
        if name == "case_file" and a.case_file_sha256 and b.case_file_sha256:
            old, new = a.case_file_sha256, b.case_file_sha256  # the path may differ by machine
        elif name == "case_file":
            old, new = a.case_file or "", b.case_file or ""
        else:
            old, new = getattr(a, name), getattr(b, name)
        if old is None or new is None or old == new:
            continue
        return SPOKEN.get(name, name), _shown(a, name), _shown(b, name)
    return None


def ids_difference(a: Sequence[str], b: Sequence[str], name_a: str = "the first",
                   name_b: str = "the second") -> str | None:
    """One line saying how two sets of selected case ids differ, None when the same."""
    set_a, set_b = set(a), set(b)
    only_a, only_b = [i for i in a if i not in set_b], [i for i in b if i not in set_a]
    if not (only_a or only_b):
        return None
    example = f"{only_a[0]!r} only in {name_a}" if only_a else f"{only_b[0]!r} only in {name_b}"
    return (f"the selected cases differ ({len(set_a)} in {name_a}, {len(set_b)} in {name_b}; "
            f"{example})")


def _shown(selection: Selection, name: str) -> str:
    if name == "case_file":
        if not selection.case_file:
            return "none"
        digest = selection.case_file_sha256
        return f"{selection.case_file}" + (f" (sha256 {digest[:12]})" if digest else "")
    value = getattr(selection, name)
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return repr(value)
