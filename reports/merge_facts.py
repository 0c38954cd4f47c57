"""What a merged results file says of its parts (conformance/merge.py writes it into the
options): the cases found in more than one file, with each copy's label, and the parts whose
runs did not finish. Read defensively: a results file is the user's to edit."""
from __future__ import annotations

from dataclasses import dataclass

from records.results import RunResults
from records.selection import MAX_SHARDS
from records.text import one_line


@dataclass(frozen=True)
class Copy:
    file: str
    label: str


@dataclass(frozen=True)
class Part:
    file: str
    shard: str | None
    report_dir: str | None


def duplicated_cases(results: RunResults) -> dict[str, list[Copy]]:
    """Case id -> its copies in the merged files, in the order given (which one was kept:
    conformance/merge.py)."""
    recorded = results.options.get("merged_duplicates")
    if not isinstance(recorded, dict):
        return {}
    cases = {}
    for case_id, copies in recorded.items():
        if isinstance(copies, list):
            cases[str(case_id)] = [Copy(str(c.get("file")), str(c.get("label")))
                                   for c in copies if isinstance(c, dict)]
    return cases


def disagreeing(cases: dict[str, list[Copy]]) -> dict[str, list[Copy]]:
    """The duplicated cases whose copies have different labels (a flaky case, or a retried
    part), in the order given."""
    return {cid: copies for cid, copies in cases.items() if len({c.label for c in copies}) > 1}


def duplicates_note(results: RunResults) -> str | None:
    """One sentence on the merge's duplicated cases, those whose copies disagree first; None
    when there were none."""
    cases = duplicated_cases(results)
    if not cases:
        return None
    disagree = disagreeing(cases)
    shown_id, shown = next(iter(disagree.items())) if disagree else next(iter(cases.items()))
    copies = ", ".join(f"{c.label} in {one_line(c.file)}" for c in shown)
    which = (f"{len(disagree)} of them with different labels, e.g. {shown_id}: {copies}"
             if disagree else f"all with the same label, e.g. {shown_id}: {copies}")
    return (f"{len(cases)} case(s) were in more than one merged file, each kept as its first "
            f"finished failing copy, else its first finished one; {which}")




def lacking_shards(results: RunResults) -> list[str] | None:
    """The shards ``I/N`` of its run that a merge's ``options.merged_shards`` does not hold;
    None where that is not a list of ``I/N`` names of one count N (at most MAX_SHARDS)."""
    merged = results.options.get("merged_shards")
    if not isinstance(merged, list) or not merged:
        return None
    given, counts = set(), set()
    for shard in merged:
        index, _, count = str(shard).partition("/")
        if not (f"{index}{count}".isascii() and index.isdecimal() and count.isdecimal()
                and len(count) <= 6):  # '²' is a digit int() refuses
            return None
        given.add(int(index))
        counts.add(int(count))
    count = counts.pop()
    if counts or not 1 <= count <= MAX_SHARDS or not given <= set(range(1, count + 1)):
        return None
    return [f"{i}/{count}" for i in range(1, count + 1) if i not in given]


def unfinished_parts(results: RunResults) -> list[Part]:
    """The merged files whose runs did not finish (complete: false), in the order given."""
    parts = results.options.get("merged_parts")
    if not isinstance(parts, list):
        return []
    return [Part(str(p.get("file")), _text(p.get("shard")), _text(p.get("report_dir")))
            for p in parts if isinstance(p, dict) and p.get("complete") is False]


def _text(value) -> str | None:
    return str(value) if value else None
