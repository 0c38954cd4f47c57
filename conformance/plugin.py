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

import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

import pytest

from conformance import options as opts
from conformance.run_lifecycle import RunLifecycle, worker_count

MATRIX_DIR = Path(__file__).resolve().parent
_STATE = pytest.StashKey["ConformanceSession"]()
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
        _interrupt_on_termination(lambda: _xdist_worker_pids(config) if state.is_controller
                                  else ())
    if state.active and state.is_controller:
        _check_selection_expressions(config)
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
    -k / -m of this command selected, see finish_run)."""
    state = config.stash[_STATE]
    ids = [_case_id(item.nodeid) for item in items]
    state.select([i for i in ids if i is not None])
    if state.is_worker:
        config.workeroutput[_SELECTED] = state.selected
    shard, done, run = state.shard_ids(), state.resumed_ids(), state.resumed_selection()
    if shard is None and not done and run is None:
        return
    dropped = [item for item, i in zip(items, ids)
               if i is not None and ((shard is not None and i not in shard) or i in done
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
    state.expect(_case_ids(item.nodeid for item in session.items))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    node.config.stash[_STATE].expect(_case_ids(ids))


def pytest_sessionfinish(session, exitstatus) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    state.close_runner()
    if state.active and state.is_controller:
        if state.nothing_selected() and (exitstatus == pytest.ExitCode.INTERRUPTED
                                         or _INTERRUPTED_AT):
            state.summary_lines.append(  # as flexconf recover says of the same store
                "interrupted before any case was selected: nothing ran and no results were "
                "written; run it again")
            session.exitstatus = pytest.ExitCode.INTERRUPTED
        elif state.nothing_selected() and not state.empty_part_of_a_selection():
            state.summary_lines.append(
                "0 cases selected: nothing ran, so nothing can conform; widen -k / -m / "
                "--case-id (flexconf list prints the case ids)")
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
        else:
            interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
            missing = state.finish_run(interrupted=interrupted)
            if state.options.resume and not interrupted:
                _end_of_resume(session, state, missing)
            elif state.nothing_selected() and not interrupted:  # an empty part: merge it
                state.summary_lines.append(
                    f"--shard {state.options.shard[0] + 1}/{state.options.shard[1]}: none of the "
                    f"{len(state.selected)} selected case(s) is in this part; its results.json "
                    "has no records, for flexconf merge")
                session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    if state.active:
        _restore_termination_handlers()


def _end_of_resume(session, state, missing: list[str]) -> None:
    """The summary names the run's cases still without a finished record (a narrower -k or
    -m left them). A command that ran no case exits 0 when the run is complete, and as
    pytest's "no tests ran" (5) when it is not."""
    ran_nothing = not state.ran_any_case()
    if missing:
        state.summary_lines.append(
            f"--resume: {len(missing)} case(s) of the run still have no finished record "
            f"(e.g. {missing[0]}); resume without narrowing -k / -m to run them")
        if ran_nothing:
            session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    elif ran_nothing:
        state.summary_lines.append("--resume: every case of the run had a record already; "
                                   "nothing was left to run")
        session.exitstatus = pytest.ExitCode.OK


def pytest_keyboard_interrupt(excinfo) -> None:
    """The run is stopping (Ctrl-C, or SIGTERM or SIGHUP through _interrupt_on_termination),
    and this interrupt was not lost: until the run's results are written
    (_restore_termination_handlers), another Ctrl-C, SIGTERM or SIGHUP is ignored with a line
    saying so, for _STOP_GRACE_SECONDS. The stop under way (children killed, xdist's teardown,
    what finished written: 5-8 s) is what it asks for; a second Ctrl-C that landed in xdist's
    teardown raised there, and the run ended with a traceback and without its results.json
    (an audit, 2026-12-04). Only where this run set the handlers (an active run:
    _REPLACED_HANDLERS)."""
    if _REPLACED_HANDLERS:
        _ignore_signals_while_stopping()


#: How long a stop under way ignores further signals; one after that stops at once (a stop
#: that hangs, a worker that never answers, is not waited for forever).
_STOP_GRACE_SECONDS = 30.0


