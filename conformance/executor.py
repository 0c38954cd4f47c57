"""Runs one case end to end and returns its Record: the executor of a pytest worker.

    case ─▶ backend.unsupported_reason ─▶ memory gate ─▶ child (supervisor) ─▶ Observation
                                                   └─▶ golden + baseline (thread, overlaps) ─┘
    Observation + reference ─▶ conformance.decision.decide ─▶ the label (PASS | MISMATCH | ...)

The golden is computed in this process while the child sets up and compiles; the verdict is
always decided here, never in the child. A compile-only pass (``compile_only``) stops after
the first call: no reference, no verdict, label COMPILED. Compile artefacts of a failed case
(of every case with ``keep_artifacts``) are filed under ``artifacts_dir``.
"""
from __future__ import annotations

import shutil
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from cases.model import Case
from conformance.artifacts import file_case_artifacts
from conformance.backends.base import Backend, WorkerSlot, threads_per_worker
from conformance.backends.registry import HookTimeout, unsupported_reason_of
from conformance.estimates import case_peak_bytes
from conformance.kept_outputs import KeepPolicy, keep_outputs
from conformance.memory_gate import MemoryGate
from conformance.options import default_value
from conformance.workdirs import Workdir
from conformance.decision import decide
from conformance.protocol import CaseRequest, Observation
from conformance.reference_cache import ReferenceCache
from conformance.supervisor import Budgets, ChildSupervisor
from records.results import Label, Record
from records.text import first_line

#: The labels of a case that did not fail: no artefacts kept for it, no warm-up problem told.
_NOT_FAILED = (Label.PASS, Label.UNSUPPORTED, Label.COMPILED)


