"""A test backend whose first call is slower by a planted share: a compile-time regression
whose size is known, to check that the gate's confirmation (``flexconf gate --confirm``)
keeps a real slowdown blocking and dismisses a finding the machine does not reproduce.

``SlowFirstCall`` is ``cpu-eager`` with a stand-in compiler: its first call (the record's
compile phase) waits ``STAND_IN_COMPILE_SECONDS`` as a compiler process would, then calls
flex_attention. On cases of the variant ``causal`` it then sleeps the share
``$FLEXCONF_TEST_FIRST_CALL_SLOWDOWN`` of the first call it measured (0.5: 50% longer; unset:
0). The environment variable plays the release: the same backend is the baseline without it
and the slower candidate with it. The wait makes most of the first call insensitive to the
load of a shared 2-core machine (where a sub-second eager call varies threefold), so what a
test of the gate checks is the gate's reasoning, not the machine's speed. Its breakdown
names the parts, so the gate can say which grew.

``SlowInductorFirstCall`` plants the same share on ``cpu-inductor`` (no stand-in: its first
call compiles for seconds), for the planted run on real releases (docs/results/README.md);
its breakdown is Inductor's stages plus ``planted sleep``.
"""
from __future__ import annotations

import os
import time

from cases.model import Case
from conformance.backends.cpu import CpuEager, CpuInductor

SLOWDOWN = "FLEXCONF_TEST_FIRST_CALL_SLOWDOWN"
SLOW_VARIANT = "causal"
STAND_IN_COMPILE_SECONDS = 2.0


def planted_share(case: Case) -> float:
    """The share of its first call a case sleeps on top of it (0 unless planted)."""
    return float(os.environ.get(SLOWDOWN) or 0) if case.variant.name == SLOW_VARIANT else 0.0


def _first_call_then(first, later):
    """A callable that runs ``first`` on its first call (the compile phase) and ``later`` after."""
    calls = [0]

    def call(q, k, v, score_mod, block_mask):
        calls[0] += 1
        return (first if calls[0] == 1 else later)(q, k, v, score_mod, block_mask)

    return call


class SlowFirstCall(CpuEager):
    name = "test-slow-first-call"
    compiled = True  # a stand-in compiler: its first call is a compile the gate judges
    _stages: dict[str, float] | None = None

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        self._stages = None

    def prepare(self, case: Case):
        real = super().prepare(case)
        share = planted_share(case)

        def first(*args):
            start = time.perf_counter()
            time.sleep(STAND_IN_COMPILE_SECONDS)
            waited = time.perf_counter() - start
            result = real(*args)
            seconds = time.perf_counter() - start
            time.sleep(share * seconds)
            self._stages = {"stand-in compile": waited, "flex_attention": seconds - waited,
                            "planted sleep": share * seconds}
            return result

        return _first_call_then(first, real)

    def compile_breakdown(self) -> dict[str, float] | None:
        return self._stages


class SlowInductorFirstCall(CpuInductor):
    name = "test-slow-inductor-first-call"
    _planted: float = 0.0

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        super().begin_case(cache_dir, cold)
        self._planted = 0.0

    def prepare(self, case: Case):
        real = super().prepare(case)
        share = planted_share(case)

        def first(*args):
            start = time.perf_counter()
            result = real(*args)
            self._planted = share * (time.perf_counter() - start)
            time.sleep(self._planted)
            return result

        return _first_call_then(first, real)

    def compile_breakdown(self) -> dict[str, float] | None:
        stages = super().compile_breakdown()
        return {**stages, "planted sleep": self._planted} if stages is not None else None
