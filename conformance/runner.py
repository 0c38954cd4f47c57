"""A pytest worker's runner: record the start, execute, record the end, report the outcome.

One Runner per worker process (one per session without xdist). It owns the worker's
Executor (and so its supervised child) and its RecordWriter.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cases.model import Case
from conformance.artifacts import ARTIFACTS_DIRNAME
from conformance.backends.base import WorkerSlot, threads_per_worker, usable_cores
from conformance.backends.cuda import reference_device_for
from conformance.cache_dirs import warm_cache_dir
from conformance.options import RunOptions
from records.results import Label, Record


def worker_slot(workerinput: dict | None) -> tuple[WorkerSlot, str]:
    """This process's slot and worker name: from pytest-xdist's ``workerinput`` in a worker
    (gw3 of 8 -> WorkerSlot(3, 8)), else the only slot, named ``main``."""
    if not workerinput:
        return WorkerSlot(0, 1), "main"
    name = str(workerinput.get("workerid", "gw0"))
    count = max(1, int(workerinput.get("workercount", 1)))
    digits = "".join(ch for ch in name if ch.isdigit())
    index = int(digits) % count if digits else 0  # a restarted worker gets a new number
    return WorkerSlot(index, count), name


def run_environment(backend, workers: int) -> dict:
    """What results.json says about where the run happened, and which oracle judged it."""
    from conformance.memory_gate import machine_memory_bytes
    from conformance.run_info import git_revision, suite_version
    from records.results import REFERENCE_VERSION_KEY
    from reference.golden import REFERENCE_VERSION

    from conformance.backends.registry import BackendError, environment_of

    try:
        environment = environment_of(backend)
    except BackendError as exc:  # it worked at the run's start (validate_backend): say so
        environment = {"backend": backend.name, "environment_error": str(exc)}
    environment.update(suite_version=suite_version(), git_revision=git_revision(),
                       workers=workers, cpu_count=os.cpu_count(), usable_cores=usable_cores(),
                       threads_per_worker=threads_per_worker(WorkerSlot(0, workers)),
                       memory_bytes=machine_memory_bytes())
    environment[REFERENCE_VERSION_KEY] = REFERENCE_VERSION
    return environment


def claim_slot(directory: Path, preferred: WorkerSlot) -> tuple[WorkerSlot, object]:
    """The first free device slot, ``preferred`` first, held by an advisory lock for this
    process's lifetime: a worker that xdist restarts after a crash (gw8 of 8) takes the dead
    worker's slot (its lock died with it), never a live worker's GPU or NeuronCores."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    order = [preferred.index] + [i for i in range(preferred.count) if i != preferred.index]
    for index in order:
        handle = open(directory / f".slot-{index}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return WorkerSlot(index, preferred.count), handle
    return preferred, None  # more processes than slots (should not happen): share


class Runner:
    def __init__(self, options: RunOptions, workerinput: dict | None = None,
                 selection: list[str] | None = None):
        import torch

        from conformance.backends.registry import resolve_backend
        from conformance.compat import keep_torch_trace_to_itself
        from conformance.executor import Executor, Settings
        from conformance.kept_outputs import KeepPolicy
        from conformance.memory_gate import MemoryGate
        from records.events import RecordWriter, records_dir
        from conformance.reference_cache import ReferenceCache

        keep_torch_trace_to_itself()
        self.options = options
        self.slot, self.worker = worker_slot(workerinput)
        self.slot, self._slot_lock = claim_slot(records_dir(options.report_dir), self.slot)
        backend = resolve_backend(options.backend)
        spec = backend.name if options.backend == "auto" else options.backend
        torch.set_num_threads(threads_per_worker(self.slot))  # the golden's share
        settings = Settings(
            compile_timeout=options.compile_timeout, run_timeout=options.run_timeout,
            compile_cache=options.compile_cache,
            warm_cache_dir=str(warm_cache_dir(backend.name)),
            seed=options.seed, timed_runs=options.timed_runs,
            reference_device=reference_device_for(options.reference_device, self.slot),
            cases_modules=options.cases_modules, compile_only=options.phase == "compile",
            artifacts_dir=str(options.report_dir / ARTIFACTS_DIRNAME),
            keep_artifacts=options.keep_artifacts,
            keep=KeepPolicy(options.keep_outputs, options.keep_outputs_cap,
                            str(options.report_dir)))
        self.backend_name = backend.name
        self.expectations = load_expectations(options.expectations)
        self.writer = RecordWriter(options.report_dir, self.worker)
        self.writer.environment(run_environment(backend, self.slot.count))
        if workerinput and selection is not None and options.resume is None:
            self.writer.selection(selection)  # the controller learns it only at the end
        self.executor = Executor(
            backend, spec, self.slot, settings,
            ReferenceCache(options.reference_cache, options.reference_cache_size),
            MemoryGate(records_dir(options.report_dir), options.memory_budget), self.worker)

    def check(self, case: Case, properties: list | None = None) -> Record:
        """Run ``case`` and turn its label into the pytest outcome (see ``outcome``);
        ``properties`` (the test item's user_properties) get the label and the times, so
        ``pytest --junitxml`` carries them."""
        try:
            record = self.record_case(case)
        except OSError as exc:  # the store refused its record (a full disk): one line, no
            # traceback; the case has none, so the run says INCOMPLETE (records/events.py)
            pytest.fail(f"[not recorded] {case.id}: its record could not be written ({exc}); "
                        "the run's results say how to finish it (--resume runs this case)",
                        pytrace=False)
        if properties is not None:
            from reports.junit import junit_properties

            properties.extend(junit_properties(record))
        outcome(record, record.expected_failure and
                f"known {record.label.value}: {record.expected_failure}")
        return record

    def record_case(self, case: Case, record_id: str | None = None) -> Record:
        """Run ``case`` and write its record (under ``record_id``, default the case id)."""
        from dataclasses import replace

        from conformance.executor import now_iso

        started_at = now_iso()
        self.writer.started(record_id or case.id, case.to_json(), self.worker, started_at)
        try:
            record = self.executor.execute(case, started_at)
        except Exception as exc:  # noqa: BLE001 - a bug of ours must still leave a record
            from conformance.decision import disk_full
            from records.errors import is_disk_full

            error = f"{type(exc).__name__}: {exc}"
            judged = disk_full(error) if is_disk_full(exc) else None
            record = Record(case_id=case.id, label=Label.HARNESS_ERROR, case=case.to_json(),
                            message=judged.message if judged else f"the harness failed: {error}",
                            metrics=judged.metrics if judged else None, worker=self.worker,
                            started_at=started_at, finished_at=now_iso())
        if record_id:
            record = replace(record, case_id=record_id)
        record = replace(record, expected_failure=self._expected_failure(record))
        self.writer.finished(record)
        return record

    def _expected_failure(self, record: Record) -> str | None:
        """The reason ``--expectations`` gives when ``record`` failed with exactly the label
        it lists for the case (None otherwise: a pass, or another failure, is not excused; nor
        is a case a full disk kept from being judged, whatever its label)."""
        from records.errors import is_not_judged

        if self.expectations is None or record.label in (Label.PASS, Label.UNSUPPORTED) \
                or is_not_judged(record):
            return None
        from reports.expectations import known_failure_reason

        return known_failure_reason(self.expectations, self.backend_name, record.case_id,
                                    record.label)

    def close(self) -> None:
        self.executor.close()
        self.writer.close()


def load_expectations(path: str | None):
    """The known failures of ``--expectations`` (None without it); ValueError, one line."""
    if path is None:
        return None
    from reports.expectations import load_expectations as load

    return load(path)


def fails_its_test(record: Record) -> bool:
    """Whether ``outcome`` fails the record's test (not passed, skipped or xfail)."""
    return record.label not in (Label.PASS, Label.COMPILED, Label.UNSUPPORTED) \
        and not record.expected_failure


def outcome(record: Record, xfail_reason: str | None = None) -> None:
    """PASS returns; UNSUPPORTED skips; a failure with exactly its expected label (from
    ``--expectations``) is xfail; any other label fails. First line: ``[LABEL] ...``."""
    if record.label in (Label.PASS, Label.COMPILED):
        return
    first, _, rest = (record.message or record.label.value.lower()).partition("\n")
    text = f"[{record.label.value}] {first}"
    if record.label is Label.UNSUPPORTED:
        pytest.skip(text)
    if xfail_reason:
        pytest.xfail(f"[{record.label.value}] {xfail_reason}")
    timings = ", ".join(f"{name} {value:.3g} s" for name, value in (
        ("setup", record.setup_seconds), ("compile", record.compile_seconds),
        ("run", record.run_seconds)) if value is not None)
    details = "\n".join(part for part in (timings, rest) if part)
    pytest.fail(f"{text}\n{details}".rstrip(), pytrace=False)
