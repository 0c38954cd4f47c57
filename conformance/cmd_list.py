"""`flexconf list`: the case ids of a matrix, one per line, nothing else on stdout."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="full", help="full (default) or smoke")
    parser.add_argument("--matrix", default="core", help="core (default)")


def run(args: argparse.Namespace) -> int:
    from cases.catalog import check_profile, matrix

    check_profile(args.profile)
    for case in matrix(args.profile, args.matrix):
        print(case.id)
    return 0
