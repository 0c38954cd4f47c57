"""The suite's own tests: pytest-timeout as the outer safety net.

Tests wait for events (a pid file, a process exit), never for fixed seconds; this limit only
turns a test that hangs (a child that never exits, a deadlock) into a failure with a stack
trace instead of a CI job that runs until it is cancelled. It is generous on purpose: a loaded
2-core machine runs the slowest test in well under a tenth of it. Only ``tests/`` gets it: the
conformance matrix (``pytest conformance/``) has its own per-phase budgets.

Under xdist, each test worker keeps to its share of the cores: ``OMP_NUM_THREADS`` (which every
run a test starts inherits, and conformance.backends.base.threads_per_worker keeps as a cap)
and its own torch's intra-op threads. Without it, two workers on a 2-core machine each ran
two-thread torch operations: their OpenMP threads spun waiting for a core, and three numeric
test files took 134 CPU-seconds instead of 89 (docs/performance.md, "The test suite").
"""
from __future__ import annotations

import os
import sys

import pytest

#: seconds; a test may set its own with @pytest.mark.timeout(N)
TEST_TIMEOUT = 900


def pytest_configure(config) -> None:
    from conformance.backends.base import WorkerSlot, omp_thread_cap, threads_per_worker

    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or omp_thread_cap() is not None:
        return  # one process has the machine; a user's own cap is kept
    import torch

    threads = threads_per_worker(WorkerSlot(0, int(workerinput["workercount"])))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test's own flex_attention calls start from no earlier test's Dynamo graphs, as each
    case of a run does (the child resets Dynamo: conformance/child.py), and a captured float is a
    constant of the graph traced for it, as in a case's own first call: eager flex_attention
    traces its calls with Dynamo, and a call that recompiles a graph takes the captured floats
    that changed as symbolic, which torch 2.15.0 fails (docs/findings.md, finding 10); tests
    call it in-process with many mods and floats (a judge of the oracle). Each value of a float
    is then its own graph. Only in a process that imported torch (collecting the test modules
    does, in all but the torch-free ones): the first such test imports Dynamo (about 1 s)."""
    if "torch" not in sys.modules:
        yield
        return
    import torch._dynamo

    torch._dynamo.reset()
    with torch._dynamo.config.patch(specialize_float=True):
        yield


def pytest_collection_modifyitems(config, items) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return  # pytest-timeout is a test extra; without it the tests still run
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))
