"""`flexconf`: the command-line entry point. Each subcommand lives in its own module,
imported only when used (so `flexconf gate` never imports torch)."""
from __future__ import annotations

import argparse
import importlib
import sys

from records.text import one_line

#: subcommand name -> module with ``add_arguments(parser)`` and ``run(args) -> int``
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("conformance.cmd_list", "print the case ids of a matrix, one per line"),
    "report": ("reports.cmd_report", "render the HTML report and summary.md from results files"),
    "gate": ("reports.cmd_gate", "may a candidate run ship? exit 0 yes, 1 no, 2 bad input"),
    "expectations": ("reports.cmd_expectations", "maintain the known-failures file"),
    "recover": ("reports.cmd_recover", "write the results and report of a killed run from its records"),
    "merge": ("conformance.cmd_merge", "join the results.json of the shards of one run"),
    "backends": ("conformance.cmd_backends", "list every backend, whether it runs here, and why not"),
    "repro": ("conformance.cmd_repro", "write a standalone script (torch only) that reproduces one case"),
    "shrink": ("conformance.cmd_shrink", "find the smallest case that keeps a failure's label"),
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line that names the bad value and where the usage is, not
    argparse's usage block first (its subcommands' parsers are of this class too)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}; see {self.prog} -h\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the top level has no options but -h, so the first word is the command; only its module
    # is imported (another's arguments may need torch: list's name the matrices)
    chosen = next((word for word in argv if not word.startswith("-")), None)
    parser = _OneLineParser(prog="flexconf", description="FlexAttention conformance suite")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    module, parsers = None, {}
    for name, (module_name, help_text) in COMMANDS.items():
        # no abbreviations: a script that splits options by name (release_gate.sh) must see
        # every option spelled out, and a prefix must never become another option
        parsers[name] = cmd_parser = sub.add_parser(name, help=help_text, description=help_text,
                                                    allow_abbrev=False)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(cmd_parser)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's parser, whose -h lists what it takes
        parsers.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:  # `flexconf list | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except (ValueError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"flexconf {args.command}: error: {one_line(message)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
