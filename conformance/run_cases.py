"""The cases of one run, from its options: the matrix (or a case file), narrowed by
``--case-id``, and the ids of its ``--shard`` part; one line naming the fix for an id that is
in none of them (conformance/plugin.py asks, once per process)."""
from __future__ import annotations

import shlex

from cases.model import FUZZ_PREFIX
from conformance import options as opts
from records.text import one_line


def select_run_cases(options: opts.RunOptions) -> list:
    """The cases of the run (all its shards), in order; ValueError, one line, for a bad
    case file, case module or --case-id."""
    from cases.custom import import_case_modules, select_cases
    from conformance.case_file import load_case_file

    if options.case_file:  # a spec may name a custom variant: register its module first
        from cases.variants import registered_variants

        import_case_modules(list(options.cases_modules))
        cases = load_case_file(options.case_file, registered_variants())
    else:
        cases = select_cases(options.profile, options.matrix, list(options.cases_modules),
                             fuzzing=options.fuzz_examples > 0)
    if not options.case_ids:
        return cases
    by_id = {case.id: case for case in cases}
    unknown = [cid for cid in options.case_ids if cid not in by_id]
    if unknown:
        source = f"--case-file {options.case_file}" if options.case_file else \
            f"--matrix {options.matrix} --profile {options.profile}"

        elsewhere = matrix_of(unknown[0], options.cases_modules)
        fix = (f"it is a case of {elsewhere}: give those" if elsewhere else
               "a fuzzed case is in no matrix: rerun it with flexconf repro RESULTS_JSON "
               f"{shlex.quote(one_line(unknown[0]))}, or its saved spec with --case-file "
               "(docs/cases.md)"
               if unknown[0].startswith(FUZZ_PREFIX) else
               "flexconf list prints the ids (give the same --matrix, --profile and "
               "--cases-module)")
        raise ValueError(f"--case-id {one_line(unknown[0])!r} is not a case of {source}; {fix}")
    return [by_id[cid] for cid in options.case_ids]


def matrix_of(case_id: str, cases_modules) -> str | None:
    """``--matrix M --profile P`` of a matrix that has ``case_id`` (with these case modules),
    or None."""
    from cases.catalog import PROFILES
    from cases.custom import select_cases

    for profile in PROFILES:
        for name in ("core", "extended", "custom"):
            try:
                ids = {c.id for c in select_cases(profile, name, list(cases_modules))}
            except ValueError:  # "custom" without a case module
                continue
            if case_id in ids:
                return f"--matrix {name} --profile {profile}"
    return None


def shard_case_ids(cases: list, options: opts.RunOptions) -> set[str] | None:
    """The ids of the cases of ``options.shard`` (split over the whole matrix, so -k selects
    within the part), None without --shard."""
    if options.shard is None:
        return None
    from conformance.sharding import select_shard

    index, count = options.shard
    return {c.id for c in select_shard(cases, index, count)}
