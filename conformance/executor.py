"""Runs one case end to end and returns its Record: the executor of a pytest worker.

    case ─▶ backend.unsupported_reason ─▶ memory gate ─▶ child (supervisor) ─▶ Observation
                                                   └─▶ golden + baseline (thread, overlaps) ─┘
    Observation ok ─▶ reference.verdict.judge ─▶ PASS | MISMATCH;  otherwise label_of(obs)

The golden is computed in this process while the child sets up and compiles; the verdict is
always decided here, never in the child.
"""
from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cases.model import Case
from conformance.backends.base import Backend, WorkerSlot, threads_per_worker
from conformance.estimates import case_peak_bytes
from conformance.memory_gate import MemoryGate
from conformance.observation import Observation, label_of
from conformance.reference_cache import ReferenceCache
from conformance.supervisor import Budgets, ChildSupervisor
from reports.results import Label, Record


@dataclass(frozen=True)
class Settings:
    compile_timeout: float = 600.0
    run_timeout: float = 300.0
    compile_cache: str = "cold"  # cold: empty caches per case; warm: one shared directory
    warm_cache_dir: str | None = None  # the shared directory of warm mode
    seed: int = 0
    timed_runs: int = 3
    reference_device: str = "cpu"
    cases_modules: tuple[str, ...] = ()  # imported by the child: custom variants' builders


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Executor:
    """Executes cases of one backend for one worker, reusing a warm child between cases."""

    def __init__(self, backend: Backend, backend_spec: str, slot: WorkerSlot, settings: Settings,
                 reference: ReferenceCache, gate: MemoryGate | None = None, worker: str = ""):
        self.backend, self.settings, self.reference, self.gate = backend, settings, reference, gate
        self.worker = worker
        self.workdir = Path(tempfile.mkdtemp(prefix="flexconf-"))
        threads = threads_per_worker(slot)
        if settings.compile_cache == "warm":
            start_cache = settings.warm_cache_dir
        else:  # the child's warm-up compiles for real, into a directory no case will use
            start_cache = str(self.workdir / "compile-cache-warm-up")
        env = {"OMP_NUM_THREADS": str(threads), "FLEXCONF_NUM_THREADS": str(threads)}
        env.update(backend.child_env(slot, start_cache))
        self.supervisor = ChildSupervisor(
            backend_spec, env, self.workdir,
            Budgets(settings.compile_timeout, settings.run_timeout))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference")
        self._count = 0

    def execute(self, case: Case, started_at: str | None = None) -> Record:
        started_at = started_at or now_iso()
        reason = self.backend.unsupported_reason(case)
        if reason:
            return self._record(case, Label.UNSUPPORTED, reason, started_at)
        from cases.pointwise import PointwiseModError  # torch: imported once a case runs

        try:
            mask_depends_on = _mask_dependence(case)
        except PointwiseModError as exc:  # a mod flex_attention cannot run either
            return self._record(case, Label.HARNESS_ERROR, str(exc), started_at)
        estimate = case_peak_bytes(case, self.backend.compiled, mask_depends_on)
        if self.gate is None:
            return self._execute(case, started_at)
        with self.gate.reserve(estimate, f"{self.worker} {case.id}"):
            return self._execute(case, started_at)

    def close(self) -> None:
        self.supervisor.close()
        self._pool.shutdown(wait=False, cancel_futures=True)  # never block an interrupted run
        shutil.rmtree(self.workdir, ignore_errors=True)

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
        reference = self._pool.submit(self.reference.get, case, s.seed, s.reference_device)
        request = {"case": case.to_json(), "seed": s.seed, "runs": s.timed_runs,
                   "output_path": str(output_path), "cold": s.compile_cache == "cold",
                   "cache_dir": str(cache_dir) if cache_dir else None,
                   "cases_modules": list(s.cases_modules)}
        try:
            obs = self.supervisor.run(request)
            try:
                golden, baseline = reference.result()  # waited for even when not needed:
            except Exception as exc:  # noqa: BLE001  # its memory is part of the reservation
                golden = exc
            label = label_of(obs)
            if label is not None:
                return self._record(case, label, obs.message, started_at, obs)
            if isinstance(golden, Exception):  # the reference is ours: a harness fault
                return self._record(case, Label.HARNESS_ERROR,
                                    f"the reference computation failed: {_one_line(golden)}",
                                    started_at, obs)
            return self._judge(case, obs, golden, baseline, started_at)
        finally:
            output_path.unlink(missing_ok=True)
            if s.compile_cache == "cold" and cache_dir is not None:
                shutil.rmtree(cache_dir, ignore_errors=True)

    def _judge(self, case: Case, obs: Observation, golden, baseline, started_at: str) -> Record:
        import torch

        from reference.verdict import judge

        from reference.golden import Reference

        try:
            saved = torch.load(obs.output_path, weights_only=True)
            observed = (Reference(saved["out"], saved.get("lse"), saved.get("grads"))
                        if isinstance(saved, dict) else saved)
        except Exception as exc:  # noqa: BLE001
            return self._record(case, Label.HARNESS_ERROR,
                                f"cannot read the child's output: {_one_line(exc)}", started_at, obs)
        try:
            verdict = judge(case, golden, baseline, observed)
        except Exception as exc:  # noqa: BLE001
            return self._record(case, Label.HARNESS_ERROR,
                                f"the verdict failed: {_one_line(exc)}", started_at, obs)
        label = Label.PASS if verdict.passed else Label.MISMATCH
        return self._record(case, label, "" if verdict.passed else verdict.summary,
                            started_at, obs, verdict.metrics)

    def _record(self, case: Case, label: Label, message: str, started_at: str,
                obs: Observation | None = None, metrics: dict | None = None) -> Record:
        return Record(
            case_id=case.id, label=label, case=case.to_json(), message=message,
            setup_seconds=_seconds(obs and obs.setup_seconds),
            compile_seconds=_seconds(obs and obs.compile_seconds),
            run_seconds=_seconds(obs and obs.run_seconds),
            cache_hit=obs.cache_hit if obs else None, metrics=metrics,
            worker=self.worker, started_at=started_at, finished_at=now_iso())


def _mask_dependence(case: Case) -> frozenset[str]:
    """What the case's mask depends on (b, h, q_idx, kv_idx), for the memory estimate, after
    checking that its mods run point by point (PointwiseModError, one line, when not)."""
    from cases.pointwise import check_mods, mask_dependence
    from cases.variants import build_mods

    try:
        mods = build_mods(case.variant, case.shape)
    except Exception:  # noqa: BLE001 - the child reports it, before it allocates any grid
        return frozenset()
    check_mods(mods.mask_mod, mods.score_mod, case.variant.token)
    return mask_dependence(mods.mask_mod) if mods.mask_mod else frozenset()


def _seconds(value) -> float | None:
    return None if value is None else round(float(value), 6)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
