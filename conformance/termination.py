"""How a run stops on a signal: SIGTERM and SIGHUP stop it as Ctrl-C does (the controller
passing them on to its xdist workers), an echo of the same signal is ignored, and once the
stop is under way further signals are ignored for a grace period, so the results of what
finished are always written. The pytest plugin (conformance/plugin.py) installs the handlers
when an active run configures and puts the previous ones back once its results are written.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, Iterable

#: signal number -> the handler interrupt_on_termination replaced, put back at the end.
_REPLACED_HANDLERS: dict[int, object] = {}
#: When a termination signal last stopped the run (time.monotonic()). Another within
#: ECHO_SECONDS is its echo, and is ignored: ``timeout`` and Slurm signal the process group as
#: well as the process, so the controller gets SIGTERM twice, and a second KeyboardInterrupt
#: would land in pytest's handling of the first (or in writing the results). A later one stops
#: the run again, for the first may have been lost: one raised inside a __del__ or a garbage
#: collector's callback is printed as "Exception ignored" and dropped.
_INTERRUPTED_AT: list[float] = []
ECHO_SECONDS = 5.0


def interrupt_on_termination(workers: Callable[[], Iterable[int]]) -> None:
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
        if _INTERRUPTED_AT and now - _INTERRUPTED_AT[-1] < ECHO_SECONDS:
            return  # the echo of the signal whose stop is under way
        _INTERRUPTED_AT.append(now)
        for pid in workers():
            try:
                os.kill(pid, signum)
            except OSError:  # gone already
                pass
        raise KeyboardInterrupt(f"received {signal.Signals(signum).name}")

    restore_termination_handlers()  # a run before this one in the process left them
    _INTERRUPTED_AT.clear()
    _replace_handlers((signal.SIGTERM, signal.SIGHUP), interrupt)


def _replace_handlers(numbers, handler) -> None:
    """``handler`` for each signal of ``numbers`` that is not ignored (SIG_IGN stays), the
    handler it replaces kept for restore_termination_handlers (the first one replaced, when a
    signal is replaced twice). Outside the main thread nothing is replaced."""
    for number in numbers:
        previous = signal.getsignal(number)
        if previous is signal.SIG_IGN:
            continue
        try:
            signal.signal(number, handler)
        except ValueError:  # not the main thread: leave the default
            return
        _REPLACED_HANDLERS.setdefault(number, signal.SIG_DFL if previous is None else previous)


def xdist_worker_pids(config) -> list[int]:
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


#: How long a stop under way ignores further signals; one after that stops at once (a stop
#: that hangs, a worker that never answers, is not waited for forever).
STOP_GRACE_SECONDS = 30.0


#: What ignore_signals_while_stopping says a stop signal is ignored for.
STOPPING = "the run is already stopping and writing what finished"
FINISHING = "every case finished and the run is writing its results"


def ignore_signals_while_stopping(doing: str = STOPPING) -> None:
    """Until restore_termination_handlers, Ctrl-C, SIGTERM and SIGHUP are ignored with one
    line that says so and what the run is ``doing``, for STOP_GRACE_SECONDS; one after that
    stops the run at once."""
    began, said = time.monotonic(), []

    def stopping(signum, _frame):
        name = signal.Signals(signum).name
        if time.monotonic() - began > STOP_GRACE_SECONDS:
            raise KeyboardInterrupt(f"received {name} while stopping")
        if not said:
            said.append(True)
            print(f"\nflexconf: {name} ignored: {doing} (one after {STOP_GRACE_SECONDS:.0f} s "
                  "stops it at once)", file=sys.stderr, flush=True)

    _replace_handlers((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), stopping)


class LastTestWatch:
    """The controller's count of finished tests: from the last one's report on, a stop
    signal is ignored (``ignore_signals_while_stopping(FINISHING)``) until the results are
    written. ``expect`` takes the number of tests this process runs (collected and selected;
    under xdist, one worker's collection)."""

    def __init__(self):
        self.expected: int | None = None
        self.done: set[str] = set()
        self.deferred = False

    def expect(self, count: int) -> None:
        if self.expected is None:
            self.expected = count

    def finished(self, node_id: str) -> None:
        self.done.add(node_id)
        if self.expected is not None and len(self.done) == self.expected:
            self.loop_ended()

    def loop_ended(self) -> None:
        """Every test has run (its report came, or the test loop ended without an error)."""
        if handlers_replaced() and not self.deferred:
            self.deferred = True
            ignore_signals_while_stopping(FINISHING)


def restore_termination_handlers() -> None:
    """Once the run's results are written, SIGTERM and SIGHUP (and Ctrl-C, where the run
    stopped on a signal) get back what they did before the run: nothing is left to keep, and
    pytest's own exit (its garbage collection passes, seconds with torch loaded) is no place
    for a KeyboardInterrupt and its traceback."""
    while _REPLACED_HANDLERS:
        number, previous = _REPLACED_HANDLERS.popitem()
        signal.signal(number, previous)


def handlers_replaced() -> bool:
    """Whether this process's run set the handlers (an active run, not yet restored)."""
    return bool(_REPLACED_HANDLERS)


def stopped_by_signal() -> bool:
    """Whether a SIGTERM or SIGHUP stopped the run (pytest may not have seen it as an
    interrupt when it landed before collection)."""
    return bool(_INTERRUPTED_AT)
