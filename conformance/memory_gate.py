"""Cases run concurrently only while their estimated peaks fit a memory budget.

Every pytest worker of a session shares one state file guarded by an advisory lock
(``fcntl.flock``) under the report directory. A worker reserves a case's bytes before starting
it and releases them after; a reservation is granted when it fits beside those held, or when
nothing is held (a case larger than the whole budget still runs, alone). Waiters are served
first come, first served, so a large case is not starved by a stream of small ones.
Reservations of processes that died are dropped, so a killed worker never blocks the others.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Iterator

POLL_SECONDS = 0.2


class MemoryGate:
    def __init__(self, directory: str | Path, budget_bytes: int):
        self.directory = Path(directory)
        self.budget = int(budget_bytes)
        self._lock_path = self.directory / "memory-gate.lock"
        self._state_path = self.directory / "memory-gate.json"

    @contextlib.contextmanager
    def reserve(self, nbytes: int, what: str = "") -> Iterator[float]:
        """Hold ``nbytes`` of the budget for the duration; yields the seconds waited."""
        start = time.monotonic()
        me = str(os.getpid())
        with self._state() as state:
            state["next"] = state.get("next", 0) + 1
            state["waiting"][me] = state["next"]
        try:
            while True:
                with self._state() as state:
                    if self._grantable(state, me, nbytes):
                        del state["waiting"][me]
                        state["held"][me] = {"bytes": int(nbytes), "what": what}
                        break
                time.sleep(POLL_SECONDS)
            yield time.monotonic() - start
        finally:
            with self._state() as state:
                state["waiting"].pop(me, None)
                state["held"].pop(me, None)

    def _grantable(self, state: dict, me: str, nbytes: int) -> bool:
        my_ticket = state["waiting"][me]
        if any(ticket < my_ticket for ticket in state["waiting"].values()):
            return False
        held = sum(entry["bytes"] for pid, entry in state["held"].items() if pid != me)
        return held == 0 or held + nbytes <= self.budget

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    state = json.loads(self._state_path.read_text() or "{}")
                except (FileNotFoundError, json.JSONDecodeError):
                    state = {}
                state.setdefault("waiting", {})
                state.setdefault("held", {})
                for table in (state["waiting"], state["held"]):
                    for pid in [p for p in table if not _alive(int(p))]:
                        del table[pid]
                yield state
                tmp = self._state_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state))
                tmp.replace(self._state_path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def machine_memory_bytes() -> int:
    """Physical memory of the machine (or of this cgroup, when it is limited lower)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def default_budget_bytes() -> int:
    """Most of the machine's memory: 80%, the rest for the OS, pytest and idle children."""
    return int(machine_memory_bytes() * 0.8)
