"""`flexconf list`: the case ids of a matrix, one per line, nothing else on stdout."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cases.catalog import MATRICES

    parser.add_argument("--profile", default="full", help="full (default) or smoke")
    parser.add_argument("--matrix", default="core",
                        help=f"{', '.join(MATRICES)} (default core; custom: the case modules' "
                             "cases alone)")
    parser.add_argument("--cases-module", action="append", default=[], metavar="MODULE",
                        help="add the cases of this case module (repeatable; installed case "
                             "modules are added too), as `pytest --cases-module` does")


def run(args: argparse.Namespace) -> int:
    from cases.catalog import MATRICES, check_profile
    from cases.custom import select_cases
    from cases.names import entry_point_case_modules

    check_profile(args.profile)
    if args.matrix not in MATRICES:
        raise ValueError(f"--matrix {args.matrix!r} is unknown; use one of: {', '.join(MATRICES)}")
    modules = list(dict.fromkeys(args.cases_module + entry_point_case_modules()))
    for case in select_cases(args.profile, args.matrix, modules):
        print(case.id)
    return 0
