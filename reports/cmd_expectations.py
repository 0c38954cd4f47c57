"""`flexconf expectations update RESULTS.json --expectations FILE`: add the run's new failures
under the "to triage" heading and drop the entries whose cases all pass now."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from records.files import NonEmpty

    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    update = actions.add_parser("update", help="bring FILE up to date with a run",
                                description=__doc__)
    update.add_argument("results", metavar="RESULTS.json", action=NonEmpty,
                        what="a run's results.json")
    update.add_argument("--expectations", required=True, metavar="FILE", action=NonEmpty,
                        what="an expectations file (TOML)",
                        help="the expectations file (created when absent)")
    update.add_argument("--dry-run", action="store_true",
                        help="print the new file instead of writing it")


def run(args: argparse.Namespace) -> int:
    from reports.expectations_update import update_expectations
    from records.files import (output_file_problem, parent_problem, read_text,
                               write_text_atomic)
    from records.results import load_results

    from records.text import one_line
    from reports.gate_inputs import not_a_whole_finished_run

    if not args.dry_run:  # where it writes, checked as flexconf merge -o checks it: now...
        _refuse_output(args.expectations, output_file_problem)
    results = load_results(args.results)
    problem = not_a_whole_finished_run(results, "update from")
    if problem:  # a part's failures and passes are not the run's: an entry would be wrong
        raise ValueError(f"{one_line(args.results)}: {problem}")
    path = Path(args.expectations)
    existed = path.exists()
    text = read_text(path, "pass a TOML expectations file (docs/gate.md), or a new path to "
                           "create one") if existed else ""
    update = update_expectations(text, results, str(path))
    if args.dry_run:
        print(update.text, end="")
    else:  # ...and its missing directories made just before writing
        _refuse_output(args.expectations, parent_problem)
        write_text_atomic(path, update.text)
    log = sys.stderr if args.dry_run else sys.stdout  # keep a dry run's stdout a valid file
    for entry in update.dropped:
        now = "passes now" if entry.line in update.passing else "fails otherwise now"
        print(f"dropped  {path}:{entry.line}  {entry.case} ({entry.label.value}): {now}",
              file=log)
    for rec in update.added:
        print(f"added    {one_line(rec.case_id)} ({rec.label.value}): to triage", file=log)
    for rec in update.fuzzed:
        print(f"not added {one_line(rec.case_id)} ({rec.label.value}): a fuzzed case, which no "
              "entry can name; rerun it from its spec (fuzz-failures/) and fix or report it",
              file=log)
    from reports.expectations import misspelt_backends, parse_expectations

    backend = results.options.get("backend", "")
    for entry in misspelt_backends(parse_expectations(text, str(path)), backend):
        print(f"note     {path}:{entry.line}  backend {entry.backend!r} is not the run's "
              f"{backend!r}: the entry applies to none of its cases; fix the name if it is "
              "meant", file=log)
    if not (update.added or update.dropped):  # made, it was not "up to date" (an audit)
        made = "would be created" if args.dry_run else "created"
        why = "no failure an entry can name" if update.fuzzed else "no failure to list"
        print(f"{path}: up to date" if existed else
              f"{path}: {made}, with no entry: the run has {why}", file=log)
    return 0


def _refuse_output(given: str, problem_of) -> None:
    """The expectations file cannot be written (records.files.output_file_problem before
    anything is read, parent_problem, which makes its missing directories, before it is
    written): ValueError, one line (exit 2)."""
    from records.text import one_line

    problem = problem_of(given)
    if problem:
        raise ValueError(f"--expectations {one_line(given)}: {problem}; give a path this user "
                         "can write, e.g. --expectations expectations.toml")
