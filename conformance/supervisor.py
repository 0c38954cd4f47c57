"""The watchdog: one child process per worker, phase budgets, kill and replace.

The parent (a pytest worker) starts the child in its own session, sends it one case at a time
and follows its phase events. Each phase has a budget: compile ``--compile-timeout``; setup
and run ``--run-timeout``; the child's start-up and warm-up their own (``Budgets.of``). When a
budget runs out, the whole process group is killed (compiler subprocesses included) and the
case gets the label of the phase that ran out; a child that died is reported as a crash with
its signal. Either way the next case gets a fresh child. Budgets are enforced here, never by a signal in the child.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from conformance.protocol import (WORKER_PID_ENV, CaseRequest, DoneEvent, ErrorEvent,
                                  Observation, Outcome, Phase, PhaseEvent, ReadyEvent, Timings,
                                  decode_event, observation_of)

_EOF = object()
_TIMEOUT = object()
#: Budget of the start phase (Python and torch imports), in seconds.
START_TIMEOUT = 300.0
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Budgets:
    compile_timeout: float
    run_timeout: float

    def of(self, phase: Phase) -> tuple[float, str]:
        """The seconds allowed for ``phase`` and the option that sets them.

        The warm-up (a tiny compile when a child starts, once) gets the compile budget but at
        least START_TIMEOUT: it pays the compiler's one-time start-up, which no case's compile
        budget is meant to cover.
        """
        if phase is Phase.COMPILE:
            return self.compile_timeout, "--compile-timeout"
        if phase is Phase.WARM_UP:
            return max(self.compile_timeout, START_TIMEOUT), "--compile-timeout, at least the start-up limit"
        if phase is Phase.START:
            return START_TIMEOUT, "the start-up limit"
        return self.run_timeout, "--run-timeout"


class ChildSupervisor:
    """Runs requests in a (reused) child of ``backend_spec``; see module docstring.

    ``artifact_env`` (the backend's): the environment that makes a child keep its compile
    artefacts in a given directory. Each child gets its own directory (compilers read such
    settings once per process), and ``case_artifacts`` lists what the last request added.
    ``child_env``: more environment for each child, given its number (1, 2, ...).
    """

    def __init__(self, backend_spec: str, env: dict[str, str], workdir: Path, budgets: Budgets,
                 artifact_env: Callable[[str], dict[str, str]] | None = None,
                 child_env: Callable[[int], dict[str, str]] | None = None):
        self.backend_spec, self.env, self.budgets = backend_spec, env, budgets
        self.child_env = child_env
        self.workdir = Path(workdir)
        self.artifact_env = artifact_env
        self.proc: subprocess.Popen | None = None
        self._reader: _EventReader | None = None
        self._log_path: Path | None = None
        self._started = 0
        self._oom_kills: tuple[int, ...] = ()
        self.artifact_dir: Path | None = None  # the current (or last) child's
        self._artifacts_before: dict[Path, int] = {}
        self._request_log: tuple[Path | None, int] = (None, 0)
        #: what the current (or last) child's warm-up raised, or the torch settings its
        #: backend's import or warm-up changed (set back), as its ReadyEvent said; None: clean
        self.warm_up_problem: str | None = None

    # -- public ---------------------------------------------------------------------------
    def run(self, request: CaseRequest) -> Observation:
        """Run one case request; always returns an Observation (kills the child on failure)."""
        try:
            if self.proc is None:
                failure = self._start()
                if failure is not None:
                    return failure
            log_offset = self._log_size()
            self._oom_kills = oom_kill_counts()  # this case's window, not the child's life
            self._artifacts_before = _snapshot(self.artifact_dir)
            self._request_log = (self._log_path, log_offset)
            self.proc.stdin.write(request.encode() + "\n")
            self.proc.stdin.flush()
            return self._follow(Phase.SETUP, log_offset)
        except BrokenPipeError:
            return self._died(Phase.SETUP, self._log_size())
        except BaseException:  # Ctrl-C, pytest stopping: never leave a child behind
            self.close()
            raise

    def case_artifacts(self) -> list[Path]:
        """Files the last request's child added to (or rewrote in) its artefact directory,
        even when it was killed meanwhile; [] when the backend keeps no artefacts."""
        now = _snapshot(self.artifact_dir)
        return sorted(path for path, mtime in now.items()
                      if self._artifacts_before.get(path) != mtime)

    def case_log(self) -> str:
        """What the child printed while it ran the last request (its whole log segment)."""
        path, offset = self._request_log
        return _read_log(path, offset, errors="backslashreplace")

    def close(self) -> None:
        """Kill the child and its process group (idempotent)."""
        if self.proc is None:
            return
        _kill_group(self.proc)
        for stream in (self.proc.stdin,):
            try:
                stream.close()
            except OSError:
                pass
        if self._reader:
            self._reader.close()
        self.proc, self._reader = None, None

    # -- internals ------------------------------------------------------------------------
    def _start(self) -> Observation | None:
        self._started += 1
        self.warm_up_problem = None
        self._log_path = self.workdir / f"child-{self._started}.log"
        # a child that fails to start charges its warm-up artefacts and log to the case
        self._artifacts_before, self._request_log = {}, (self._log_path, 0)
        read_fd, write_fd = os.pipe()
        env = dict(os.environ)
        env.update(self.env)
        if self.child_env is not None:
            env.update(self.child_env(self._started))
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env[WORKER_PID_ENV] = str(os.getpid())  # the child dies with this process
        if self.artifact_env is not None:
            artifact_dir = self.workdir / f"artifacts-child-{self._started}"
            extra = self.artifact_env(str(artifact_dir))
            if extra:
                artifact_dir.mkdir(parents=True, exist_ok=True)
                env.update(extra)
                self.artifact_dir = artifact_dir
        self._oom_kills = oom_kill_counts()
        with open(self._log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "conformance.child", "--backend", self.backend_spec,
                 "--events-fd", str(write_fd)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(write_fd,), start_new_session=True, text=True)
        os.close(write_fd)
        self._reader = _EventReader(read_fd, self.proc)
        phase = Phase.START
        deadline = time.monotonic() + self.budgets.of(phase)[0]
        while True:
            event = self._reader.next(deadline)
            if event is _TIMEOUT:
                return self._timed_out(phase, 0)
            if event is _EOF:
                return self._died(phase, 0)
            if isinstance(event, PhaseEvent):
                phase = event.phase
                deadline = time.monotonic() + self.budgets.of(phase)[0]
            elif isinstance(event, ReadyEvent):
                self.warm_up_problem = event.warm_up_error
                return None

    def _follow(self, phase: Phase, log_offset: int) -> Observation:
        phase_start = time.monotonic()
        deadline = phase_start + self.budgets.of(phase)[0]
        measured: dict[str, float] = {}  # the parent's clock, per phase that ended
        while True:
            event = self._reader.next(deadline)
            if event is _TIMEOUT or event is _EOF:
                # the seconds the unfinished phase ran before the kill or the death
                measured[f"{phase.value}_seconds"] = time.monotonic() - phase_start
                end = self._timed_out if event is _TIMEOUT else self._died
                return replace(end(phase, log_offset), timings=_timings(measured))
            if isinstance(event, PhaseEvent):  # the child's own figures, in its last event,
                # replace the parent's clock; a hang or crash leaves only the parent's
                measured[f"{phase.value}_seconds"] = time.monotonic() - phase_start
                phase = event.phase
                phase_start = time.monotonic()
                deadline = phase_start + self.budgets.of(phase)[0]
            elif isinstance(event, DoneEvent | ErrorEvent):
                if isinstance(event, ErrorEvent) and event.phase is Phase.COMPILE:
                    # a compile error keeps the seconds the compiler ran before it failed
                    measured["compile_seconds"] = time.monotonic() - phase_start
                if isinstance(event, ErrorEvent) and (
                        event.outcome in (Outcome.OOM, Outcome.EXEC_TIMEOUT, Outcome.EXEC_ERROR)
                        or (
                            event.outcome in (Outcome.ERROR, Outcome.DISK_FULL)
                            and event.phase in (Phase.COMPILE, Phase.RUN))):
                    # the allocator or the device may be left broken (a CUDA fault is sticky):
                    # the next case gets a fresh child rather than inheriting the fault
                    self.close()
                return observation_of(event, _timings(measured))

    def _timed_out(self, phase: Phase, log_offset: int) -> Observation:
        seconds, option = self.budgets.of(phase)
        tail = self._log_tail(log_offset)
        stopped = _stopped(self.proc.pid) if self.proc is not None else False
        self.close()
        what = ("the backend's warm-up compile" if phase is Phase.WARM_UP
                else f"the {phase.value} phase")
        message = (f"{what} did not finish within {seconds:g} s ({option}); "
                   + ("its process was stopped (SIGSTOP, a debugger), not running; "
                      if stopped else "") + "the child and its process group were killed")
        return Observation(Outcome.TIMEOUT, phase, _with_tail(message, tail))

    def _died(self, phase: Phase, log_offset: int) -> Observation:
        proc = self.proc
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # closed its pipe but lives on: treat as hung
            return self._timed_out(phase, log_offset)
        tail = self._log_tail(log_offset)
        oom_killed = any(now > before for now, before
                         in zip(oom_kill_counts(), self._oom_kills))
        self.close()
        if code < 0:
            name = _signal_name(-code)
            if oom_killed and -code == signal.SIGKILL:
                return Observation(Outcome.OOM, phase, _with_tail(
                    f"the child was killed by the kernel's OOM killer during {phase.value}", tail))
            return Observation(Outcome.CRASH, phase, _with_tail(
                f"the child process was killed by {name} during {phase.value}", tail))
        if phase is Phase.START:
            return Observation(Outcome.HARNESS, phase, _with_tail(
                f"the child process could not start (exit status {code}); see its log", tail))
        return Observation(Outcome.CRASH, phase, _with_tail(
            f"the child process exited with status {code} during {phase.value}", tail))

    def _log_size(self) -> int:
        try:
            return self._log_path.stat().st_size
        except (OSError, AttributeError):
            return 0

    def _log_tail(self, offset: int) -> str:
        text = _read_log(self._log_path, offset, errors="replace")
        return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def _timings(measured: dict[str, float]) -> Timings:
    return Timings(**measured)


class _EventReader:
    """Protocol events (JSON lines) from a pipe, with a deadline (select) and no thread. The child's exit is
    noticed within half a second even when a process it forked keeps the pipe open."""

    def __init__(self, fd: int, proc: subprocess.Popen | None = None):
        self.fd, self.buffer, self.proc = fd, b"", proc

    def next(self, deadline: float):
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _TIMEOUT
            ready, _, _ = select.select([self.fd], [], [], min(remaining, 0.5))
            if not ready:
                if self.proc is not None and self.proc.poll() is not None:
                    return _EOF
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return _EOF
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return decode_event(line)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _read_log(path: Path | None, offset: int, errors: str) -> str:
    """The child's log from ``offset`` on, decoded; '' when there is none."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors=errors)
    except OSError:
        return ""


def _snapshot(directory: Path | None) -> dict[Path, int]:
    """Every file under ``directory`` with its modification time (ns); {} for None."""
    if directory is None or not directory.is_dir():
        return {}
    found = {}
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                found[path] = path.stat().st_mtime_ns
        except OSError:  # removed while we looked
            continue
    return found


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group, and every process below the child that left it (a
    compiler started with a session of its own, which a group kill does not reach; found
    while the child lives, so not after the child died on its own)."""
    # only while the child lives: once it is reaped its pid may be another process's
    strays = _descendants(proc.pid) if proc.poll() is None else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session and group
    except (ProcessLookupError, PermissionError):
        pass
    for pid, started in strays:
        if _start_time(pid) == started:  # still that process, not a new one with its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _descendants(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process below ``root``, from /proc (empty elsewhere)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in entries:
        fields = _stat_fields(pid)
        if fields:
            parents.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            found.append((pid, started))
        todo += parents.get(pid, [])
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command's name: state, ppid, ... (None when gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None  # field 22: starttime


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _with_tail(message: str, tail: str) -> str:
    return f"{message}\n--- child log (last lines) ---\n{tail}" if tail.strip() else message


#: Where the kernel counts its OOM killer's kills, each as an ``oom_kill N`` line: this
#: cgroup's (v2, then v1's memory controller, as a container sees its own), and the whole
#: system's (``/proc/vmstat``, kernel 4.13 and later), the only one that counted a kill of
#: the host's global OOM killer on a cgroup v1 host seen here (a child of 23.6 GB killed,
#: the container's ``memory.oom_control`` still 0).
OOM_KILL_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control",
                     "/proc/vmstat")


def oom_kill_counts() -> tuple[int, ...]:
    """Each counter of ``OOM_KILL_COUNTERS``, -1 where it cannot be read. Read before each
    case (and the child's start): a child dead of SIGKILL while one of them grew during that
    case was the OOM killer's. The system's count also grows for a kill of any other process
    of the host in that window (a sibling worker's child, say); only a SIGKILL of this child
    from elsewhere in that same case would then be misread, a chance accepted for the label
    it gets right."""
    return tuple(_oom_kill_count(path) for path in OOM_KILL_COUNTERS)


def _oom_kill_count(path: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return -1


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T or t in /proc: SIGSTOP, a debugger), so a
    budget it ran out of was not spent computing (an outside audit: a stopped child read as a
    slow compiler). False where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")
