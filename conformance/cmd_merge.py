"""`flexconf merge A.json B.json ... -o results.json`: join the shards of one run.

Exit status: 0 merged, every case of the recorded selection exactly once; 1 merged and
written, but cases are duplicated or missing, or a file is of a run that did not finish
(listed); 2 refused (mixed versions, profiles,
backends, matrices, -k/-m selections, shard counts, ...) or unreadable input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SHOW = 10  # ids listed per problem; the rest are counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from records.files import NonEmpty

    parser.add_argument("inputs", nargs="+", metavar="RESULTS.json", action=NonEmpty,
                        what="a run's results.json",
                        help="the results.json of every shard (--shard I/N) of one run")
    parser.add_argument("-o", "--output", required=True, metavar="RESULTS.json",
                        action=NonEmpty, what="a file path",
                        help="where to write the merged results")


def run(args: argparse.Namespace) -> int:
    from conformance.merge import merge_runs
    from records.files import output_file_problem, parent_problem
    from records.results import load_results, write_results
    from records.store import refuse_if_run_going_on
    from records.text import one_line

    problem = output_file_problem(args.output)
    if problem:
        raise ValueError(f"-o {one_line(args.output)}: {problem}; give a path this user can "
                         "write, e.g. -o results.json")
    refuse_if_run_going_on(Path(args.output).parent, "the merged results.json")
    _refuse_repeated_paths(args.inputs, args.output)
    _refuse_a_runs_own_results(args.output)
    runs = [(path, load_results(path)) for path in args.inputs]
    merged = merge_runs(runs)
    unfinished = {source: run for source, run in runs if source in merged.incomplete}
    problem = parent_problem(args.output)
    if problem:
        raise ValueError(f"-o {one_line(args.output)}: {problem}; give a path this user can "
                         "write, e.g. -o results.json")
    write_results(merged.results, args.output)
    results = merged.results
    counts: dict[str, int] = {}
    for record in results.records:
        counts[record.label.value] = counts.get(record.label.value, 0) + 1
    tally = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    shards = ", ".join(results.options.get("merged_shards") or [])
    from reports.formatting import recorded_of_selected

    print(f"merged {len(runs)} file{'s' if len(runs) != 1 else ''} "  # fuzzed ones apart
          f"({'shards ' + shards if shards else 'unsharded'}): "
          f"{recorded_of_selected(results.records, None)}"
          f"{': ' + tally if tally else ''} -> {args.output}")
    for note in merged.notes:
        print(f"note: {note}", file=sys.stderr)
    if merged.duplicates:
        from reports.merge_facts import disagreeing, duplicated_cases

        copies = duplicated_cases(merged.results)
        differ = list(disagreeing(copies))
        print(f"duplicated: {len(merged.duplicates)} cases are in more than one file (the first "
              "finished failing copy is kept, else the first finished one)"
              f"{f', {len(differ)} with different labels' if differ else ''}:", file=sys.stderr)
        shown = differ + [cid for cid in merged.duplicates if cid not in set(differ)]
        for case_id in shown[:SHOW]:
            print(f"  {case_id}: " + ", ".join(f"{one_line(c.file)} ({c.label})"
                                               for c in copies[case_id]), file=sys.stderr)
        _more(len(merged.duplicates))
    if merged.missing_shards:
        print(f"missing: shard {', '.join(merged.missing_shards)} is in no file given",
              file=sys.stderr)
    for source, part in unfinished.items():
        if "merged_shards" in part.options:  # a merge: its parts are what can be finished
            print(f"incomplete: {one_line(source)} is a merge of parts not all finished "
                  "(complete: false); finish those with --resume and merge the parts again",
                  file=sys.stderr)
        else:
            print(f"incomplete: {one_line(source)} holds the results of a run that did not "
                  f"finish (complete: false); finish it ({_resume_hint(part)}), then merge "
                  "again", file=sys.stderr)
    if merged.missing:
        print(f"missing: {len(merged.missing)} cases of {merged.expected_from} are in no file:",
              file=sys.stderr)
        for case_id in merged.missing[:SHOW]:
            print(f"  {case_id}", file=sys.stderr)
        _more(len(merged.missing))
    return 0 if merged.clean else 1


def _refuse_repeated_paths(inputs: list[str], output: str) -> None:
    """An input given twice, or an output that is an input (which the merge would overwrite:
    the shard's own results gone): one line, before anything is read or written."""
    from records.text import one_line

    seen: dict[Path, str] = {}
    for path in inputs:
        resolved = Path(path).resolve()
        if resolved in seen:
            raise ValueError(f"{one_line(path)} is given twice (as {one_line(seen[resolved])}); "
                             "give each shard's results.json once")
        seen[resolved] = path
    if Path(output).resolve() in seen:
        raise ValueError(f"-o {one_line(output)}: it is one of the files to merge, which the "
                         "merge would overwrite; give another path, e.g. -o merged/results.json")


def _resume_hint(part) -> str:
    """The command that finishes the part where it ran (its recorded report directory), or
    the flag to use when the file does not say where that was."""
    from conformance.run_info import matrix_path
    from reports.summary import resume_command

    report_dir = part.options.get("report_dir")
    if not report_dir:
        return "--resume with its report directory and its options"
    return resume_command(part, report_dir, matrix_path())


def _refuse_a_runs_own_results(output: str) -> None:
    """An -o that is a run's own results.json (not an earlier merge's), or lies in a run's
    report directory (records.store.results_overwrite_problem): one line, before anything is
    read."""
    from records.store import results_overwrite_problem
    from records.text import one_line

    problem = results_overwrite_problem(output, "the merge", "a merge",
                                        lambda options: "merged_shards" in options)
    if problem:
        raise ValueError(f"-o {one_line(output)}: {problem}; give the merge a path of its own, "
                         "e.g. -o merged/results.json")


def _more(total: int) -> None:
    if total > SHOW:
        print(f"  ... and {total - SHOW} more", file=sys.stderr)
