"""`flexconf gate --baseline OLD.json --candidate NEW.json [--expectations FILE]
[--compile-time-budget 1.25] [--compile-time-slack 0.5] [--run-time-budget 1.25]
[--run-time-slack SECONDS] [--confirm auto|N] [--baseline-python PY] [--candidate-python PY]
[--confirm-dir DIR] [--confirm-max-cases K] [--markdown OUT.md] [--json OUT.json]
[--junit OUT.xml] [--strict-expectations]`.

Exit status: 0 the candidate may ship, 1 it may not, 2 bad input (the message says which;
``--json``, ``--junit`` and ``--markdown`` then record the refusal, each that can be written).
Where the gate writes is checked first (missing directories made): a path it cannot write is
bad input before anything is judged.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from records.files import NonEmpty

    parser.add_argument("--baseline", required=True, metavar="OLD.json", action=NonEmpty,
                        what="a run's results.json",
                        help="results of the release that shipped")
    parser.add_argument("--candidate", required=True, metavar="NEW.json", action=NonEmpty,
                        what="a run's results.json",
                        help="results of the release to judge")
    parser.add_argument("--expectations", metavar="FILE", action=NonEmpty,
                        what="an expectations file (TOML)",
                        help="known failures (TOML); failures it lists do not block")
    parser.add_argument("--compile-time-budget", type=float, default=1.25, metavar="FACTOR",
                        help="a case may compile at most FACTOR times as long (default 1.25); "
                             "checked when both runs compiled cold")
    parser.add_argument("--compile-time-slack", type=float, default=0.5, metavar="SECONDS",
                        help="ignore compile-time growth of SECONDS or less (default 0.5)")
    parser.add_argument("--run-time-budget", type=float, default=None, metavar="FACTOR",
                        help="with --run-time-slack: a case may run at most FACTOR times as "
                             "long (default 1.25)")
    parser.add_argument("--run-time-slack", type=float, default=None, metavar="SECONDS",
                        help="gate run times too (the median of the timed runs), ignoring growth "
                             "of SECONDS or less (finite); off by default")
    parser.add_argument("--confirm", default="auto", metavar="auto|N",
                        help="measure the cases of compile- and run-time findings again N "
                             "times per release, cold, side by side, and block only on the "
                             "findings the medians confirm; auto (the default): 3 times when "
                             "--baseline-python is given and each python has its run's "
                             "release, else the findings block unconfirmed and a note says "
                             "why; 0: never (one measurement per run decides)")
    parser.add_argument("--confirm-max-cases", type=int, default=None, metavar="K",
                        help="when confirming: measure at most K flagged cases again, those whose "
                             "time grew by the largest factor, compile and run taking turns "
                             "(default 20); the others stay unconfirmed and block")
    parser.add_argument("--candidate-python", metavar="PY", action=NonEmpty,
                        what="the path of a python",
                        help="when confirming: the python that has the candidate's release "
                             "installed (default: the one running the gate)")
    parser.add_argument("--baseline-python", metavar="PY", action=NonEmpty,
                        what="the path of a python",
                        help="the python that has the baseline's release installed: "
                             "with it, time findings are measured again on both releases "
                             "(--confirm)")
    parser.add_argument("--confirm-dir", metavar="DIR", action=NonEmpty, what="a directory",
                        help="when confirming: keep the reruns' report directories here "
                             "(default: a temporary directory, removed after)")
    parser.add_argument("--markdown", metavar="OUT.md", action=NonEmpty, what="a file path",
                        help="also write the result as markdown (for a pull-request comment)")
    parser.add_argument("--json", metavar="OUT.json", action=NonEmpty, what="a file path",
                        help="also write the decision as JSON: verdict, every finding with its "
                             "labels, times and the candidate's message, and the notes")
    parser.add_argument("--junit", metavar="OUT.xml", action=NonEmpty, what="a file path",
                        help="also write the decision as JUnit XML: one test case per case "
                             "compared, failed by a blocking finding")
    parser.add_argument("--strict-expectations", action="store_true",
                        help="stale expectations (failures that no longer happen) block too")


#: The files the gate writes: (flag, argparse attribute, an example name for the fix).
OUTPUTS = (("--markdown", "markdown", "gate.md"), ("--json", "json", "gate.json"),
           ("--junit", "junit", "gate.xml"))


def run(args: argparse.Namespace) -> int:
    usable, problems = prepare_outputs(args)  # before judging or measuring anything again
    try:
        if problems:
            raise ValueError(problems[0])
        return _judge(args)
    except ValueError as exc:  # bad input: the files say why, then the caller prints it (exit 2)
        _write_refusal(args, str(exc), usable)
        raise


def _judge(args: argparse.Namespace) -> int:
    from reports.expectations import load_expectations
    from dataclasses import replace

    from reports.gate import DEFAULT_BUDGET, Note, decide, gate_text
    from reports.gate_inputs import check_comparable
    from reports.gate_markdown import gate_markdown
    from reports.gate_json import gate_json, write_json
    from reports.junit import gate_junit
    from records.files import write_text_atomic
    from records.results import load_results

    check_confirm_arguments(args)
    prepare_confirm_dir(args)
    check_distinct_runs(args)
    baseline = load_results(args.baseline)
    candidate = load_results(args.candidate)
    check_comparable(baseline, candidate, args.baseline, args.candidate)
    expectations = load_expectations(args.expectations) if args.expectations else None
    decision = decide(baseline, candidate, expectations, args.compile_time_budget,
                      args.compile_time_slack, args.strict_expectations,
                      DEFAULT_BUDGET if args.run_time_budget is None else args.run_time_budget,
                      args.run_time_slack)
    decision = _confirm(args, decision, baseline, candidate)
    if args.run_time_budget is not None and args.run_time_slack is None:  # said, not silent
        decision = replace(decision, notes=decision.notes + (Note(
            "RUN_TIME_BUDGET_UNUSED", f"--run-time-budget {args.run_time_budget:g} gates nothing "
            "without --run-time-slack (run times are not gated by default); add "
            "--run-time-slack SECONDS, e.g. 0.05, to gate them", flagged=True),))
    # the outputs first: one the disk refuses is the command's error (exit 2), and the verdict
    # is not printed above it (it said MAY SHIP, then failed: an outside audit)
    if args.markdown:
        write_text_atomic(args.markdown, gate_markdown(decision, args.baseline, args.candidate))
    if args.json:
        write_json(gate_json(decision, baseline, candidate, args.baseline, args.candidate),
                   args.json)
    if args.junit:
        write_text_atomic(args.junit, gate_junit(decision, candidate, args.baseline,
                                                 args.candidate))
    sys.stdout.write(gate_text(decision, args.baseline, args.candidate))
    return decision.exit_code


def prepare_outputs(args: argparse.Namespace) -> tuple[set[str], list[str]]:
    """Make the missing directories of the files the gate writes (as ``flexconf merge -o``
    does), before the verdict is printed or a case is measured again. Returns the outputs
    (argparse attributes) that can be written, and one line (exit 2) per one that cannot:
    the first is the gate's refusal, which the others record, so none keeps a verdict of
    an earlier gate there."""
    from records.files import output_file_problem, parent_problem
    from records.text import one_line

    usable: set[str] = set()
    problems: list[str] = []
    written: dict[Path, str] = {}
    for flag, attribute, example in OUTPUTS:
        path = getattr(args, attribute)
        if not path:
            continue
        fix = f"give a path this user can write, e.g. {flag} {example}"
        problem = output_file_problem(path) or parent_problem(path)  # as typed: a link is
        clash = _read_by(Path(path), args) or written.get(Path(path).resolve())  # replaced
        if problem:
            problems.append(f"{flag} {one_line(path)}: {problem}; {fix}")
        elif clash:
            problems.append(f"{flag} {one_line(path)}: it is the {clash} file, which the gate "
                            f"would overwrite; give another path, e.g. {flag} {example}")
        elif not _the_gates_to_overwrite(Path(path), attribute):
            problems.append(f"{flag} {one_line(path)}: it exists and is not a file flexconf "
                            f"gate wrote (it would be overwritten); give another path, e.g. "
                            f"{flag} {example}")
        else:
            usable.add(attribute)
            written[Path(path).resolve()] = flag
    return usable, problems


#: How each output the gate writes begins (its JSON is read whole: reformatting keeps it).
_MARKDOWN_HEAD, _JUNIT_HEAD = "## Release gate: ", '<testsuites name="flexconf gate"'
#: A gate's JSON is far smaller (findings of every case): a larger file is not read whole.
_LARGEST_GATE_JSON = 256 << 20


def _the_gates_to_overwrite(path: Path, attribute: str) -> bool:
    """Whether the gate may write its ``attribute`` output (markdown, json, junit) over
    ``path``: it does not exist, is a link (replaced, its target untouched), empty or no
    regular file (/dev/null is written into), or is that output of an earlier gate, whose
    verdict it replaces. Anything else would be lost:
    --markdown /etc/passwd replaced the machine's users, as root (an outside audit); repro -o
    and report -o refuse the same."""
    if path.is_symlink() or not path.is_file():
        return True
    try:
        size = path.stat().st_size
        if size == 0:
            return True
        if attribute == "json":
            if size > _LARGEST_GATE_JSON:
                return False
            from reports.gate_json import SCHEMA_NAME

            data = json.loads(path.read_bytes())
            return isinstance(data, dict) and data.get("schema") == SCHEMA_NAME
        with open(path, "rb") as f:
            head = f.read(256).decode("utf-8", errors="replace")
    except (OSError, ValueError, RecursionError):
        return False
    if attribute == "markdown":
        return head.startswith(_MARKDOWN_HEAD)
    return _JUNIT_HEAD in head


def prepare_confirm_dir(args: argparse.Namespace) -> None:
    """Make ``--confirm-dir``; ValueError, one line (exit 2), when it cannot be written."""
    from records.files import directory_problem
    from records.text import one_line

    problem = directory_problem(Path(args.confirm_dir)) if args.confirm_dir else None
    if problem:
        raise ValueError(f"--confirm-dir {one_line(args.confirm_dir)}: {problem}; give a "
                         "directory this user can write, e.g. --confirm-dir reports/confirm")


def _read_by(path: Path, args: argparse.Namespace) -> str | None:
    """The input flag (--baseline, --candidate, --expectations) whose file ``path`` is."""
    for flag, given in (("--baseline", args.baseline), ("--candidate", args.candidate),
                        ("--expectations", args.expectations)):
        if given and _same_file(path, Path(given)):
            return flag
    return None


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_distinct_runs(args: argparse.Namespace) -> None:
    """A run compared with itself shows nothing: one line (exit 2), not MAY SHIP."""
    from records.text import one_line

    if _same_file(Path(args.baseline), Path(args.candidate)):
        raise ValueError(f"--baseline and --candidate are the same file "
                         f"({one_line(args.candidate)}); give the baseline run's results.json "
                         "as --baseline and the candidate's as --candidate")


def check_confirm_arguments(args: argparse.Namespace) -> None:
    """One line naming the bad value and the fix (ValueError: exit 2). Sets ``args.repeats``
    from ``--confirm``: None for auto, else the count."""
    args.repeats = confirm_count(args.confirm)
    if args.confirm_max_cases is not None and args.confirm_max_cases < 1:
        raise ValueError(f"--confirm-max-cases {args.confirm_max_cases} is below 1; give how "
                         "many flagged cases to measure again at most, e.g. --confirm-max-cases 20")
    for flag, value in (("--baseline-python", args.baseline_python),
                        ("--candidate-python", args.candidate_python),
                        ("--confirm-dir", args.confirm_dir),
                        ("--confirm-max-cases", args.confirm_max_cases)):
        if value and args.repeats == 0:
            raise ValueError(f"{flag} {value} is used only when findings are measured again, "
                             "which --confirm 0 turns off; drop one of them")
    for flag, attribute in (("--baseline-python", "baseline_python"),
                            ("--candidate-python", "candidate_python")):
        value = getattr(args, attribute)
        problem = _python_problem(value) if value else None
        if problem:
            raise ValueError(f"{flag} {value!r} is not an executable python ({problem}); give "
                             "the path of the python that has that release installed, e.g. "
                             "/path/to/.tox/ENV/bin/python")
        if value:  # the reruns run elsewhere (the suite's root): the python checked here
            setattr(args, attribute, os.path.abspath(shutil.which(value)))


def confirm_count(text: str) -> int | None:
    """``--confirm``'s value: None for auto, else a count of 0 or more (ValueError)."""
    from records.text import one_line

    if text.strip().lower() == "auto":
        return None
    if not re.fullmatch(r"\s*-?[0-9]+\s*", text):
        raise ValueError(f"--confirm {one_line(text)!r} is not auto or a count; give how many "
                         "times to measure each flagged case again, e.g. --confirm 3, or "
                         "--confirm auto (the default)")
    count = int(text)
    if count < 0:
        raise ValueError(f"--confirm {count} is negative; give how many times to measure "
                         "each flagged case again, e.g. --confirm 3, or 0 for never")
    return count


