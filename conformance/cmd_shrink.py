"""`flexconf shrink --backend NAME CASE_ID`: the smallest case that keeps a failure's label."""
from __future__ import annotations

import shlex
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("case", metavar="CASE_ID", help="a case id, or a case spec file "
                        "(SPEC.json, e.g. a saved fuzz failure)")
    parser.add_argument("--backend", required=True, help="a registered backend or "
                        "package.module:object")
    parser.add_argument("--seed", default="0", help="seed of the inputs; default 0")
    parser.add_argument("--compile-timeout", default="600", help="seconds per compile; default 600")
    parser.add_argument("--run-timeout", default="300", help="seconds per setup or run phase; "
                        "default 300")
    parser.add_argument("--max-cases", type=int, default=60, help="at most this many "
                        "executions; default 60")
    parser.add_argument("--out", default="reports/shrink", help="where results.json (every "
                        "try) and smallest.json go; default reports/shrink")
    parser.add_argument("--reference-cache", default=None, help="golden cache directory "
                        "(default: the suite's); 'none' disables")
    parser.add_argument("--cases-module", action="append", default=[], metavar="MODULE",
                        help="a case module defining the case's variant (repeatable)")


def run(args) -> int:
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import resolve_backend
    from conformance.executor import Executor, Settings
    from conformance.options import (DEFAULT_CACHE_ROOT, DEFAULT_REFERENCE_CACHE_BYTES,
                                     parse_seconds, parse_seed)
    from conformance.reference_cache import ReferenceCache
    from conformance.runner import run_environment
    from conformance.shrink import case_from_argument, shrink, write_outcome

    seed = parse_seed(args.seed)
    settings = Settings(compile_timeout=parse_seconds("--compile-timeout", args.compile_timeout),
                        run_timeout=parse_seconds("--run-timeout", args.run_timeout), seed=seed)
    case = case_from_argument(args.case, args.cases_module)
    backend = resolve_backend(args.backend)
    cache = args.reference_cache or str(DEFAULT_CACHE_ROOT / "reference")
    reference = ReferenceCache(None if cache == "none" else cache, DEFAULT_REFERENCE_CACHE_BYTES)
    executor = Executor(backend, args.backend, WorkerSlot(0, 1), settings, reference,
                        worker="shrink")
    try:
        result = shrink(case, executor.execute, args.max_cases)
    finally:
        executor.close()
    options = {"backend": backend.name, "backend_requested": args.backend, "profile": "shrink",
               "seed": seed, "compile_timeout": settings.compile_timeout,
               "run_timeout": settings.run_timeout, "compile_cache": "cold",
               "cases_modules": args.cases_module}
    paths = write_outcome(result, Path(args.out), run_environment(backend, 1), options)
    smallest = result.smallest
    rerun = ["pytest conformance/", f"--backend {shlex.quote(args.backend)}",
             f"--case-file {shlex.quote(str(paths['spec']))}"] + ([f"--seed {seed}"] if seed else [])
    budget = f" (stopped at --max-cases {args.max_cases})" if result.out_of_budget else ""
    print(f"original  {result.original.case_id}: {result.original.label.value}")
    print(f"tried     {len(result.tried)} cases in {result.passes} passes{budget}")
    print(f"smallest  {smallest.case_id}: {smallest.label.value}")
    print(f"spec      {paths['spec']}")
    print(f"results   {paths['results']}")
    print(f"rerun     {' '.join(rerun)}")
    print(f"repro     flexconf repro {shlex.quote(str(paths['results']))} "
          f"{shlex.quote(smallest.case_id)} -o repro.py")
    return 0
