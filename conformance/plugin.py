"""The pytest plugin of the conformance matrix (loaded by the top-level conftest.py).

Roles: without xdist one process does everything; with ``-n N`` the controller clears the
records at the start and merges them into results.json at the end, and each worker runs its
cases through its own Executor (one supervised child) and appends records. The plugin is
active only when the invocation reaches the matrix (``pytest conformance/``); ``pytest tests/``
leaves report directories alone.

A run never leaves a lie behind: at its start the controller sets an earlier run's results
aside (``REPORT_DIR/previous/``) and writes the run's manifest, so until it finishes the
directory holds no results.json; SIGTERM and SIGHUP stop it the way Ctrl-C does (children
killed, ``complete: false``, a report of what finished); after ``kill -9``, ``flexconf recover``
renders what finished and ``--resume REPORT_DIR`` runs the rest.

Sharding: every process parametrizes the whole matrix; after ``-k`` and ``-m`` have deselected,
the plugin notes the selected case ids (the whole run's selection, recorded in results.json for
``flexconf merge``) and deselects the cases of other shards. Under xdist the controller
collects nothing: workers report the selection through ``workeroutput``.

Outcomes: PASS passes, UNSUPPORTED skips with the reason, every other label fails with a message
whose first line starts with ``[LABEL]``.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from conformance import cache_dirs, options as opts, termination
from conformance.process_gc import freeze_at_exit, imported_for_good
from conformance.run_cases import select_run_cases, shard_case_ids
from conformance.run_lifecycle import RunLifecycle, results_not_written, worker_count
from records.events import fuzzing_done

MATRIX_DIR = Path(__file__).resolve().parent
_STATE = pytest.StashKey["ConformanceSession"]()
#: The controller's watch for its last test's report (termination.LastTestWatch).
_LAST_TEST: dict[str, "termination.LastTestWatch"] = {}
_SELECTED = "flexconf_selected_case_ids"  # workeroutput key: a worker's pre-shard selection


def pytest_addoption(parser) -> None:
    opts.register(parser)


def pytest_configure(config) -> None:
    try:
        options = opts.parse(config.getoption, Path(config.invocation_params.dir))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    # read by the neuron backend in every child (docs/backends.md)
    os.environ["FLEXCONF_NEURON_CORES_PER_WORKER"] = str(options.neuron_cores_per_worker)
    os.environ["FLEXCONF_NEURON_DEVICE_CHECK"] = options.neuron_device_check
    state = ConformanceSession(config, options)
    config.stash[_STATE] = state
    if state.active:
        termination.interrupt_on_termination(
            lambda: termination.xdist_worker_pids(config) if state.is_controller else ())
    if state.active and state.is_controller:  # logreport's hook is given no config
        _LAST_TEST["watch"] = termination.LastTestWatch()
    if state.active and state.is_controller:
        _check_selection_expressions(config)
    if state.active:  # every process of a run needs torch (conformance/process_gc.py)
        with imported_for_good():
            importlib.import_module("torch")
        freeze_at_exit()
    if state.active and state.is_controller:
        state.validate_backend()
        state.start_run()


def _check_selection_expressions(config) -> None:
    """A bad -k or -m is a usage error before the run starts (nothing set aside), also under
    xdist, whose workers would each fail to collect and take the controller down with an
    INTERNALERROR. pytest's own parser judges and words it (a private function: where this
    pytest lacks it, the workers say it, as before)."""
    try:
        from _pytest.mark import _parse_expression
    except ImportError:
        return
    for flag, text in (("-k", config.option.keyword), ("-m", config.option.markexpr)):
        if text:
            try:
                _parse_expression(text, f"Wrong expression passed to '{flag}'")  # UsageError
            except TypeError:  # its signature changed: leave the check to the workers
                return


def pytest_generate_tests(metafunc) -> None:
    if "conformance_case" in metafunc.fixturenames:
        cases = metafunc.config.stash[_STATE].cases()
        metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])


@pytest.fixture(scope="session")
def conformance_options(request) -> opts.RunOptions:
    """The run's parsed options (conformance/options.py)."""
    return request.config.stash[_STATE].options


