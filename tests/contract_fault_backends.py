"""Test-only backends that break the backend contract of a mode (conformance/contract.py), each
in one way, on every case; their numbers are otherwise flex_attention's own (cpu-eager). Every
breach must be the backend's error (COMPILE_ERROR on the first call, RUNTIME_ERROR on a later
one) quoting the contract, never a MISMATCH of a reshaped tensor or a bare unpacking error."""
from __future__ import annotations

from cases.model import Case
from conformance.backends.base import Backend
from conformance.backends.cpu import CpuEager


class _Breaks(CpuEager):
    first_call_keeps_contract = False  # True: the breach starts with the second call (run phase)

    def prepare(self, case: Case):
        real = super().prepare(case)
        calls = [0]

        def breaking(q, k, v, score_mod, block_mask):
            calls[0] += 1
            result = real(q, k, v, score_mod, block_mask)
            if calls[0] == 1 and self.first_call_keeps_contract:
                return result
            return self.breach(case, result, q, k, v, score_mod, block_mask)

        return breaking

    def breach(self, case, result, *args):
        raise NotImplementedError


class OutputOnlyInLseMode(_Breaks):
    """fwd+lse: returns the output alone. With B=2, ``out, lse = result`` would 'work' (it
    splits the batch), and the verdict would judge a wrong 'output'."""

    name = "test-output-only-in-lse-mode"

    def breach(self, case, result, *args):
        return result[0] if isinstance(result, tuple) else result


class TupleInFwdMode(_Breaks):
    """fwd: returns (out, lse) where the output alone is due."""

    name = "test-tuple-in-fwd-mode"

    def breach(self, case, result, q, k, v, score_mod, block_mask):
        from conformance import compat
        from torch.nn.attention.flex_attention import flex_attention

        return compat.attention(flex_attention, q, k, v, score_mod, block_mask,
                                enable_gqa=case.shape.Hq != case.shape.Hkv, return_lse=True)


class HeadsAndRowsSwapped(_Breaks):
    """fwd: returns the output as [B, Sq, Hq, D] (the same numbers, another layout)."""

    name = "test-heads-and-rows-swapped"

    def breach(self, case, result, *args):
        return result.transpose(1, 2)


class Float32Output(_Breaks):
    """fwd: returns the output in float32 whatever the inputs' dtype."""

    name = "test-float32-output"

    def breach(self, case, result, *args):
        return result.float()


class ReshapedOnLaterCalls(HeadsAndRowsSwapped):
    """Keeps the contract on the first call (the compile phase), breaks it from the second on."""

    name = "test-reshaped-on-later-calls"
    first_call_keeps_contract = True


class DetachedInBackwardMode(_Breaks):
    """fwd+bwd: returns an output computed from detached inputs (no gradient can flow). CPU
    flex_attention has no backward, so this is also what 'running' it without autograd gives."""

    name = "test-detached-in-backward-mode"

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)

        def detached(q, k, v, score_mod, block_mask):
            return real(q.detach(), k.detach(), v.detach(), score_mod, block_mask)

        return detached


class SparseOutput(_Breaks):
    """fwd: returns the output as a sparse COO tensor (right shape, dtype and device)."""

    name = "test-sparse-output"

    def breach(self, case, result, *args):
        return result.to_sparse()


class _Reports(CpuEager):
    """Computes correctly; reports ``reported`` from one of its after-the-first-call hooks."""

    compiled = True
    hit = None
    stages = None
    size = None

    def cache_hit(self):
        return self.hit

    def compile_breakdown(self):
        return self.stages

    def compiled_bytes(self):
        return self.size


class NumpyCacheHit(_Reports):  # what a comparison of numpy counters gives
    name = "test-numpy-cache-hit"

    @property
    def hit(self):
        import numpy as np

        return np.int64(2) > np.int64(1)


class TensorCacheHit(_Reports):
    name = "test-tensor-cache-hit"

    @property
    def hit(self):
        import torch

        return torch.tensor(0) > 1


class IntCacheHit(_Reports):
    name = "test-int-cache-hit"
    hit = 1


class TextStages(_Reports):
    name = "test-text-stages"
    stages = {"zapcc": "fast"}


class NotANumberStage(_Reports):
    name = "test-nan-stage"
    stages = {"zapcc": float("nan")}


class StagesPastThePhase(_Reports):
    name = "test-stages-past-the-phase"
    stages = {"zapcc": 100.0}


class NumpySize(_Reports):
    name = "test-numpy-size"

    @property
    def size(self):
        import numpy as np

        return np.int64(4096)


class TextSize(_Reports):
    name = "test-text-size"
    size = "4 KiB"


class NegativeSize(_Reports):
    name = "test-negative-size"
    size = -1


class BoolSize(_Reports):
    name = "test-bool-size"
    size = True


