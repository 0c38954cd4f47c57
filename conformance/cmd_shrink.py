"""`flexconf shrink --backend NAME CASE_ID`: the smallest case that keeps a failure's label."""
from __future__ import annotations

from pathlib import Path


#: The run's options that shrinking takes too, declared where the plugin's are.
_RUN_OPTIONS = ("--seed", "--compile-timeout", "--run-timeout", "--reference-cache",
                "--reference-cache-size", "--cases-module")


def add_arguments(parser) -> None:
    from records.files import NonEmpty

    parser.add_argument("case", metavar="CASE_ID", help="a case id, or a case spec file "
                        "(SPEC.json, e.g. a saved fuzz failure)")
    parser.add_argument("--backend", required=True, action=NonEmpty,
                        what="a backend (flexconf backends lists them)",
                        help="a registered backend or package.module:object")
    from conformance.options import add_arguments as add_run_options

    add_run_options(parser, _RUN_OPTIONS)
    parser.set_defaults(seed=None)  # not given: a saved fuzz failure's own seed, else 0
    parser.add_argument("--max-cases", type=int, default=60, help="at most this many "
                        "executions; default 60")
    parser.add_argument("--out", default="reports/shrink", action=NonEmpty,
                        what="a directory", help="where results.json (every try) and "
                        "smallest.json go; default reports/shrink")


def run(args) -> int:
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import resolve_backend
    from conformance.executor import Executor, Settings
    from conformance.cache_dirs import check_reference_cache
    from conformance.options import option_value
    from conformance.reference_cache import ReferenceCache
    from conformance.run_info import case_file_command, import_paths, repro_command
    from conformance.runner import run_environment
    from conformance.shrink import case_from_argument, shrink, spec_seed, write_outcome

    found_with = spec_seed(args.case)  # a saved fuzz failure's own seed, unless --seed says
    seed = option_value("--seed", args.seed) if args.seed is not None or found_with is None \
        else found_with
    modules = option_value("--cases-module", args.cases_module)  # with the installed ones
    settings = Settings(compile_timeout=option_value("--compile-timeout", args.compile_timeout),
                        run_timeout=option_value("--run-timeout", args.run_timeout), seed=seed,
                        cases_modules=modules)
    reference_dir = option_value("--reference-cache", args.reference_cache, Path.cwd())
    case = case_from_argument(args.case, list(modules))
    backend = resolve_backend(args.backend)
    check_arguments(args)
    check_reference_cache(reference_dir, args.reference_cache is not None)
    reference = ReferenceCache(reference_dir,
                               option_value("--reference-cache-size", args.reference_cache_size))
    executor = Executor(backend, args.backend, WorkerSlot(0, 1), settings, reference,
                        worker="shrink")
    try:
        result = shrink(case, executor.execute, args.max_cases)
    finally:
        executor.close()
    options = {"backend": backend.name, "backend_requested": args.backend, "profile": "shrink",
               "seed": seed, "compile_timeout": settings.compile_timeout,
               "run_timeout": settings.run_timeout, "compile_cache": "cold",
               "cases_modules": list(modules)}
    options.update(import_paths(args.backend, modules))
    paths = write_outcome(result, Path(args.out), run_environment(backend, 1), options)
    smallest = result.smallest
    rerun = case_file_command(paths["spec"], args.backend, seed, modules,
                              Path(args.out) / "rerun")
    budget = f" (stopped at --max-cases {args.max_cases})" if result.out_of_budget else ""
    print(f"original  {result.original.case_id}: {result.original.label.value}")
    if found_with is not None:
        print(f"seed      {seed}" + (" (the fuzz failure's own)" if seed == found_with else
                                     f" (--seed; the fuzz failure was found with {found_with})"))
    print(f"tried     {len(result.tried)} cases in {result.passes} passes{budget}")
    print(f"smallest  {smallest.case_id}: {smallest.label.value}")
    print(f"spec      {paths['spec']}")
    print(f"results   {paths['results']}")
    # a module:object backend and the case modules are loaded again by both commands: from
    # where shrink found them
    print(f"rerun     {rerun}")
    print(f"repro     {repro_command(options, paths['results'], smallest.case_id)}")
    return 0


def check_arguments(args) -> None:
    """Bad --max-cases or --out: one line (ValueError: exit 2) before any case runs. An --out
    whose results.json would replace a run's (a run's report directory: its index.html and
    summary.md would contradict it) is refused as ``flexconf merge -o`` refuses it."""
    from records.files import directory_problem
    from records.store import results_overwrite_problem
    from records.text import one_line

    if args.max_cases < 1:
        raise ValueError(f"--max-cases {args.max_cases} is below 1; give how many executions "
                         "to allow at most, e.g. --max-cases 60")
    problem = directory_problem(Path(args.out))
    if problem:
        raise ValueError(f"--out {one_line(args.out)}: {problem}; give a directory this user "
                         "can write, e.g. --out reports/shrink")
    results = Path(args.out) / "results.json"
    problem = results_overwrite_problem(results, "shrink", "a shrink",
                                        lambda options: options.get("profile") == "shrink")
    if problem:
        raise ValueError(f"--out {one_line(args.out)} (its results.json): {problem}; give "
                         "shrink a directory of its own, e.g. --out reports/shrink")
    if not _a_smallest_spec_or_none(Path(args.out) / "smallest.json"):
        raise ValueError(f"--out {one_line(args.out)}: its smallest.json exists and is not a "
                         "spec shrink wrote (it would be overwritten); give shrink a directory "
                         "of its own, e.g. --out reports/shrink")


def _a_smallest_spec_or_none(path: Path) -> bool:
    """Whether shrink may write its smallest.json over ``path``: there is none (or a link,
    replaced, or an empty file), or it is an earlier shrink's ({"cases": [one spec]})."""
    import json

    if path.is_symlink() or not path.is_file():
        return True
    try:
        if path.stat().st_size == 0:
            return True
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and set(data) == {"cases"} and isinstance(data["cases"], list) \
        and len(data["cases"]) == 1
