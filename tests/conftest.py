"""The suite's own tests: pytest-timeout as the outer safety net.

Tests wait for events (a pid file, a process exit), never for fixed seconds; this limit only
turns a test that hangs (a child that never exits, a deadlock) into a failure with a stack
trace instead of a CI job that runs until it is cancelled. It is generous on purpose: a loaded
2-core machine runs the slowest test in well under a tenth of it. Only ``tests/`` gets it: the
conformance matrix (``pytest conformance/``) has its own per-phase budgets.
"""
from __future__ import annotations

import pytest

#: seconds; a test may set its own with @pytest.mark.timeout(N)
TEST_TIMEOUT = 900


def pytest_collection_modifyitems(config, items) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        return  # pytest-timeout is a test extra; without it the tests still run
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT))
