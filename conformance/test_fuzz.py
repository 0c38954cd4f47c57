"""Fuzzing: ``pytest conformance/ --fuzz-examples N`` draws N variants on odd shapes
(conformance/fuzz_grammar.py: composed variants, and the variants case modules give through
``fuzz_variants``; with ``--matrix custom`` only the latter) in the modes and dtypes the backend
runs, and runs each through this worker's supervised executor and the verdict, like a matrix
case. Each example is a record of results.json under the id ``fuzz/<case id>``; ``-v`` prints
each one's id and label as it goes (without ``-n``: xdist workers have no terminal). A failure
is shrunk to a minimal case (the shrinking's executions are not recorded, the minimal case is)
and saved as a case spec under ``<report-dir>/fuzz-failures/``; the failure message gives the
command that reruns it. Without ``--fuzz-examples`` (or with 0) the test is skipped.
``--seed`` makes a run repeatable; ``--resume`` fuzzes again, replaying the examples the run
had finished (conformance/fuzz_log.py).
"""
import pytest


def test_fuzz(request, conformance_options):
    options = conformance_options
    if options.fuzz_examples <= 0:
        pytest.skip("fuzzing is off; pass --fuzz-examples N (N > 0) to run N drawn variants")
    from conformance.fuzz_log import FuzzLog

    runner = request.getfixturevalue("conformance_runner")
    log = FuzzLog(request.config, runner)
    with log.search_ends():  # a run that fuzzes is complete once this returns or fails
        _fuzz(options, runner, log)


def _fuzz(options, runner, log) -> None:
    from cases.custom import fuzz_variant_sources
    from conformance.fuzz import runnable, save_failure, search
    from conformance.run_info import case_file_command

    sources = fuzz_variant_sources(list(options.cases_modules))
    only_custom = options.matrix == "custom"
    if only_custom and not sources:
        log.fail("--matrix custom fuzzes only case modules' variants, and no case module "
                 "defines fuzz_variants(shape); define one (docs/cases.md)")
    backend = runner.backend_name if options.backend == "auto" else options.backend
    unsupported = _asked_within(runner.executor.backend, options.run_timeout, log)
    can_run = runnable(unsupported)
    log.start(options.fuzz_examples, runner.backend_name, can_run)
    if not can_run.modes:
        log.skip(f"{runner.backend_name} runs no mode or dtype the fuzzer draws: "
                 + "; ".join(can_run.refusals()))
    result = search(log.execute, options.fuzz_examples, options.seed, modes=can_run.modes,
                    unsupported=unsupported,
                    dtypes=can_run.dtypes, sources=sources, with_composed=not only_custom)
    log.finish(result)
    if result.failure is None and log.failed_reruns:  # not drawn again: not shrunk either
        rerun = log.failed_reruns[0]
        first = rerun.message.splitlines()[0] if rerun.message else ""
        log.fail(f"[{rerun.label.value}] fuzzed case {rerun.case_id}, cut off when the run "
                 f"stopped and run again by itself: {first}".rstrip(": "))
    if result.failure is None:
        return
    record = result.failure
    spec = save_failure(record, options.report_dir, backend, options.seed)
    first = (record.message or "").splitlines()[0] if record.message else ""
    lines = [f"[{record.label.value}] fuzzed case {record.case_id}: {first}".rstrip(": "),
             *_found_as(result, record),
             f"minimal case after {result.examples_run} executions: {spec}",
             "run it again: " + case_file_command(
                 spec, backend, options.seed, options.cases_modules,
                 f"{str(options.report_dir).rstrip('/')}-fuzz-rerun")]
    if result.flaky:
        lines.append(f"note: the failure did not repeat when replayed ({result.flaky})")
    log.fail("\n".join(lines))


def _found_as(result, minimal) -> list[str]:
    """Where the search met the failure, when shrinking moved away from it, and the other
    failures it met on the way (shrinking keeps only the first one's label)."""
    from records.errors import is_not_judged

    failing = [r for r in result.tried if not (r.label.acceptable or is_not_judged(r))]
    lines = []
    found = next((r for r in failing if r.label is minimal.label), None)
    if found is not None and found.case_id != minimal.case_id:
        lines.append(f"found as {found.case_id}, shrunk to the case above (same label)")
    others: dict[str, list[str]] = {}
    for rec in failing:
        if rec.label is not minimal.label:
            others.setdefault(rec.label.value, []).append(rec.case_id)
    if others:
        lines.append("also met while searching (not recorded): " + "; ".join(
            f"{label} x{len(ids)} (e.g. {ids[0]})" for label, ids in sorted(others.items())))
    return lines


def _asked_within(backend, timeout: float, log):
    """The backend's unsupported_reason as the fuzzer asks it, within the run budget (it runs
    in this worker, outside the watched child): a hook that hangs or raises fails the fuzzing
    test in one line instead of stopping the run."""
    from conformance.backends.registry import HookTimeout, unsupported_reason_of

    def unsupported(case):
        try:
            reason, failure = unsupported_reason_of(backend, case, timeout)
        except HookTimeout as hung:  # failed below, outside this block: one message, no chain
            reason, failure = None, str(hung)
        if failure:
            log.fail(f"fuzzing on {backend.name}: {failure.splitlines()[0]}")
        return reason
    return unsupported