def _python_problem(python: str) -> str | None:
    """Why ``python`` cannot run ``python -c 'import sys'`` (run once, here), None when it can."""
    import subprocess

    if not shutil.which(python):  # a directory named so is no file: say so, not "no such"
        return "a directory, not a python" if os.path.isdir(python) else "no such executable"
    try:
        proc = subprocess.run([python, "-c", "import sys"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"running it failed: {type(exc).__name__}"
    return None if proc.returncode == 0 else f"`-c 'import sys'` exited {proc.returncode}"


def _confirm(args, decision, baseline, candidate):
    """The decision with its time findings measured again as ``--confirm`` plans it
    (reports/confirm_plan.py), or, when they are not, a note saying why they block as they
    are. Nothing is probed or measured when there is no time finding."""
    from reports.confirm import (DEFAULT_MAX_CASES, confirm_decision, flagged_cases,
                                 only_fuzzed_flagged, remeasure)
    from reports.confirm_plan import plan_confirmation, unconfirmed_note

    cases = flagged_cases(decision, args.confirm_max_cases or DEFAULT_MAX_CASES)
    if not cases:
        return only_fuzzed_flagged(decision)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    plan = plan_confirmation(args.repeats, baseline, candidate, args.candidate_python,
                             args.baseline_python, progress=progress)
    if not plan.repeats:
        return unconfirmed_note(decision, plan)
    progress(f"confirm: {len(cases)} flagged case{'s' if len(cases) != 1 else ''} measured "
             f"again {plan.repeats} time{'s' if plan.repeats != 1 else ''}, cold, for the "
             + " and the ".join(side.name for side in plan.sides)
             + (" (--confirm auto; --confirm 0 skips this)" if args.repeats is None else ""))
    if args.confirm_dir:  # made, and checked, by prepare_confirm_dir
        workdir = Path(args.confirm_dir)
        measured = remeasure(list(plan.sides), cases, plan.repeats, workdir, progress=progress)
    else:
        with tempfile.TemporaryDirectory(prefix="flexconf-confirm-") as tmp:
            measured = remeasure(list(plan.sides), cases, plan.repeats, Path(tmp),
                                 progress=progress)
    return confirm_decision(decision, measured)


def _write_refusal(args: argparse.Namespace, error: str, usable: set[str]) -> None:
    from reports.gate_json import refusal_json, write_json
    from reports.gate_markdown import gate_refusal_markdown
    from reports.junit import gate_refusal_junit
    from records.files import write_text_atomic

    if "markdown" in usable:
        write_text_atomic(args.markdown,
                          gate_refusal_markdown(error, args.baseline, args.candidate))
    if "json" in usable:
        write_json(refusal_json(error, args.baseline, args.candidate), args.json)
    if "junit" in usable:
        write_text_atomic(args.junit, gate_refusal_junit(error))