def _ignore_signals_while_stopping() -> None:
    began, said = time.monotonic(), []

    def stopping(signum, _frame):
        name = signal.Signals(signum).name
        if time.monotonic() - began > _STOP_GRACE_SECONDS:
            raise KeyboardInterrupt(f"received {name} while stopping")
        if not said:
            said.append(True)
            print(f"\nflexconf: {name} ignored: the run is already stopping and writing what "
                  f"finished (one after {_STOP_GRACE_SECONDS:.0f} s stops it at once)",
                  file=sys.stderr, flush=True)

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(number)
        if previous is signal.SIG_IGN:
            continue
        try:
            signal.signal(number, stopping)
        except ValueError:  # not the main thread
            return
        _REPLACED_HANDLERS.setdefault(number, signal.SIG_DFL if previous is None else previous)


def _restore_termination_handlers() -> None:
    """Once the run's results are written, SIGTERM and SIGHUP (and Ctrl-C, where the run
    stopped on a signal) get back what they did before the run: nothing is left to keep, and
    pytest's own exit (its garbage collection passes, seconds with torch loaded) is no place
    for a KeyboardInterrupt and its traceback."""
    while _REPLACED_HANDLERS:
        number, previous = _REPLACED_HANDLERS.popitem()
        signal.signal(number, previous)