@dataclass(frozen=True)
class Settings:
    """What the executor needs of the run's options; the defaults are the options' own."""

    compile_timeout: float = default_value("--compile-timeout")
    run_timeout: float = default_value("--run-timeout")
    compile_cache: str = "cold"  # cold (--compile-cache's default outside --phase compile): empty
    # caches per case; warm: one shared directory
    warm_cache_dir: str | None = None  # the shared directory of warm mode
    seed: int = default_value("--seed")
    timed_runs: int = default_value("--timed-runs")
    reference_device: str = default_value("--reference-device")
    cases_modules: tuple[str, ...] = ()  # imported by the child: custom variants' builders
    compile_only: bool = False  # --phase compile: first call only, label COMPILED
    artifacts_dir: str | None = None  # where failed cases' compile artefacts are filed
    keep_artifacts: bool = False  # file every case's artefacts, not only failed ones
    keep: KeepPolicy = KeepPolicy()  # which cases' tensors are saved (--keep-outputs)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Executor:
    """Executes cases of one backend for one worker, reusing a warm child between cases."""

    def __init__(self, backend: Backend, backend_spec: str, slot: WorkerSlot, settings: Settings,
                 reference: ReferenceCache, gate: MemoryGate | None = None, worker: str = ""):
        self.backend, self.settings, self.reference, self.gate = backend, settings, reference, gate
        self.worker = worker
        self._workdir = Workdir()  # removes those of workers that were killed
        self.workdir = self._workdir.path
        threads = threads_per_worker(slot)
        if settings.compile_cache == "warm":
            start_cache = settings.warm_cache_dir
        else:  # the child's warm-up compiles for real, into a directory no case will use
            start_cache = str(self.workdir / "compile-cache-warm-up")
        env = {"OMP_NUM_THREADS": str(threads), "FLEXCONF_NUM_THREADS": str(threads)}
        env.update(backend.child_env(slot, start_cache))
        # compilers that read their cache settings once per process get them here, for the
        # child's lifetime (cold: no cache can serve a case, and each child has a directory
        # of its own, so a replacement finds nothing of the child before it, even where a
        # compiler ignored the switch; warm: the shared directory)
        if settings.compile_cache == "warm":
            env.update(backend.process_cache_env(settings.warm_cache_dir, False))

        def cold_cache_env(child: int) -> dict[str, str]:
            return backend.process_cache_env(str(self.workdir / f"process-cache-{child}"), True)

        self.supervisor = ChildSupervisor(
            backend_spec, env, self.workdir,
            Budgets(settings.compile_timeout, settings.run_timeout), backend.artifact_env,
            cold_cache_env if settings.compile_cache == "cold" else None)
        self._count = 0

    def execute(self, case: Case, started_at: str | None = None) -> Record:
        started_at = started_at or now_iso()
        try:
            reason, failure = unsupported_reason_of(self.backend, case, self.settings.run_timeout)
        except HookTimeout as hung:
            return self._record(case, Label.RUN_TIMEOUT, str(hung), started_at)
        if failure:
            return self._record(case, Label.RUNTIME_ERROR, failure, started_at)
        if reason:
            return self._record(case, Label.UNSUPPORTED, reason, started_at)
        from cases.pointwise import PointwiseModError  # torch: imported once a case runs

        try:
            mask_depends_on = _mask_dependence(case)
        except PointwiseModError as exc:  # a mod flex_attention cannot run either
            return self._record(case, Label.HARNESS_ERROR, str(exc), started_at)
        estimate = case_peak_bytes(case, self.backend.compiled, mask_depends_on,
                                   0 if self.settings.compile_only else self.settings.timed_runs)
        if self.gate is None:
            return self._execute(case, started_at)
        with self.gate.reserve(estimate, f"{self.worker} {case.id}"):
            return self._execute(case, started_at)

    def close(self) -> None:
        self.supervisor.close()
        self._workdir.remove()

    # -- internals ------------------------------------------------------------------------
    def _execute(self, case: Case, started_at: str) -> Record:
        s = self.settings
        self._count += 1
        output_path = self.workdir / f"output-{self._count}.pt"
        cache_dir = None
        if s.compile_cache == "cold":
            cache_dir = self.workdir / f"compile-cache-{self._count}"
            cache_dir.mkdir()
        elif s.warm_cache_dir:
            cache_dir = Path(s.warm_cache_dir)
        reference = None if s.compile_only else in_background(
            self.reference.get, case, s.seed, s.reference_device)
        if reference is not None and s.reference_device != "cpu":
            wait([reference])  # on the case's own GPU: never beside its timed runs
        request = CaseRequest(
            case=case.to_json(), output_path=str(output_path), seed=s.seed, runs=s.timed_runs,
            cold=s.compile_cache == "cold", cache_dir=str(cache_dir) if cache_dir else None,
            cases_modules=tuple(s.cases_modules), compile_only=s.compile_only)
        try:
            obs = self.supervisor.run(request)
            record = self._decide(case, obs, reference, started_at)
            return self._with_artifacts(self._with_warm_up_problem(record))
        finally:
            output_path.unlink(missing_ok=True)
            if s.compile_cache == "cold" and cache_dir is not None:
                shutil.rmtree(cache_dir, ignore_errors=True)

    def _decide(self, case: Case, obs: Observation, reference, started_at: str) -> Record:
        """The record of an observation (``conformance.decision.decide``), with the case's
        tensors kept as ``--keep-outputs`` asks once it was judged."""
        outcome = None
        if reference is not None:
            try:
                outcome = reference.result()  # waited for even when not needed:
            except Exception as exc:  # noqa: BLE001  # its memory is part of the reservation
                outcome = exc
        decision = decide(case, obs, outcome)
        record = self._record(case, decision.label, decision.message, started_at, obs,
                              decision.metrics)
        # The timed calls finished with a right answer (a timeout's seconds are only how long
        # it ran, a wrong answer's speed says nothing): what they cost and how fast they were.
        if record.run_seconds and decision.label is Label.PASS:
            record = replace(record, performance=_performance(case, record.run_seconds))
        if decision.observed is None:
            return record
        golden, baseline = outcome
        return keep_outputs(self.settings.keep, case, self.settings.seed, record,
                            decision.observed, golden, baseline)

    def _with_warm_up_problem(self, record: Record) -> Record:
        """A failed case's message with what went wrong in its child's warm-up (it raised, or
        the backend changed torch's settings, which were set back) as its second line: the
        child's log said it, and nothing else did, while it may explain the failure."""
        problem = self.supervisor.warm_up_problem
        if not problem or record.label in _NOT_FAILED:
            return record
        first, _, rest = record.message.partition("\n")
        line = f"(the warm-up of this case's backend child: {first_line(problem, 300)})"
        return replace(record, message="\n".join(part for part in (first, line, rest) if part))

    def _with_artifacts(self, record: Record) -> Record:
        """File the case's compile artefacts (and the child's log of it) under the report
        directory when the case failed or all are kept; the child's copies go either way."""
        s = self.settings
        produced = self.supervisor.case_artifacts()
        keep = s.keep_artifacts or record.label not in _NOT_FAILED
        where = None
        try:
            if produced and keep and s.artifacts_dir:
                where = file_case_artifacts(record.case_id, produced, self.supervisor.artifact_dir,
                                            self.supervisor.case_log(), Path(s.artifacts_dir))
        except OSError as exc:  # a write refused (a full disk, permissions): the case keeps its
            # verdict (a review: a MISMATCH became "not judged" when they could not be filed)
            note = f"(its compile artefacts were not kept: {type(exc).__name__}: {exc})"
            return replace(record, message=f"{record.message}\n{note}" if record.message else note)
        finally:
            for path in produced:
                path.unlink(missing_ok=True)
        return replace(record, artifacts=where) if where else record

    def _record(self, case: Case, label: Label, message: str, started_at: str,
                obs: Observation | None = None, metrics: dict | None = None) -> Record:
        return Record(
            case_id=case.id, label=label, case=case.to_json(), message=message,
            setup_seconds=_seconds(obs and obs.timings.setup_seconds),
            compile_seconds=_seconds(obs and obs.timings.compile_seconds),
            run_seconds=_seconds(obs and obs.timings.run_seconds),
            cache_hit=obs.timings.cache_hit if obs else None, metrics=metrics,
            compile_breakdown=_breakdown(obs.timings.compile_breakdown) if obs else None,
            compiled_bytes=obs.timings.compiled_bytes if obs else None,
            worker=self.worker, started_at=started_at, finished_at=now_iso())


