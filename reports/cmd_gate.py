"""`flexconf gate --baseline OLD.json --candidate NEW.json [--expectations FILE]
[--compile-time-budget 1.25] [--markdown OUT.md] [--strict-expectations]`.

Exit status: 0 the candidate may ship, 1 it may not, 2 bad input (the message says which).
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
    parser.add_argument("--strict-expectations", action="store_true",
                        help="stale expectations (failures that no longer happen) block too")


def run(args: argparse.Namespace) -> int:
    from reports.expectations import load_expectations
    from reports.gate import check_comparable, decide, gate_markdown, gate_text
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
    return decision.exit_code
