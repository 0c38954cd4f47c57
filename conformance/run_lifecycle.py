"""A run's start and end, in the controller (or the only process without xdist).

At the start: take the directory's run lock (held to the end: a second run into the same
directory is a usage error, not a mix of two runs), set an earlier run's results aside (or,
with ``--resume``, check the run it finishes and keep its store); choose the schedule. Once
the tests are collected and some are (before the first runs; ``begin_fresh_run``): clear the
store and write the manifest. A selection of no case puts the results it set aside back
(``restore_unselected_run``), so a -k typo leaves the directory as it was. At the end: merge
the store into results.json with the selection and how many cases were selected, and call
``reports/`` once for the report. ``ConformanceSession`` (plugin.py) inherits this.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from conformance.report_dir_checks import (check_writable, refuse_to_clear_an_unreported_run,
                                           refuse_to_clear_foreign_files)
from conformance.resume_checks import resumable_run


class RunLifecycle:
    """The controller's part of ConformanceSession (which provides options, config, backend,
    cases(), selected, summary_lines and the collected ids in _expected)."""

    _run_lock = None  # the open lock file while this process runs the directory's run
    _fresh_run_pending = False  # a new run (not --resume) whose store is not cleared yet
    _set_aside: list = []  # the earlier run's result files it moved into previous/
    _expectations_digest: str | None = None  # of --expectations, read at the start
    #: A run stopped once every case had finished exits as it would have: 1 where a case's
    #: test fails, else 0 (None: not such a run).
    exit_after_stop: int | None = None
    #: The run fuzzes and its fuzzing test has not ended (set by finish_run).
    fuzzing_cut = False
    _written: tuple = ()  # the records finish_run wrote

    def start_run(self) -> None:
        from conformance.executor import now_iso
        from records.store import set_aside_results

        report_dir = self.options.report_dir
        flag = "--resume" if self.options.resume else "--report-dir"
        check_writable(report_dir, flag)
        started_at = now_iso()
        if not self.options.resume:  # before the lock: nothing may be left in a folder refused
            refuse_to_clear_foreign_files(report_dir)
        self._hold_run_lock(flag, started_at)
        last_run = report_dir / "results.json"
        if not last_run.exists():  # a run stopped before its first case set it aside there
            last_run = report_dir / "previous" / "results.json"
        self.schedule = self._cost_model(last_run)
        if self.options.resume:
            self._manifest = resumable_run(self.options, self._recorded_options(), self.backend,
                                            worker_count(self.config))
            self._started_at = self._manifest.started_at
            self._set_aside = set_aside_results(report_dir, resuming=self._manifest)
            self._say_schedule()
            return
        self._started_at = started_at
        refuse_to_clear_an_unreported_run(report_dir)
        # no earlier run's results may look like this one's, even if it is killed at once;
        # the store is cleared in begin_fresh_run, undone in restore_unselected_run
        self._set_aside = set_aside_results(report_dir)
        self._fresh_run_pending = True
        self._say_schedule()

    def begin_fresh_run(self) -> None:
        """Clear the store (records, kept outputs, artefacts) and write the manifest, once this
        run is known to select cases (collected, before any runs), to end as an empty --shard
        part, or to be interrupted before its selection. Idempotent."""
        from conformance.artifacts import clear_artifacts
        from conformance.kept_outputs import clear_outputs
        from records.store import clear_records, forget_superseded

        if not self._fresh_run_pending:
            return
        self._fresh_run_pending = False
        report_dir = self.options.report_dir
        forget_superseded(report_dir)
        clear_outputs(report_dir)
        clear_artifacts(report_dir)  # no link may lead to an earlier run's files
        # the store last and the manifest at once: stopped anywhere in between, the folders
        # left are a run's (its manifest), or empty, never a run's files without their manifest
        clear_records(report_dir)
        try:
            self._write_manifest()
        except OSError as exc:  # a full disk: an INTERNALERROR traceback (an outside audit)
            from records.text import one_line

            raise pytest.UsageError(
                f"--report-dir {one_line(str(report_dir))}: the run's manifest cannot be "
                f"written ({one_line(str(exc))}); make room, then run again (the last run's "
                "results are in its previous/)") from None

    def keep_empty_run_results(self) -> None:
        """A run stopped before it selected a case puts back the results of no case it held
        aside (an empty --shard part's: a merge needs them); a real run stays set aside."""
        from records.store import restore_held_empty_run

        if self._fresh_run_pending:
            restore_held_empty_run(self.options.report_dir)

    def restore_unselected_run(self) -> None:
        """A run whose -k, -m or --shard selected no case (a usage error) leaves the directory
        as it found it: the results it set aside come back, the store was never cleared."""
        from records.store import restore_set_aside

        if self._fresh_run_pending:
            self._fresh_run_pending = False
            restore_set_aside(self.options.report_dir, self._set_aside)

    def _hold_run_lock(self, flag: str, now: str) -> None:
        """Take the report directory's run lock for this run (records.store.hold_run_lock);
        a run already going on there makes this one a usage error, before anything is moved."""
        from records.store import RUN_LOCK_NAME, RunInProgress, hold_run_lock
        from records.text import one_line

        report_dir = self.options.report_dir
        if not report_dir.is_dir():  # a missing --resume directory: resumable_run names it
            return
        try:
            self._run_lock = hold_run_lock(
                report_dir, f"pid {os.getpid()} on {socket.gethostname()}, started {now}")
        except RunInProgress as exc:
            fix = ("wait for it to end (or stop it), then resume" if flag == "--resume" else
                   "wait for it to end, or give this run another --report-dir")
            raise pytest.UsageError(f"{flag} {one_line(str(report_dir))}: another run is going "
                                    f"on there ({exc.holder}); {fix}") from None
        except OSError as exc:  # a lock file of another user's, a filesystem without locks
            from records.errors import is_disk_full

            lock = one_line(str(report_dir / RUN_LOCK_NAME))
            fix = ("make room there" if is_disk_full(exc) else "make it this user's (remove it "
                   "when no run is going on there)")  # a full disk was told to chown the lock
            raise pytest.UsageError(
                f"{flag} {one_line(str(report_dir))}: its run lock {lock} cannot be taken "
                f"({one_line(exc.strerror or exc)}); {fix} or give this run another "
                "--report-dir") from None

    def release_run_lock(self) -> None:
        """Let the run lock go (at the end of the pytest session; a dead process's goes too)."""
        if self._run_lock is not None:
            self._run_lock.close()
            self._run_lock = None

    def _cost_model(self, last_run: Path):
        """The order of the cases under xdist (None: collection order, or no xdist). A file
        the user named is checked even without xdist: a bad one is a usage error either way."""
        from conformance.estimates import relative_cost
        from conformance.schedule import AUTO, ESTIMATE, OFF, ScheduleError, cost_model

        choice = self.options.schedule_from
        one_process = worker_count(self.config) < 2
        if choice == OFF or (one_process and choice in (AUTO, ESTIMATE)):
            return None
        try:
            model = cost_model(self.cases(), relative_cost, choice, self.options.matrix,
                               self.options.profile, last_run, backend=self.backend.name)
        except ScheduleError as exc:
            raise pytest.UsageError(str(exc)) from None
        if one_process:  # one process runs the cases in collection order
            return None
        return model

    def _say_schedule(self) -> None:
        """The schedule's line for the terminal, once the earlier run's results are set aside:
        a file they came from that was moved into previous/ is named where it is now (the
        line named the path that then held this run's own results: an outside audit)."""
        from records.store import PREVIOUS_DIR

        model = self.schedule
        if model is None:
            return
        source, path = model.source, model.path
        if path is not None and not path.exists():
            moved = self.options.report_dir / PREVIOUS_DIR / path.name
            source += (f"; set aside since, into {moved}" if moved in self._set_aside
                       else "; since removed: the results this run replaces")
        elif path is not None and path.resolve() in {p.resolve() for p in self._set_aside}:
            source += "; replaced since by the last run's results, set aside there"
        self.summary_lines.append(f"schedule: longest first, from {source}")

    def _recorded_options(self) -> dict:
        options = self.options.to_record()
        options["backend"], options["backend_requested"] = self.backend.name, self.options.backend
        from conformance.run_info import import_paths, matrix_path

        # what the rerun commands name, from where the run started (its relative paths' base)
        options["matrix_path"] = matrix_path(self.config.invocation_params.dir)
        options.update(import_paths(self.options.backend, self.options.cases_modules))
        if self.options.expectations:  # shards name one file by different paths: by content
            options["expectations_sha256"] = self._expectations_sha256()
        return options

    def _expectations_sha256(self) -> str:
        """The --expectations file's digest, read once, at the start (the manifest's options):
        the content that judged the run, even if the file changes or goes before its end."""
        if self._expectations_digest is None:
            import hashlib

            with open(self.options.expectations, "rb") as file:
                self._expectations_digest = hashlib.sha256(file.read()).hexdigest()
        return self._expectations_digest

    def resumed_selection(self) -> set[str] | None:
        """With ``--resume``: the cases the interrupted run selected (None: all, or not known
        because it stopped before its selection was). A worker reads the manifest here; the
        controller read it in start_run."""
        if not self.options.resume:
            return None
        if self._manifest is None:
            from records.files import UserFileError
            from records.store import read_manifest

            try:
                self._manifest = read_manifest(self.options.report_dir)
            except UserFileError as exc:
                raise pytest.UsageError(f"--resume: {exc}") from None
        selected = self._manifest.selected if self._manifest else None
        return None if selected is None else set(selected)

    def _previously_selected(self) -> set[str]:
        return self.resumed_selection() or set()

    def _write_manifest(self, selection: dict | None = None) -> None:
        """Write the run's manifest; ``selection``: the whole run's selection block when the
        caller has it already (finish_run), else computed here."""
        from conformance.run_info import suite_version
        from records.store import RunManifest, write_manifest

        chosen = self._expected | self._previously_selected()
        order = [c.id for c in self.cases()]
        # known once collected: none of the matrix (a fuzz-only run) is [], not unknown
        selected = [cid for cid in order if cid in chosen] if chosen or self._fuzzing else None
        if self._resumes_known_cases():  # as the run was started: a resume never rewrites it
            selection = self._manifest.selection
        elif selection is None:  # under xdist its case_ids are known only at the end
            selection = self._whole_run_selection(self._fresh_whole_run_ids())
        write_manifest(self.options.report_dir, RunManifest(
            self._started_at, suite_version(), self._recorded_options(), order, selected,
            selection, self._run_fuzzes()))

    def resumed_run_fuzzed(self) -> bool | None:
        """With ``--resume``: whether the run it finishes fuzzed (None: not known, an older
        manifest, or not a resume)."""
        self.resumed_selection()  # reads the manifest in a worker
        return self._manifest.fuzzing if self.options.resume and self._manifest else None

    def failed_before_resume(self) -> list[str]:
        """Ids of the written records that fail their test and that no test of this command
        ran (finished before a resume; fuzzed ones where this command did not fuzz)."""
        from conformance.runner import fails_its_test
        from records.errors import is_not_judged
        from records.results import is_fuzzed

        return [r.case_id for r in self._written if fails_its_test(r) and not is_not_judged(r)
                and r.case_id not in self._expected
                and not (self._fuzzing and is_fuzzed(r.case_id))]

    def _run_fuzzes(self) -> bool:
        """Whether the run fuzzes: this command collected the fuzzing test, or the run it
        resumes did (a resume from another test path would leave its fuzzing unfinished)."""
        return self._fuzzing or bool(self.resumed_run_fuzzed())

    def _fresh_whole_run_ids(self) -> list[str] | None:
        """A new run's case ids before sharding: this command's selection; under xdist, whose
        controller learns it only from workers that end, what its workers recorded in the
        store (a run stopped by a signal), else unknown."""
        from records.events import recorded_selection

        if self.selected is not None:
            return self.selected
        return recorded_selection(self.options.report_dir)

    def _resumes_known_cases(self) -> bool:
        """Whether this command resumes a run that knew its cases (then it runs only those)."""
        return self.resumed_selection() is not None

    def recorded_whole_run_ids(self) -> list[str] | None:
        """The resumed run's case ids before sharding, as it recorded them: in its manifest,
        or (a run under xdist killed before its end) in its workers' store files."""
        from records.events import recorded_selection

        recorded = (self._manifest.selection or {}).get("case_ids")
        if recorded is not None:
            return list(recorded)
        return recorded_selection(self.options.report_dir)

    def _whole_run_ids(self, run_ids: list[str] | None) -> list[str] | None:
        """The ids the whole run selected before sharding (the selection block's case_ids):
        this command's selection; a resumed run keeps the ones its manifest recorded, whatever
        -k or -m resumes it (a merge compares them with the other shards'); a manifest without
        them (an older suite's): its own cases (``run_ids``, this shard's) and other shards'
        from this command's selection."""
        if not self._resumes_known_cases():
            return self._fresh_whole_run_ids()
        recorded = self.recorded_whole_run_ids()
        if recorded is not None:
            return recorded
        started = self._manifest.selection or {}
        if self.selected is None or (started and (
                started.get("keyword", ""), started.get("markexpr", "")) != (
                self.config.option.keyword or "", self.config.option.markexpr or "")):
            return None  # not known here, and this command's -k / -m would be a guess
        shard = self.shard_ids()
        chosen = set(run_ids or ()) | {cid for cid in self.selected or ()
                                       if shard is not None and cid not in shard}
        order = [c.id for c in self.cases()]
        return [cid for cid in order if cid in chosen] + sorted(chosen - set(order)) or None

    def _whole_run_selection(self, case_ids: list[str] | None) -> dict:
        """results.json's selection block. A resumed run that knew its cases keeps the -k and
        -m it was started with, whatever -k or -m resumes it (the gate and merge compare
        them); otherwise it is this command's."""
        from conformance.run_info import run_selection

        if self._resumes_known_cases() and self._manifest.selection is not None:
            return {**self._manifest.selection, "case_ids": case_ids}
        return run_selection(self.options, self.config.option.keyword,
                             self.config.option.markexpr, case_ids)

    def finish_run(self, interrupted: bool) -> list[str]:
        """Write results.json and the report; returns the ids of the run's selected cases
        that have no finished record (in matrix order): none when it is complete."""
        from conformance.executor import now_iso
        from conformance.run_info import suite_version
        from records.store import write_run
        from records.events import merge_records

        report_dir = self.options.report_dir
        self.begin_fresh_run()  # an empty --shard part: its results.json still replaces
        order = [c.id for c in self.cases()]
        expected = self._expected | self._previously_selected()
        # a record of a case outside the run's selection is damage (an outside audit: a resume
        # counted it, said "13 PASS" and exit 0, and wrote a file its report called damaged);
        # a resumed run whose selection is not known leaves every record in
        known = expected and (not self.options.resume or self._resumes_known_cases())
        merged = merge_records(report_dir, order, expected if known else None)
        from conformance.runner import run_environment

        environment = merged.environment or run_environment(self.backend, 1)
        recorded = {r.case_id for r in merged.records}
        # a case cut off in the interrupted process (a CRASH record by the store's rule) that
        # this command did not run again is as missing as one never started
        cut_off_before = set(merged.unfinished) - self._expected
        in_order = [cid for cid in order if cid in expected] + sorted(expected - set(order))
        missing = [cid for cid in in_order if cid not in recorded or cid in cut_off_before]
        # a run that fuzzes is whole once its fuzzing test ran its search to the end (a kill,
        # a stop or a crashed worker mid-search leaves examples undrawn)
        from records.events import fuzzing_done

        fuzzing_cut = self.fuzzing_cut = self._run_fuzzes() and not fuzzing_done(report_dir)
        # stopped once every case had finished (the last reports still on their way from the
        # workers): nothing was cut off, nothing is missing, the run is whole; not a run that
        # fuzzes, whose exit status would then ignore its fuzzing test's (a review: exit 0
        # for a fuzzing run that had failed)
        finished_first = interrupted and not missing and not self._run_fuzzes() \
            and not set(merged.unfinished) & expected
        complete = (not interrupted or finished_first) and not missing and not fuzzing_cut
        if self._resumes_known_cases():
            self.summary_lines.extend(
                _outside_resumed_run(self.selected, self.shard_ids(), expected))
        selection = self._whole_run_selection(self._whole_run_ids(in_order))
        if not self._resumes_known_cases():
            self._write_manifest(selection)  # its case ids, known now under xdist: kept
        results = write_run(report_dir, merged, environment, self._recorded_options(),
                            suite_version(), self._started_at, now_iso(), complete,
                            selected_count=len(expected) or None, selection=selection)
        self._written = results.records
        counts: dict[str, int] = {}
        for record in results.records:
            counts[record.label.value] = counts.get(record.label.value, 0) + 1
        tally = ", ".join(f"{n} {label}" for label, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        from reports.formatting import recorded_of_selected

        held = recorded_of_selected(results.records, None if complete else len(expected))
        why = " (incomplete run: its fuzzing did not finish)" if fuzzing_cut and not missing \
            else " (incomplete run)"
        self.summary_lines.append(f"{held} on {self.backend.name}: {tally or 'none run'}"
                                  f"{'' if complete else why}")
        self.summary_lines.append(f"results: {report_dir / 'results.json'}")
        if self.options.fuzz_examples > 0 and not self._run_fuzzes():  # said, not assumed
            shard = self.options.shard
            self.summary_lines.append(
                f"--fuzz-examples {self.options.fuzz_examples}: nothing was fuzzed here: " + (
                    "fuzzing is the first --shard part's (docs/scale-out.md)"
                    if shard is not None and shard[0] != 0 else
                    "its test path, -k or -m left conformance/test_fuzz.py out"))
        if merged.damaged:  # said, as recover says it (a review: dropped without a word)
            from records.events import damage_line

            self.summary_lines.append(damage_line(merged, report_dir))
        self.summary_lines.extend(_untriaged_line(results.records))
        if finished_first:
            self.exit_after_stop = exit_status_of(results.records, self._expected) or int(
                bool(self.options.resume and self.failed_before_resume()))  # as a resume's end
            self.summary_lines.append("stopped after every case had finished: the run is "
                                      "complete")
        from records.errors import is_not_judged

        not_judged = sum(1 for r in results.records if is_not_judged(r))
        if (not complete or not_judged) and (results.records or fuzzing_cut):  # what stays
            from conformance.run_info import matrix_path
            from reports.summary import resume_command

            command = resume_command(results, report_dir, matrix_path())
            if not_judged:
                self.summary_lines.append(f"{not_judged} case(s) not judged: a disk was full; "
                                          "make room, then --resume runs them again")
            self.summary_lines.append(f"finish it: {command}" if not complete else
                                      f"run them again: {command}")
        from conformance.kept_outputs import summary_lines

        self.summary_lines.extend(summary_lines(results.records, report_dir))
        self.summary_lines.extend(_render_report(results, report_dir))
        return missing


def _outside_resumed_run(selected: list[str] | None, shard: set[str] | None,
                         run: set[str]) -> list[str]:
    """The summary line for cases this command's -k / -m selected (in its shard) that the
    resumed run did not (they were not run: --resume finishes that run, it does not widen
    it)."""
    outside = [cid for cid in selected or ()
               if (shard is None or cid in shard) and cid not in run]
    if not outside:
        return []
    return [f"--resume: {len(outside)} case(s) selected here are not part of the interrupted "
            f"run and were not run (e.g. {outside[0]}); run them without --resume"]


def _untriaged_line(records) -> list[str]:
    """The summary line for known failures that --expectations accepted on a reason that
    still reads as `flexconf expectations update` wrote it: the run said "xfailed" and exit 0
    with no word of it, where the gate flags them (an outside audit)."""
    from reports.expectations import TRIAGE_REASON

    untriaged = [r for r in records if (r.expected_failure or "").startswith(TRIAGE_REASON)]
    if not untriaged:
        return []
    return [f"{len(untriaged)} known failure(s) accepted by --expectations on a reason that "
            f"still reads '{TRIAGE_REASON} ...' (e.g. {untriaged[0].case_id}): give each entry "
            "a reason and a link"]


def exit_status_of(records, own_ids: set[str]) -> int:
    """pytest's exit status for a command whose tests were the cases ``own_ids`` (a resume's
    are the cases it ran, not the store's): 1 where one of them fails its test, else 0."""
    from conformance.runner import fails_its_test

    return int(any(fails_its_test(r) for r in records if r.case_id in own_ids))


def results_not_written(report_dir: Path, error: OSError) -> str:
    """The summary line of a run whose results.json could not be written (a full disk, a
    directory removed under it): what finished is in its record store, and how to keep it."""
    from shlex import quote

    from records.text import one_line

    where = quote(one_line(str(report_dir)))  # pasted as printed (a path with a space failed)
    return (f"the results could not be written into {report_dir}: {type(error).__name__}: "
            f"{one_line(str(error))}; what finished is kept in {report_dir / 'records'}: make "
            f"room, then flexconf recover {where} (or finish the run with --resume {where} and "
            "its options)")


def _render_report(results, report_dir: Path) -> list[str]:
    try:
        from reports.render import write_report
    except ImportError:
        return []
    try:
        write_report(results, report_dir, baseline=None)
    except Exception as exc:  # noqa: BLE001 - results.json is written; say why the report is not
        return [f"report not written: {type(exc).__name__}: {exc}"]
    return [f"report: {report_dir / 'index.html'}"]


def worker_count(config) -> int:
    """The number of xdist workers (1 without -n; -n capped by --maxprocesses)."""
    count = getattr(config.option, "numprocesses", None)
    cap = getattr(config.option, "maxprocesses", None)
    if isinstance(count, int) and isinstance(cap, int) and cap > 0:
        count = min(count, cap)
    return count if isinstance(count, int) and count > 0 else 1