def pytest_unconfigure(config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close_runner()
        state.release_run_lock()
    _restore_termination_handlers()  # also after a usage error, which skips sessionfinish


def pytest_terminal_summary(terminalreporter) -> None:
    state = terminalreporter.config.stash.get(_STATE, None)
    if state is not None and state.summary_lines:
        terminalreporter.section("flexattention conformance")
        for line in state.summary_lines:
            terminalreporter.write_line(line)


#: signal number -> the handler _interrupt_on_termination replaced, put back at the end.
_REPLACED_HANDLERS: dict[int, object] = {}
#: When a termination signal last stopped the run (time.monotonic()). Another within
#: _ECHO_SECONDS is its echo, and is ignored: ``timeout`` and Slurm signal the process group as
#: well as the process, so the controller gets SIGTERM twice, and a second KeyboardInterrupt
#: would land in pytest's handling of the first (or in writing the results). A later one stops
#: the run again, for the first may have been lost: one raised inside a __del__ or a garbage
#: collector's callback is printed as "Exception ignored" and dropped.
_INTERRUPTED_AT: list[float] = []
_ECHO_SECONDS = 5.0


def _interrupt_on_termination(workers: Callable[[], Iterable[int]]) -> None:
    """SIGTERM (Slurm, Kubernetes, CI cancellation) and SIGHUP (a closed terminal) stop the
    run as Ctrl-C does: children killed, what finished written as an incomplete run. A signal
    the run was started ignoring stays ignored: under ``nohup`` a hangup does not stop it.

    The controller passes the signal on to its xdist workers (``workers()``: their pids), so
    a signal sent to it alone (``kill PID``, a container's init) stops them as Ctrl-C does, at
    once: each kills its supervised child and compiler processes and records what it was
    running as cut off. Without that they went on starting their queued cases until xdist's
    teardown ended them 10-15 s later (when the run was started with SIGINT ignored, as a
    background job is, execnet's interrupt does nothing). Where the signal went to the whole
    process group too, the worker takes the second copy as an echo."""
    def interrupt(signum, _frame):
        now = time.monotonic()
        if _INTERRUPTED_AT and now - _INTERRUPTED_AT[-1] < _ECHO_SECONDS:
            return  # the echo of the signal whose stop is under way
        _INTERRUPTED_AT.append(now)
        for pid in workers():
            try:
                os.kill(pid, signum)
            except OSError:  # gone already
                pass
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    _restore_termination_handlers()  # a run before this one in the process left them
    _INTERRUPTED_AT.clear()
    for number in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(number)
        if previous is signal.SIG_IGN:
            continue
        try:
            signal.signal(number, interrupt)
        except ValueError:  # not the main thread: leave the default
            return
        _REPLACED_HANDLERS[number] = signal.SIG_DFL if previous is None else previous


def _xdist_worker_pids(config) -> list[int]:
    """The pids of this controller's running xdist workers (none without xdist). execnet,
    which starts them, does not publish the pid: it is read where execnet keeps its Popen."""
    dsession = config.pluginmanager.getplugin("dsession")
    group = getattr(getattr(dsession, "nodemanager", None), "group", None)
    pids = []
    for gateway in list(group or ()):
        popen = getattr(getattr(gateway, "_io", None), "popen", None)
        if popen is not None and popen.poll() is None:
            pids.append(popen.pid)
    return pids


def _case_ids(nodeids) -> set[str]:
    return {i for i in map(_case_id, nodeids) if i is not None}


def _case_id(nodeid: str) -> str | None:
    """The case id of a matrix test's node id, None for any other test."""
    path, _, rest = nodeid.partition("::")
    if Path(path).name == "test_matrix.py" and rest.startswith("test_case[") and rest.endswith("]"):
        return rest[len("test_case["):-1]
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
        self._started_at = ""
        self.schedule = None  # the controller's cost model (conformance/schedule.py)
        self._manifest = None  # the resumed run's (--resume)
        self._resumed_ids: set[str] | None = None

    # -- cases ----------------------------------------------------------------------------
    def cases(self) -> list:
        """Every case of the run's matrix or case file (all shards)."""
        if self._cases is None:
            try:
                self._cases = _select_cases(self.options)
                self._shard_ids = _shard_ids(self._cases, self.options)
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

    def expect(self, case_ids: set[str]) -> None:
        self._expected |= case_ids
        if self.active and self.is_controller and case_ids:
            self._write_manifest()

    def resumed_ids(self) -> set[str]:
        """With ``--resume``: the cases of the store that finished (in any process)."""
        if not self.options.resume:
            return set()
        if self._resumed_ids is None:
            from records.store import finished_ids

            self._resumed_ids = finished_ids(self.options.report_dir)
        return self._resumed_ids

    def ran_any_case(self) -> bool:
        """Whether this command collected any case of the matrix to run (the controller)."""
        return bool(self._expected)

    def nothing_selected(self) -> bool:
        return not (self._expected or self._previously_selected() or self.options.fuzz_examples)

    def empty_part_of_a_selection(self) -> bool:
        """Whether -k / -m selected cases of the whole run and this --shard part holds none of
        them (a finished part with no records, which merges; not a usage error)."""
        return self.options.shard is not None and bool(self.selected) \
            and not self.options.resume

    # -- controller -----------------------------------------------------------------------
    def validate_backend(self) -> None:
        from conformance.backends.registry import BackendError, resolve_backend

        if self.options.reference_device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise pytest.UsageError("--reference-device cuda: torch sees no CUDA device "
                                        "here; use --reference-device cpu")
        from conformance.compat import require_supported_torch
        from conformance.runner import load_expectations

        try:
            require_supported_torch()
            self.backend = resolve_backend(self.options.backend)
            self.backend.check_worker_count(worker_count(self.config))
            load_expectations(self.options.expectations)
            opts.check_reference_cache(self.options.reference_cache)
        except (BackendError, ValueError, RuntimeError) as exc:
            raise pytest.UsageError(str(exc)) from None
        self.cases()  # a bad --case-file or --shard fails now, once, in the controller

    # -- worker ---------------------------------------------------------------------------
    def runner(self):
        if self._runner is None:
            self._runner = _build_runner(self.options, getattr(self.config, "workerinput", None))
        return self._runner

    def close_runner(self) -> None:
        if self._runner is not None:
            self._runner.close()
            self._runner = None


def _build_runner(options: opts.RunOptions, workerinput: dict | None):
    from conformance.runner import Runner

    return Runner(options, workerinput)


def _select_cases(options: opts.RunOptions) -> list:
    from cases.custom import import_case_modules, select_cases

    if options.case_file:  # a spec may name a custom variant: register its module first
        import_case_modules(list(options.cases_modules))
        cases = opts.load_case_file(options.case_file)
    else:
        cases = select_cases(options.profile, options.matrix, list(options.cases_modules))
    if not options.case_ids:
        return cases
    by_id = {case.id: case for case in cases}
    unknown = [cid for cid in options.case_ids if cid not in by_id]
    if unknown:
        from records.text import one_line

        source = f"--case-file {options.case_file}" if options.case_file else \
            f"--matrix {options.matrix} --profile {options.profile}"
        raise ValueError(f"--case-id {one_line(unknown[0])!r} is not a case of {source}; "
                         "flexconf list prints the ids (give the same --matrix, --profile "
                         "and --cases-module)")
    return [by_id[cid] for cid in options.case_ids]


def _shard_ids(cases: list, options: opts.RunOptions) -> set[str] | None:
    """The ids of the cases of ``options.shard`` (split over the whole matrix, so -k selects
    within the part), None without --shard."""
    if options.shard is None:
        return None
    from conformance.sharding import select_shard

    index, count = options.shard
    return {c.id for c in select_shard(cases, index, count)}


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
