"""Test-only backends that are broken the ways third-party plugins break: each must make the
backend unavailable with the error's first line, never an INTERNALERROR."""
from __future__ import annotations

import threading

from conformance.backends.cpu import CpuEager


class RaisesInInit(CpuEager):
    name = "test-raises-in-init"

    def __init__(self):
        raise RuntimeError("driver handle not found\nTraceback line two\nline three")


class RaisesInAvailability(CpuEager):
    name = "test-raises-in-availability"

    def availability(self):
        raise KeyError("NEURON_RT_ROOT")


class AvailabilityABool(CpuEager):
    name = "test-availability-a-bool"

    def availability(self):
        return True


class ChildEnvNotText(CpuEager):
    name = "test-child-env-not-text"

    def child_env(self, slot, cache_dir):
        return {**super().child_env(slot, cache_dir), "ZAP_CORES": slot.count}


class RaisesInEnvironment(CpuEager):
    name = "test-raises-in-environment"

    def environment(self):
        raise FileNotFoundError("/opt/vendor/version.txt")


class EnvironmentNotADict(CpuEager):
    name = "test-environment-not-a-dict"

    def environment(self):
        return "vendor SDK 1.2"


class RaisesInUnsupportedReason(CpuEager):
    """Its unsupported_reason raises on causal cases (a lookup table without that variant)."""

    name = "test-raises-in-unsupported-reason"

    def unsupported_reason(self, case):
        if case.variant.name == "causal":
            raise KeyError(f"no support entry for {case.variant.name}")
        return super().unsupported_reason(case)


#: Lets HangsInUnsupportedReason's hook go once a test is done with it.
RELEASE_HUNG_HOOK = threading.Event()


class HangsInUnsupportedReason(CpuEager):
    """Its unsupported_reason never answers on alibi cases (a support query that waits on a
    lock, a device, a network): the hook runs in the worker, outside the watched child."""

    name = "test-hangs-in-unsupported-reason"

    def unsupported_reason(self, case):
        if case.variant.name == "alibi":
            RELEASE_HUNG_HOOK.wait(600)
        return super().unsupported_reason(case)


class HangsInUnsupportedReasonOnComposed(HangsInUnsupportedReason):
    """Its unsupported_reason never answers on the fuzzer's composed variants (the warm-up's
    causal case it answers)."""

    name = "test-hangs-in-unsupported-reason-on-composed"

    def unsupported_reason(self, case):
        if case.variant.name == "composed":
            RELEASE_HUNG_HOOK.wait(600)
        return None