#: the reporting backends above, each given a case of its own by ReportsByCase
REPORTERS = (NumpyCacheHit, TensorCacheHit, IntCacheHit, TextStages, NotANumberStage,
             StagesPastThePhase, NumpySize, TextSize, NegativeSize, BoolSize)


def reporter_length(index: int) -> int:
    """The query and key length of the case on which ReportsByCase reports as REPORTERS[i]."""
    return 64 + 8 * index


class ReportsByCase(_Reports):
    """Reports what ``REPORTERS[i]`` reports on a case of length ``reporter_length(i)``, and
    nothing on any other, so that one child runs them all (a child each took 3 CPU-s)."""

    name = "test-reports-by-case"
    _reporter: _Reports = _Reports()

    def prepare(self, case: Case):
        by_length = {reporter_length(i): reporter for i, reporter in enumerate(REPORTERS)}
        self._reporter = by_length.get(case.shape.Sq, _Reports)()
        return super().prepare(case)

    def cache_hit(self):
        return self._reporter.cache_hit()

    def compile_breakdown(self):
        return self._reporter.compile_breakdown()

    def compiled_bytes(self):
        return self._reporter.compiled_bytes()


class PrepareLog(CpuEager):
    """Logs the id of each case it prepares, and whether the call ran, to
    ``$FLEXCONF_TEST_PREPARE_LOG``; warms up as a plugin that does not override ``warm_up``
    does (conformance.backends.base.Backend.warm_up)."""

    name = "test-prepare-log"
    warm_up = Backend.warm_up
    declines = ()  # variants it calls unsupported

    def unsupported_reason(self, case: Case) -> str | None:
        return "declined" if case.variant.name in self.declines else None

    def prepare(self, case: Case):
        import os

        real = super().prepare(case)

        def logged(*args):
            result = real(*args)
            with open(os.environ["FLEXCONF_TEST_PREPARE_LOG"], "a") as log:
                log.write(f"{case.id}\n")
            return result

        return logged


class LogsTheCollector(CpuEager):
    """Logs, for each case, whether Python's garbage collector is on and how many objects
    are frozen out of its sight (conformance/process_gc.py), when the case is prepared and
    when it is called, to ``$FLEXCONF_TEST_GC_LOG``: "CASE_ID WHEN ENABLED FROZEN"."""

    name = "test-logs-the-collector"

    def prepare(self, case: Case):
        real = super().prepare(case)
        self._log(case, "prepare")

        def logged(*args):
            self._log(case, "call")
            return real(*args)

        return logged

    @staticmethod
    def _log(case: Case, when: str) -> None:
        import gc
        import os

        with open(os.environ["FLEXCONF_TEST_GC_LOG"], "a") as log:
            log.write(f"{case.id} {when} {gc.isenabled()} {gc.get_freeze_count()}\n")


class PrepareLogDecliningCausal(PrepareLog):
    name = "test-prepare-log-declining-causal"
    declines = ("causal",)


class ShowsItsCacheEnv(CpuEager):
    """Says, when it prepares a case, the process-wide cache and artefact settings its
    process was started with (``flexconf repro`` must start cold, as a cold run's child)."""

    name = "test-shows-its-cache-env"

    def process_cache_env(self, cache_dir: str, cold: bool) -> dict[str, str]:
        return {"FLEXCONF_TEST_PROCESS_CACHE": "off" if cold else cache_dir}

    def artifact_env(self, directory: str) -> dict[str, str]:
        return {"FLEXCONF_TEST_ARTIFACTS": directory}

    def prepare(self, case: Case):
        import os

        print(f"process cache {os.environ.get('FLEXCONF_TEST_PROCESS_CACHE')}; artefacts "
              f"{os.environ.get('FLEXCONF_TEST_ARTIFACTS')}")
        return super().prepare(case)


class FailsCausalAndShowsItsCache(CpuEager):
    """Writes, whenever it prepares a case, the process cache its child was started with to
    ``$FLEXCONF_TEST_CACHE_LOG`` ("CASE_ID SETTING"), and fails every ``causal`` case's first
    call, so that the executor starts another child after it."""

    name = "test-fails-causal-shows-its-cache"

    def process_cache_env(self, cache_dir: str, cold: bool) -> dict[str, str]:
        return {"FLEXCONF_TEST_PROCESS_CACHE": f"{'cold' if cold else 'warm'}:{cache_dir}"}

    def prepare(self, case: Case):
        import os

        with open(os.environ["FLEXCONF_TEST_CACHE_LOG"], "a") as log:
            log.write(f"{case.id} {os.environ.get('FLEXCONF_TEST_PROCESS_CACHE')}\n")
        attention = super().prepare(case)
        if case.variant.name != "causal":
            return attention

        def fails(*args, **kwargs):
            raise RuntimeError("a planted compile failure")

        return fails
