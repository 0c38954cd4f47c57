"""Which two runs the release gate compares: complete, whole runs (no single shard, no
interrupted run) of one backend, suite version, oracle and case set definition (matrix,
profile, case modules, case file, ``-k``/``-m``, ``--case-id``); anything else is a
GateInputError, one line naming the difference and the fix. ``flexconf expectations update``
asks the same of the run it reads."""
from __future__ import annotations

import shlex
from dataclasses import replace

from records.errors import is_not_judged
from records.results import RunResults
from records.selection import run_differences, selection_damage, selection_of
from records.text import one_line


class GateInputError(ValueError):
    """The two runs cannot be compared; the message names the file and the fix."""


def _why_incomplete(run: RunResults, use: str) -> str:
    """Why a run says complete=false, and the fix: a merge that lacks a shard, or holds an
    interrupted one, or a run that was interrupted."""
    from reports.summary import records_held

    selected = run.selected_count or len(selection_of(run).case_ids or ())
    held = records_held(replace(run, selected_count=selected)) if selected else ""
    held = f"{held}; " if held else ""
    merged = run.options.get("merged_shards")
    if merged:
        from reports.merge_facts import lacking_shards, unfinished_parts

        lacking = lacking_shards(run)
        if lacking is None:
            return (f"its options.merged_shards {one_line(repr(merged))[:120]} is not a list "
                    "of I/N shard names of one run (complete=false); "
                    f"{use} a file flexconf merge wrote")
        if lacking:
            shown = ", ".join(lacking[:10]) + (f" and {len(lacking) - 10} more"
                                               if len(lacking) > 10 else "")
            return (f"a merge of shard(s) {', '.join(map(str, merged[:10]))}"
                    f"{' ...' if len(merged) > 10 else ''} without shard(s) {shown} ({held}"
                    f"complete=false); merge the missing shard(s) in (flexconf merge) and "
                    f"{use} the merged file")

        parts = unfinished_parts(run)
        if parts:
            named = "; ".join(
                f"{one_line(p.file)}" + (f" (shard {one_line(p.shard)})" if p.shard else "")
                + (f", --resume {shlex.quote(p.report_dir)}" if p.report_dir else "")
                for p in parts)
            return (f"a merge of a part whose run did not finish ({held}complete=false): "
                    f"{named}; finish it with --resume, merge again and {use} that")
        return (f"a merge one of whose shards was interrupted or lacks cases ({held}"
                f"complete=false); finish that shard with --resume, merge again and {use} that")
    report_dir = run.options.get("report_dir")
    if not report_dir:
        return (f"the run was interrupted ({held}complete=false); finish it with --resume "
                f"REPORT_DIR, or {use} a finished run")
    from conformance.run_info import matrix_path
    from reports.summary import resume_command

    return (f"the run was interrupted ({held}complete=false); finish it ("
            f"{resume_command(run, report_dir, matrix_path())}) and {use} that, or {use} a "
            "finished run")


def not_a_whole_finished_run(run: RunResults, use: str) -> str | None:
    """Why ``run`` cannot stand for the run it is part of (a compile-only pass, an interrupted
    run, one shard), and the fix, with ``use`` ("gate", "update from") as what to do with
    the right file; None when it can. The gate and ``expectations update`` both judge a run
    by its whole, finished results."""
    if run.options.get("phase") == "compile":
        return (f"a compile-only pass (--phase compile) judged no numbers; {use} the run that "
                "followed it")
    if not run.complete:
        return _why_incomplete(run, use)
    shard = selection_of(run).shard
    if shard:
        return (f"shard {shard} of a run, not the whole run; merge the shards first (flexconf "
                f"merge) and {use} the merged file")
    not_judged = [r.case_id for r in run.records if is_not_judged(r)]
    if not_judged:  # no outcome of theirs: a gate would call them failures, or known ones
        return (f"{len(not_judged)} of its cases {'was' if len(not_judged) == 1 else 'were'} "
                f"not judged (a disk was full: {one_line(not_judged[0])}); make room, --resume "
                f"its report directory (a merged file's: each shard's, then merge again) to "
                f"judge them, and {use} that")
    damage = selection_damage(run)
    if damage:  # complete says each selected case has its record, and none other is there
        return (f"it says complete, but {damage} (an edited or damaged file); {use} a results "
                "file a run wrote")
    return None


def same_run(a: RunResults, b: RunResults) -> bool:
    """Whether two results files are of one run (a copy): the same start on the same host."""
    return bool(a.started_at) and (a.started_at, a.environment.get("host")) == \
        (b.started_at, b.environment.get("host"))


def check_comparable(baseline: RunResults, candidate: RunResults,
                     baseline_name: str = "baseline", candidate_name: str = "candidate") -> None:
    """Raise GateInputError when the runs are not two complete, whole runs of one suite and
    one case set definition (reports/selection.py: matrix, profile, case modules, case file,
    -k, -m)."""
    for name, run in ((baseline_name, baseline), (candidate_name, candidate)):
        problem = not_a_whole_finished_run(run, "gate")
        if problem:
            raise GateInputError(f"{name}: {problem}")
    if same_run(baseline, candidate):
        raise GateInputError(f"{baseline_name} and {candidate_name} are the same run (started "
                             f"{one_line(baseline.started_at)}): a copy compared with itself "
                             "shows nothing; gate a new run of the candidate release")
    differences = run_differences(baseline, candidate)
    if differences:  # every one: a -k run against a --case-id run differs in both
        said = "; ".join(f"{what} {new} differs from the baseline's {old}"
                         for what, old, new in differences)
        whats = " and ".join(what for what, _, _ in differences)
        raise GateInputError(f"{candidate_name}: {said} ({baseline_name}); gate two runs of the "
                             f"same {whats}")
    _check_same_oracle(baseline, candidate, baseline_name, candidate_name)


def _check_same_oracle(baseline: RunResults, candidate: RunResults, baseline_name: str,
                       candidate_name: str) -> None:
    """Raise GateInputError when another oracle judged the baseline: a label that changed
    could then be the suite's change, not the release's. A file that records no version
    (written before 2026-12-04) is not checked: what was not recorded cannot be."""
    old, new = baseline.reference_version, candidate.reference_version
    if old is None or new is None or old == new:
        return
    # the run judged by the older oracle is the one to run again (versions only grow)
    older, older_name, newer = (baseline, baseline_name, candidate) \
        if _version_order(old) < _version_order(new) else (candidate, candidate_name, baseline)
    revision = newer.environment.get("git_revision")  # "<sha>", "<sha>-dirty" or None
    clean = isinstance(revision, str) and not revision.endswith("-dirty")
    at_revision = f", git checkout {one_line(revision)}" if clean else ""
    raise GateInputError(
        f"{candidate_name}: reference version {one_line(repr(new))} differs from the "
        f"baseline's {one_line(repr(old))} ({baseline_name}): another oracle judged it; run "
        f"{older_name} again with the suite that judged the other (reference version "
        f"{one_line(repr(newer.reference_version))}{at_revision})")


def _version_order(version) -> float:
    return float(version) if isinstance(version, (int, float)) else float("-inf")
