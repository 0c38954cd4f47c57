"""`flexconf repro RESULTS.json CASE_ID -o repro.py`: write a standalone reproduction script."""
from __future__ import annotations


def add_arguments(parser) -> None:
    from records.files import NonEmpty

    parser.add_argument("results", action=NonEmpty, what="a run's results.json",
                        help="the results.json of the run")
    parser.add_argument("case_id", help="the id of the case to reproduce")
    parser.add_argument("-o", "--output", default="repro.py", action=NonEmpty,
                        what="a file path", help="the script to write (default repro.py)")
    parser.add_argument("--backend", default=None, action=NonEmpty,
                        what="a backend (flexconf backends lists them)",
                        help="run on this backend instead of the run's (a registered name "
                        "or package.module:object)")
    parser.add_argument("--cases-module", action="append", default=[], metavar="MODULE",
                        help="the case module of a custom variant (repeatable)")


def run(args) -> int:
    from pathlib import Path

    from conformance.backends.registry import import_root
    from conformance.kept_outputs import outputs_path
    from conformance.repro import write_repro
    from conformance.run_info import shell_command
    from records.files import output_file_problem, parent_problem
    from records.text import one_line

    problem = output_file_problem(args.output)
    if problem:
        raise ValueError(f"-o {one_line(args.output)}: {problem}; give a path this user can "
                         "write, e.g. -o repro.py")
    _refuse_a_file_of_another_kind(args.output)
    problem = parent_problem(args.output)
    if problem:
        raise ValueError(f"-o {one_line(args.output)}: {problem}; give a path this user can "
                         "write, e.g. -o repro.py")
    path, backend = write_repro(args.results, args.case_id, args.output, args.backend,
                                args.cases_module)
    # a module:object backend is not embedded: the script imports it from where it was found
    root = import_root(backend)
    env = {"PYTHONPATH": root} if root else {}
    command = shell_command(env, ["python", str(path)])
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB); run it with: {command}")
    kept = outputs_path(Path(args.results).parent, args.case_id)
    if kept.exists():
        print(f"the run kept this case's outputs: {kept}; compare with: "
              + shell_command(env, ["python", str(path), "--compare", str(kept)]))
    return 0


def _refuse_a_file_of_another_kind(output: str) -> None:
    """An -o that exists and is not a script flexconf repro wrote (the results file itself, a
    run's results.json, a file of the user's own): overwritten, it would be gone. One line."""
    from pathlib import Path

    from conformance.repro import SCRIPT_HEAD
    from records.text import one_line

    path = Path(output)
    if not path.exists():
        return
    try:
        with open(path, "rb") as f:
            ours = f.read(len(SCRIPT_HEAD)).decode("utf-8", errors="replace") == SCRIPT_HEAD
    except OSError:
        ours = False
    if not ours:
        raise ValueError(f"-o {one_line(output)}: it exists and is not a script flexconf repro "
                         "wrote (it would be overwritten); give another path, e.g. -o repro.py")
