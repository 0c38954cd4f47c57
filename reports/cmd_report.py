"""`flexconf report RESULTS.json [MORE.json ...] [--baseline OLD.json] -o DIR`: render the
report again from results files; several runs (oldest first) are shown side by side."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from records.files import NonEmpty

    parser.add_argument("results", nargs="+", metavar="RESULTS.json", action=NonEmpty,
                        what="a run's results.json",
                        help="results of one run, or of several runs, oldest first")
    parser.add_argument("--baseline", metavar="OLD.json", action=NonEmpty,
                        what="a run's results.json",
                        help="compare against this run (default with several runs: the one "
                             "before the last)")
    parser.add_argument("-o", "--output", metavar="DIR", default=None, action=NonEmpty,
                        what="a directory",
                        help="directory for index.html and summary.md (default: the directory "
                             "of the last RESULTS.json, the run the report describes)")


def run(args: argparse.Namespace) -> int:
    from reports.render import write_runs_report
    from records.results import load_results
    from records.store import refuse_if_run_going_on

    if args.output is None:  # beside the run it describes: never contradicting another's
        args.output = str(Path(args.results[-1]).parent)
    check_output(args.output)
    refuse_if_run_going_on(args.output, "index.html and summary.md")
    runs = [load_results(path) for path in args.results]
    refuse_another_runs_directory(args.output, runs[-1])
    refuse_foreign_pages(args.output)
    refuse_a_baseline_that_is_the_run(args.baseline, args.results[-1])
    baseline = load_results(args.baseline) if args.baseline else None
    refuse_a_copy_of_the_run(args.baseline, baseline, runs[-1])
    write_runs_report(runs, args.output, names=_names(args.results), baseline=baseline,
                      baseline_name=args.baseline or "baseline")
    print(Path(args.output) / "index.html")
    if baseline is not None:
        import sys

        from records.selection import run_differences
        from records.text import one_line

        differences = run_differences(baseline, runs[-1])
        if differences:  # shown, not refused: a report may compare what a gate may not
            what, old, new = differences[0]
            print(one_line(f"note: --baseline {args.baseline} is no release comparison ({what} "
                           f"{old} there, {new} here); the report says so, and flexconf gate "
                           "refuses the pair"), file=sys.stderr)
    return 0


def refuse_a_baseline_that_is_the_run(baseline: str | None, described: str) -> None:
    """A --baseline that is the file of the run the report describes: compared with itself
    it shows "0 regressions" (the gate refuses the same pair). One line (ValueError: exit 2)."""
    import os

    from records.text import one_line

    if baseline and Path(baseline).exists() and Path(described).exists() \
            and os.path.samefile(baseline, described):
        raise ValueError(f"--baseline {one_line(baseline)} is the results file of the run the "
                         "report describes, and a run compared with itself shows nothing; give "
                         "the baseline run's results.json")


def refuse_a_copy_of_the_run(name: str | None, baseline, described) -> None:
    """A --baseline that is a copy of the described run (the same start on the same host), as
    the gate refuses it. One line (ValueError: exit 2)."""
    from reports.gate_inputs import same_run
    from records.text import one_line

    if baseline is not None and same_run(baseline, described):
        raise ValueError(f"--baseline {one_line(name)} is a copy of the run the report describes "
                         f"(started {one_line(baseline.started_at)}), and a run compared with "
                         "itself shows nothing; give the baseline run's results.json")


def check_output(output: str) -> None:
    """A -o that cannot be a directory for the report: one line (ValueError: exit 2), before
    anything is read or written (a missing directory is made when the report is written, so
    a command refused for its inputs leaves none behind)."""
    from records.files import output_directory_problem
    from records.text import one_line

    problem = output_directory_problem(Path(output))
    if problem:
        raise ValueError(f"-o {one_line(output)}: {problem}; give a directory this user can "
                         "write, e.g. -o reports/compare")


def refuse_another_runs_directory(output: str, main) -> None:
    """A -o that holds the results.json of another run than the one the report describes
    (the last given): its index.html and summary.md would then contradict the results.json
    beside them (a CI job posting summary.md would post another run's verdict). One line."""
    from records.files import UserFileError
    from records.results import load_results
    from records.text import one_line

    from records.store import unreported_run

    killed = unreported_run(output) if Path(output).is_dir() else None
    if killed is not None:  # its pages would read as the killed run's, beside its records
        raise ValueError(f"-o {one_line(output)} holds the records of a run that stopped "
                         f"without writing its results (started {killed.started_at}), which "
                         f"a report there would read as; keep them first with flexconf recover "
                         f"{one_line(output)}, or give a directory of its own, e.g. -o "
                         "reports/compare")
    beside = Path(output) / "results.json"
    if not beside.is_file():
        return
    try:
        same = load_results(beside).to_json() == main.to_json()
    except UserFileError:
        same = False
    if not same:
        raise ValueError(f"-o {one_line(output)} holds the results.json of another run, which "
                         "its index.html and summary.md would then contradict; give a "
                         "directory of its own, e.g. -o reports/compare")


def refuse_foreign_pages(output: str) -> None:
    """A -o that holds an index.html or summary.md that no report of this suite wrote (the
    user's own pages, which the report would overwrite): one line."""
    from reports.render import foreign_report_file
    from records.text import one_line

    stray = foreign_report_file(output)
    if stray is not None:
        raise ValueError(f"-o {one_line(output)} holds {stray.name}, which no report of this "
                         "suite wrote and the report would overwrite; give a directory of its "
                         "own, e.g. -o reports/compare")


def _names(paths: list[str]) -> list[str]:
    """Short, distinct names: the file names, or the paths when file names repeat."""
    names = [Path(p).name for p in paths]
    return names if len(set(names)) == len(names) else list(paths)