@pytest.fixture(scope="session")
def conformance_runner(request):
    """The worker's runner: executes a case, records it, and turns its label into an outcome."""
    return request.config.stash[_STATE].runner()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config, items) -> None:
    """Note the whole run's selection, then keep this shard's cases; with ``--resume``, only
    the interrupted run's cases that have no record yet (the controller names any others the
    -k / -m of this command selected, see finish_run). The fuzzing test is the first shard's
    (every shard would draw the same examples, one seed, and the merge found each duplicated),
    and no resume's once the run's fuzzing ended, nor of a run that did not fuzz."""
    state = config.stash[_STATE]
    ids = [_case_id(item.nodeid) for item in items]
    state.select([i for i in ids if i is not None])
    if state.is_worker:
        config.workeroutput[_SELECTED] = state.selected
    shard, done, run = state.shard_ids(), state.resumed_ids(), state.resumed_selection()
    if shard is None and not done and run is None:
        return
    # a resume of a run whose fuzzing ended has none left: the search would run again, and
    # shrink a failure again (a review: recover's "this runs no case" resume did)
    fuzzes = (state.options.shard is None or state.options.shard[0] == 0) \
        and not (state.options.resume and (state.resumed_run_fuzzed() is False
                                           or fuzzing_done(state.options.report_dir)))
    dropped = [item for item, i in zip(items, ids)
               if (i is None and not fuzzes and state.options.fuzz_examples > 0
                   and _is_fuzz_test(item.nodeid))
               or i is not None and ((shard is not None and i not in shard) or i in done
                                     or (run is not None and i not in run))]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Longest first (conformance/schedule.py) under ``-n N`` with xdist's load distribution."""
    state = config.stash.get(_STATE, None)
    if state is None or state.schedule is None or config.getoption("dist", "load") != "load":
        return None
    from conformance.schedule import make_scheduler

    return make_scheduler(config, log, state.schedule, _case_id)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    selected = getattr(node, "workeroutput", {}).get(_SELECTED)
    state = node.config.stash[_STATE]
    if selected is not None and state.selected is None:
        state.select(selected)


