"""Fuzzing: ``pytest conformance/ --fuzz-examples N`` draws N composed variants on odd shapes
(conformance/fuzz_grammar.py) and runs each through this worker's supervised executor and the
verdict, like a matrix case. A failure is shrunk to a minimal case and saved as a case spec
under ``<report-dir>/fuzz-failures/``; the failure message gives the command that reruns it.
Without ``--fuzz-examples`` (or with 0) the test is skipped. ``--seed`` makes a run repeatable.

Fuzzed cases are not matrix cases: they are not written into results.json.
"""
from pathlib import Path

import pytest

from cases.model import MODES


def _option(config, name: str, default):
    value = config.getoption(name, default=default)
    return default if value is None else value


def test_fuzz(request):
    config = request.config
    text = _option(config, "--fuzz-examples", 0)
    try:
        examples = int(text)
    except (TypeError, ValueError):
        pytest.fail(f"--fuzz-examples {text!r} is not a whole number; write e.g. "
                    "--fuzz-examples 50", pytrace=False)
    if examples <= 0:
        pytest.skip("fuzzing is off; pass --fuzz-examples N (N > 0) to run N drawn variants")
    from conformance.fuzz import rerun_command, save_failure, search

    runner = request.getfixturevalue("conformance_runner")
    executor = runner.executor
    seed = int(_option(config, "--seed", 0))
    backend = str(_option(config, "--backend", "auto"))
    if backend == "auto":
        backend = runner.backend_name
    result = search(executor.execute, examples, seed, modes=MODES,
                    unsupported=executor.backend.unsupported_reason)
    if result.failure is None:
        return
    record = result.failure
    report_dir = Path(config.invocation_params.dir) / str(_option(config, "--report-dir",
                                                                   "reports/latest"))
    spec = save_failure(record, report_dir, backend, seed)
    first = (record.message or "").splitlines()[0] if record.message else ""
    lines = [f"[{record.label.value}] fuzzed case {record.case_id}: {first}".rstrip(": "),
             f"minimal case after {result.examples_run} executions: {spec}",
             f"run it again: {rerun_command(spec, backend, seed)}"]
    if result.flaky:
        lines.append(f"note: the failure did not repeat when replayed ({result.flaky})")
    pytest.fail("\n".join(lines), pytrace=False)
