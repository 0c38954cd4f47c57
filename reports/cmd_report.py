"""`flexconf report RESULTS.json [MORE.json ...] [--baseline OLD.json] -o DIR`: render the
report again from results files; several runs (oldest first) are shown side by side."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS.json",
                        help="results of one run, or of several runs, oldest first")
    parser.add_argument("--baseline", metavar="OLD.json",
                        help="compare against this run (default with several runs: the one "
                             "before the last)")
    parser.add_argument("-o", "--output", metavar="DIR", default="reports/latest",
                        help="directory for index.html and summary.md (default reports/latest)")


def run(args: argparse.Namespace) -> int:
    from reports.render import write_runs_report
    from records.results import load_results
    from records.store import refuse_if_run_going_on

    check_output(args.output)
    refuse_if_run_going_on(args.output, "index.html and summary.md")
    runs = [load_results(path) for path in args.results]
    baseline = load_results(args.baseline) if args.baseline else None
    write_runs_report(runs, args.output, names=_names(args.results), baseline=baseline,
                      baseline_name=args.baseline or "baseline")
    print(Path(args.output) / "index.html")
    return 0


def check_output(output: str) -> None:
    """A -o that cannot be a directory for the report: one line (ValueError: exit 2), before
    anything is read or written (the directory is made when missing)."""
    from records.files import directory_problem
    from records.text import one_line

    problem = directory_problem(Path(output))
    if problem:
        raise ValueError(f"-o {one_line(output)}: {problem}; give a directory this user can "
                         "write, e.g. -o reports/latest")


def _names(paths: list[str]) -> list[str]:
    """Short, distinct names: the file names, or the paths when file names repeat."""
    names = [Path(p).name for p in paths]
    return names if len(set(names)) == len(names) else list(paths)
