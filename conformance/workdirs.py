"""The executor's working directories: one per executor, in the system's temporary directory
(the child's log, each case's compile cache and output file), removed when the executor
closes. A worker killed with SIGKILL (by a user, a CI job's timeout, the OOM killer) cannot
remove its own, and a compile cache can be large (a Neuron NEFF per case). So an executor
holds a lock in its directory while it lives (released by the kernel when its process dies,
however it dies), and the next executor of this user removes the directories whose lock no
one holds."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "flexconf-"
_LOCK = ".held-by-a-running-executor"
#: flexconf-<pid>-<tempfile's random part>: the process is named so that a directory made
#: and not yet locked can be judged by it
_WORKDIR_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-[a-z0-9_]+$")


class Workdir:
    """A working directory of this process, held until ``remove``; making one first removes
    those that outlived their processes."""

    def __init__(self):
        remove_orphaned_workdirs()
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self._lock: int | None = os.open(self.path / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_orphaned_workdirs(root: str | None = None) -> list[Path]:
    """Remove the working directories under ``root`` (the temporary directory) that this
    user's executors made and that outlived them; returns them. One that an executor holds,
    another user's, and anything not named as a working directory are kept."""
    root = root or tempfile.gettempdir()
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _WORKDIR_NAME.match(entry.name)
        if match and _own_directory(entry) and _orphaned(Path(entry.path), int(match.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _own_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False) and \
            entry.stat(follow_symlinks=False).st_uid == os.getuid()
    except OSError:
        return False


def _orphaned(path: Path, pid: int) -> bool:
    """Whether no executor holds ``path``: its lock can be taken (its holder died); without a
    lock (made a moment ago and not yet locked, or by a suite before locks), whether no
    process has the number in its name."""
    try:
        fd = os.open(path / _LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        return not _alive(pid)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or a lock this file system cannot give
        return False
    finally:
        os.close(fd)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists (another user's)
        return True
    return True