def pytest_collection_finish(session) -> None:
    state = session.config.stash[_STATE]
    state.collected([item.nodeid for item in session.items])
    watch = _LAST_TEST.get("watch")
    if watch is not None and session.items:  # an xdist controller collects none: see below
        watch.expect(len(session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    node.config.stash[_STATE].collected(ids)  # before xdist schedules any test
    watch = _LAST_TEST.get("watch")
    if watch is not None:
        watch.expect(len(ids))  # every worker collects them all


def pytest_sessionfinish(session, exitstatus) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    state.close_runner()
    if state.active and state.is_controller:
        if state.nothing_selected() and (exitstatus == pytest.ExitCode.INTERRUPTED
                                         or termination.stopped_by_signal()):
            state.keep_empty_run_results()
            state.begin_fresh_run()  # stopped, not empty: the earlier run stays set aside
            state.summary_lines.append(  # as flexconf recover says of the same store
                "interrupted before any case was selected: nothing ran and no results were "
                "written; run it again")
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        elif state.nothing_selected() and not state.empty_part_of_a_selection():
            state.restore_unselected_run()
            state.summary_lines.append(
                "0 cases selected: nothing ran, so nothing can conform; widen -k / -m / "
                "--case-id (flexconf list prints the case ids)")
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
        else:
            interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
            try:
                missing = state.finish_run(interrupted=interrupted)
            except OSError as exc:  # a full disk, a directory gone: the records stay
                state.summary_lines.append(results_not_written(state.options.report_dir, exc))
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            else:
                _end_of_run(session, state, missing, interrupted)
                if state.exit_after_stop is not None:  # every case had finished
                    session.exitstatus = pytest.ExitCode(state.exit_after_stop)
    if state.active:
        termination.restore_termination_handlers()


def _end_of_run(session, state, missing: list[str], interrupted: bool) -> None:
    """The exit status of a run whose results are written, where it is not pytest's own."""
    if state.options.resume and not interrupted:
        _end_of_resume(session, state, missing)
    elif state.fuzzing_cut and not interrupted:  # its fuzzing worker was lost mid-search
        state.summary_lines.append(  # 1 would say "finished, some failed" (docs/scale-out.md)
            "the run's fuzzing did not finish (its fuzzing test did not end: a worker lost, a "
            "timeout, or a test that did not start); finish it with the command above")
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    elif state.nothing_selected() and not interrupted:  # an empty part: merge it
        state.summary_lines.append(
            f"--shard {state.options.shard[0] + 1}/{state.options.shard[1]}: none of the "
            f"{len(state.selected)} selected case(s) is in this part; its results.json "
            "has no records, for flexconf merge")
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


def _end_of_resume(session, state, missing: list[str]) -> None:
    """The summary names the run's cases still without a finished record (a narrower -k or
    -m left them): the run is not finished, and exits as an interrupted one (2), never 0, 1
    or 5, which say a part finished (docs/scale-out.md). A finished run exits as the whole
    run would have: 1 where a record of it, finished before the stop too, fails its test
    (an outside audit: a resume exited 0 over a MISMATCH recorded before the kill)."""
    ran_nothing = not state.ran_any_case() and not state.fuzzes_here()
    failed_before = state.failed_before_resume()
    if state.fuzzing_cut:  # as a case left without a record: the run is not finished
        state.summary_lines.append(
            "--resume: the run's fuzzing did not finish (its search was cut off again); resume "
            "again to finish it" if state.fuzzes_here() else
            "--resume: the run's fuzzing did not finish, and this command did not fuzz (its test "
            "path or -k left conformance/test_fuzz.py out); finish it with the command above")
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    elif missing:
        state.summary_lines.append(
            f"--resume: {len(missing)} case(s) of the run still have no finished record "
            f"(e.g. {missing[0]}); resume without narrowing -k / -m to run them")
        session.exitstatus = pytest.ExitCode.INTERRUPTED
    elif failed_before:
        state.summary_lines.append(
            f"--resume: {len(failed_before)} record(s) of the run failed before it was stopped "
            f"(e.g. {failed_before[0]}): the run exits 1, as the whole run would have")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif ran_nothing:
        state.summary_lines.append("--resume: every case of the run had a record already; "
                                   "nothing was left to run")
        session.exitstatus = pytest.ExitCode.OK


def pytest_runtest_logreport(report) -> None:
    """From the last test's report on, the run ends (children closed, xdist's teardown, the
    results written): a stop signal there raised inside xdist's teardown, and the run ended
    with exit 130, a traceback and no results.json (an outside audit). It is ignored now,
    with a line saying so (termination.LastTestWatch), until the results are written."""
    watch = _LAST_TEST.get("watch")
    if report.when in ("teardown", "???") and watch is not None:  # ???: xdist's crashed test
        watch.finished(report.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session):
    """The same from the end of a test loop that ran every test, where a test's last report
    never came (a worker killed by pytest-timeout's os._exit, say)."""
    outcome = yield
    if outcome.excinfo is None and _LAST_TEST.get("watch") is not None:
        _LAST_TEST["watch"].loop_ended()


def pytest_keyboard_interrupt(excinfo) -> None:
    """The run is stopping (Ctrl-C, or SIGTERM or SIGHUP through conformance/termination.py),
    and this interrupt was not lost: until the run's results are written, another Ctrl-C,
    SIGTERM or SIGHUP is ignored with a line saying so, for termination.STOP_GRACE_SECONDS.
    The stop under way (children killed, xdist's teardown, what finished written: 5-8 s) is
    what it asks for; a second Ctrl-C that landed in xdist's teardown raised there, and the
    run ended with a traceback and without its results.json (an audit, 2026-12-04). Only
    where this run set the handlers (an active run)."""
    if termination.handlers_replaced():
        termination.ignore_signals_while_stopping()


def pytest_unconfigure(config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close_runner()
        state.release_run_lock()
    # also after a usage error, which skips sessionfinish
    termination.restore_termination_handlers()
    _LAST_TEST.pop("watch", None)


def pytest_terminal_summary(terminalreporter) -> None:
    state = terminalreporter.config.stash.get(_STATE, None)
    if state is not None and state.summary_lines:
        terminalreporter.section("flexattention conformance")
        for line in state.summary_lines:
            terminalreporter.write_line(line)


def _case_ids(nodeids) -> set[str]:
    return {i for i in map(_case_id, nodeids) if i is not None}


def _is_fuzz_test(nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    return Path(path).name == "test_fuzz.py" and rest == "test_fuzz"


def _case_id(nodeid: str) -> str | None:
    """The case id of a matrix test's node id, None for any other test."""
    path, _, rest = nodeid.partition("::")
    if Path(path).name == "test_matrix.py" and rest.startswith("test_case[") and rest.endswith("]"):
        case_id = rest[len("test_case["):-1]
        # pytest's placeholder for an empty parameter set (a fuzz-only case module): no case
        return None if case_id == "NOTSET" else case_id
    return None


class ConformanceSession(RunLifecycle):
    """Per-process state of the plugin (kept in config.stash, no globals)."""

    def __init__(self, config, options: opts.RunOptions):
        self.config, self.options = config, options
        self.is_worker = hasattr(config, "workerinput")
        self.is_controller = not self.is_worker
        # --collect-only lists cases: it must not clear records nor overwrite results.json
        self.active = _reaches_matrix(config) and not config.option.collectonly
        self.summary_lines: list[str] = []
        self._cases = None
        self._shard_ids: set[str] | None = None
        self.selected: list[str] | None = None  # case ids selected before sharding
        self._runner = None
        self._expected: set[str] = set()
        self._fuzzing = False  # the fuzz test was collected with --fuzz-examples > 0
        self._started_at = ""
        self.schedule = None  # the controller's cost model (conformance/schedule.py)
        self._manifest = None  # the resumed run's (--resume)
        self._resumed_ids: set[str] | None = None

    # -- cases ----------------------------------------------------------------------------
    def cases(self) -> list:
        """Every case of the run's matrix or case file (all shards)."""
        if self._cases is None:
            try:
                self._cases = select_run_cases(self.options)
                self._shard_ids = shard_case_ids(self._cases, self.options)
            except ValueError as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._cases

    def shard_ids(self) -> set[str] | None:
        """The case ids of this process's shard, None without --shard."""
        self.cases()
        return self._shard_ids

    def select(self, case_ids: list[str]) -> None:
        """Note the case ids selected (by -k, -m) for the whole run, before sharding."""
        self.selected = list(case_ids)

    def collected(self, node_ids: list[str]) -> None:
        """The tests this process (or an xdist worker) will run: a run that has a case among
        them, or fuzzing to do, begins here (its directory cleared), before the first starts."""
        self._fuzzing = self._fuzzing or (self.options.fuzz_examples > 0 and any(
            _is_fuzz_test(node_id) for node_id in node_ids))
        case_ids = _case_ids(node_ids)
        if self.active and self.is_controller and (case_ids or self._fuzzing):
            self.begin_fresh_run()
        self.expect(case_ids)

    def expect(self, case_ids: set[str]) -> None:
        self._expected |= case_ids
        if self.active and self.is_controller and case_ids:
            self._write_manifest()

    def resumed_ids(self) -> set[str]:
        """With ``--resume``: the cases of the store that finished (in any process)."""
        if not self.options.resume:
            return set()
        if self._resumed_ids is None:
            from records.events import finished_ids

            self._resumed_ids = finished_ids(self.options.report_dir)
        return self._resumed_ids

    def fuzzes_here(self) -> bool:
        """Whether this command collected the fuzzing test (with --fuzz-examples > 0)."""
        return self._fuzzing

    def ran_any_case(self) -> bool:
        """Whether this command collected any case of the matrix to run (the controller)."""
        return bool(self._expected)

    def nothing_selected(self) -> bool:
        return not (self._expected or self._previously_selected() or self._run_fuzzes())

    def empty_part_of_a_selection(self) -> bool:
        """Whether -k / -m selected cases of the whole run and this --shard part holds none of
        them (a finished part with no records, which merges; not a usage error)."""
        return self.options.shard is not None and bool(self.selected) \
            and not self.options.resume

    # -- controller -----------------------------------------------------------------------
    def validate_backend(self) -> None:
        from conformance.backends.registry import (BackendError, check_env_hooks,
                                                   environment_of, resolve_backend)

        if self.options.reference_device == "cuda":
            import torch

            from conformance.backends.cuda import reference_gpus_problem
            from conformance.compat import TF32_OVERRIDE_ENV

            if not torch.cuda.is_available():
                raise pytest.UsageError("--reference-device cuda: torch sees no CUDA device "
                                        "here; use --reference-device cpu")
            problem = reference_gpus_problem()
            if problem:
                raise pytest.UsageError(problem)
            if os.environ.get(TF32_OVERRIDE_ENV, "0") not in ("", "0"):
                raise pytest.UsageError(
                    f"--reference-device cuda: {TF32_OVERRIDE_ENV}="
                    f"{os.environ[TF32_OVERRIDE_ENV]} makes cuBLAS round float32 products to "
                    "TF32, and the float32 baseline the verdict scales by must be IEEE float32; "
                    f"unset {TF32_OVERRIDE_ENV} or use --reference-device cpu")
        from conformance.compat import require_supported_torch
        from conformance.runner import load_expectations

        try:
            require_supported_torch()
            self.backend = resolve_backend(self.options.backend)
            self.backend.check_worker_count(worker_count(self.config))
            environment_of(self.backend, self.options.backend)  # one line now, not at the end
            check_env_hooks(self.backend, self.options.backend, worker_count(self.config))
            load_expectations(self.options.expectations)
            cache_dirs.check_reference_cache(
                self.options.reference_cache,
                self.config.getoption("--reference-cache") is not None)
            cache_dirs.check_compile_cache(self.options, self.backend.name)
            self._check_fuzz_sources()
            self._check_compile_phase()
        except (BackendError, ValueError, RuntimeError) as exc:
            raise pytest.UsageError(str(exc)) from None
        self.cases()  # a bad --case-file or --shard fails now, once, in the controller

    def _check_compile_phase(self) -> None:
        """--phase compile on a backend that compiles nothing fills no cache (an audit)."""
        if self.options.phase == "compile" and self.backend.compiled is False:
            raise ValueError(f"--phase compile: backend {self.backend.name} compiles nothing, "
                             "so there is no cache to fill; run without --phase")

    def _check_fuzz_sources(self) -> None:
        """--fuzz-examples with --matrix custom fuzzes only the case modules' variants: none
        is a usage error now, not a failed test after the run."""
        if self.options.fuzz_examples <= 0 or self.options.matrix != "custom":
            return
        from cases.custom import fuzz_variant_sources

        if not fuzz_variant_sources(list(self.options.cases_modules)):
            raise ValueError("--matrix custom fuzzes only case modules' variants, and no case "
                             "module defines fuzz_variants(shape); define one (docs/cases.md)")

    # -- worker ---------------------------------------------------------------------------
    def runner(self):
        if self._runner is None:
            self._runner = _build_runner(self.options, getattr(self.config, "workerinput", None),
                                         self.selected)
        return self._runner

    def close_runner(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def _build_runner(options: opts.RunOptions, workerinput: dict | None,
                  selection: list[str] | None = None):
    from conformance.runner import Runner

    return Runner(options, workerinput, selection)


def _reaches_matrix(config) -> bool:
    """Whether the invocation's paths include the matrix directory (or lie inside it)."""
    for arg in config.args:
        path = Path(str(arg).split("::")[0])
        if not path.is_absolute():
            path = Path(config.invocation_params.dir) / path
        path = path.resolve()
        if path == MATRIX_DIR or MATRIX_DIR in path.parents or path in MATRIX_DIR.parents:
            return True
    return False
