"""Test-only backends that are wrong on some shapes only, so the smallest failing case is known
(shrinking, fuzzing and reproduction tests). Both run cpu-eager flex_attention (GQA enabled)."""
from __future__ import annotations

from cases.model import Case
from conformance.backends.cpu import CpuEager

#: The smallest failing query length of ``WrongOnLongHead1``.
MIN_FAILING_SQ = 65


class GqaEager(CpuEager):
    """cpu-eager under a test name (cpu-eager enables GQA and returns the lse as cases ask)."""

    name = "test-gqa-eager"


class WrongOnLongHead1(GqaEager):
    """Correct, except when Sq >= 65 and there is a head 1: the last query row of head 1 of
    batch 0 is doubled. The smallest failing case has B=1, Hq=2 and Sq=65."""

    name = "test-wrong-on-long-head-1"

    def prepare(self, case: Case):
        real = super().prepare(case)
        if case.shape.Sq < MIN_FAILING_SQ or case.shape.Hq < 2:
            return real

        def wrong(q, k, v, score_mod, block_mask):
            result = real(q, k, v, score_mod, block_mask)
            out = (result[0] if isinstance(result, tuple) else result).clone()
            out[0, 1, -1] *= 2
            return (out, *result[1:]) if isinstance(result, tuple) else out

        return wrong
