"""`flexconf gate --baseline OLD.json --candidate NEW.json [--expectations FILE]
[--compile-time-budget 1.25] [--markdown OUT.md] [--json OUT.json] [--junit OUT.xml]
[--strict-expectations]`.

Exit status: 0 the candidate may ship, 1 it may not, 2 bad input (the message says which;
``--json`` and ``--junit`` then record the refusal).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, metavar="OLD.json",
                        help="results of the release that shipped")
    parser.add_argument("--candidate", required=True, metavar="NEW.json",
                        help="results of the release to judge")
    parser.add_argument("--expectations", metavar="FILE",
                        help="known failures (TOML); failures it lists do not block")
    parser.add_argument("--compile-time-budget", type=float, default=1.25, metavar="FACTOR",
                        help="a case may compile at most FACTOR times as long (default 1.25); "
                             "checked when both runs compiled cold")
    parser.add_argument("--compile-time-slack", type=float, default=0.5, metavar="SECONDS",
                        help="ignore compile-time growth of SECONDS or less (default 0.5)")
    parser.add_argument("--markdown", metavar="OUT.md",
                        help="also write the result as markdown (for a pull-request comment)")
    parser.add_argument("--json", metavar="OUT.json",
                        help="also write the decision as JSON: verdict, every finding with its "
                             "labels, times and the candidate's message, and the notes")
    parser.add_argument("--junit", metavar="OUT.xml",
                        help="also write the decision as JUnit XML: one test case per case "
                             "compared, failed by a blocking finding")
    parser.add_argument("--strict-expectations", action="store_true",
                        help="stale expectations (failures that no longer happen) block too")


def run(args: argparse.Namespace) -> int:
    try:
        return _judge(args)
    except ValueError as exc:  # bad input: the files say why, then the caller prints it (exit 2)
        _write_refusal(args, str(exc))
        raise


def _judge(args: argparse.Namespace) -> int:
    from reports.expectations import load_expectations
    from reports.gate import check_comparable, decide, gate_markdown, gate_text
    from reports.gate_json import gate_json, write_json
    from reports.junit import gate_junit
    from records.results import load_results

    baseline = load_results(args.baseline)
    candidate = load_results(args.candidate)
    check_comparable(baseline, candidate, args.baseline, args.candidate)
    expectations = load_expectations(args.expectations) if args.expectations else None
    decision = decide(baseline, candidate, expectations, args.compile_time_budget,
                      args.compile_time_slack, args.strict_expectations)
    sys.stdout.write(gate_text(decision, args.baseline, args.candidate))
    if args.markdown:
        Path(args.markdown).write_text(gate_markdown(decision, args.baseline, args.candidate),
                                       encoding="utf-8")
    if args.json:
        write_json(gate_json(decision, baseline, candidate, args.baseline, args.candidate),
                   args.json)
    if args.junit:
        Path(args.junit).write_text(gate_junit(decision, candidate, args.baseline,
                                               args.candidate), encoding="utf-8")
    return decision.exit_code


def _write_refusal(args: argparse.Namespace, error: str) -> None:
    from reports.gate_json import refusal_json, write_json
    from reports.junit import gate_refusal_junit

    if args.json:
        write_json(refusal_json(error, args.baseline, args.candidate), args.json)
    if args.junit:
        Path(args.junit).write_text(gate_refusal_junit(error), encoding="utf-8")
