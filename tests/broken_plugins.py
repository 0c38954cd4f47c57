"""Test-only backends that are broken the ways third-party plugins break: each must make the
backend unavailable with the error's first line, never an INTERNALERROR."""
from __future__ import annotations

from conformance.backends.cpu import CpuEager


class RaisesInInit(CpuEager):
    name = "test-raises-in-init"

    def __init__(self):
        raise RuntimeError("driver handle not found\nTraceback line two\nline three")


class RaisesInAvailability(CpuEager):
    name = "test-raises-in-availability"

    def availability(self):
        raise KeyError("NEURON_RT_ROOT")