def in_background(fn, *args) -> Future:
    """``fn(*args)`` in a daemon thread. Not a ThreadPoolExecutor: the interpreter joins its
    threads at exit, so a SIGTERM or Ctrl-C during a large golden (tens of seconds) would wait
    for it; an interrupted run must stop at once."""
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            future.set_exception(exc)

    threading.Thread(target=work, name="reference", daemon=True).start()
    return future


def _breakdown(stages: dict | None) -> dict[str, float] | None:
    return {name: _seconds(value) for name, value in stages.items()} if stages else None


def _performance(case: Case, run_seconds: float) -> dict[str, float] | None:
    from cases.density import attention_flops, mask_density
    from cases.variants import build_mods

    try:
        density = mask_density(case)
        score_mod = build_mods(case.variant, case.shape).score_mod is not None
    except Exception:  # noqa: BLE001 - a figure we cannot compute is left out, never a failure
        return None
    flops = attention_flops(case, density.visible_pairs)
    return {"density": round(density.density, 6), "block_density": round(density.block_density, 6),
            "visible_pairs": density.visible_pairs, "flops": flops,
            "gflops_per_second": flops / run_seconds / 1e9,
            # its time holds the score mod's cost too: not the mask's alone (DENSE)
            "score_mod": float(score_mod)}


def _mask_dependence(case: Case) -> frozenset[str]:
    """What the case's mask depends on (b, h, q_idx, kv_idx), for the memory estimate, after
    checking that its mods run point by point (PointwiseModError, one line, when not)."""
    from cases.pointwise import check_mods, mask_dependence
    from cases.score_dtype import traced_score_dtype
    from cases.variants import build_mods

    try:
        mods = build_mods(case.variant, case.shape)
    except Exception:  # noqa: BLE001 - the child reports it, before it allocates any grid
        return frozenset()
    check_mods(mods.mask_mod, mods.score_mod, case.variant.token, "cpu", traced_score_dtype(case))
    return mask_dependence(mods.mask_mod) if mods.mask_mod else frozenset()


def _seconds(value) -> float | None:
    return None if value is None else round(float(value), 6)
