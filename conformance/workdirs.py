"""Working directories that outlive nothing: an executor's (the child's log, each case's
compile cache and output file, in the system's temporary directory) and a cpu-inductor
child's warm-up builds (conformance/backends/kept_builds.py). Each is removed by its owner;
one whose process died with SIGKILL (a user, a CI job's timeout, the OOM killer) cannot be,
and a compile cache can be large (a Neuron NEFF per case). So the owner holds a lock in it
while it lives (the kernel releases it when the process dies, however it dies), and the next
owner of this user on this host removes the directories whose lock nobody holds.

A directory carries its final name only once its lock is held (it is made under a staging
name and renamed), so one named as a working directory is never judged in the instant
before its lock, nor by a process that cannot see its owner (another PID namespace sharing
the directory). The host is in the name: on a shared file system whose locks are local to
each host, another host's directories are never judged."""
from __future__ import annotations

import fcntl
import os
import platform
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "flexconf-"
_STAGING_PREFIX = ".flexconf-staging-"
_LOCK = ".held-by-its-running-owner"
#: flexconf-<host>-<pid>-<tempfile's random part>
_NAME = re.compile(rf"{re.escape(PREFIX)}(?P<host>[A-Za-z0-9._]+)-\d+-[a-z0-9_]+", re.ASCII)


class Workdir:
    """A working directory of this process under ``root`` (the temporary directory), held
    until ``remove``; making one first removes those under ``root`` that outlived their
    processes."""

    def __init__(self, root: str | None = None):
        root = root or tempfile.gettempdir()
        remove_orphaned_workdirs(root)
        staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=root))
        self._lock: int | None = os.open(staging / _LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a file system without locks: keep the staging name, never judged
            self.path = staging
            return
        random_part = staging.name[len(_STAGING_PREFIX):]
        self.path = staging.with_name(f"{PREFIX}{host_name()}-{os.getpid()}-{random_part}")
        try:
            os.rename(staging, self.path)
        except OSError:
            self.path = staging
            self.remove()
            raise

    def publish_as(self, target: Path) -> bool:
        """Rename this directory to ``target`` (the same file system), without its lock; False
        (and the directory removed) where another process published first (``target`` exists
        and is not an empty directory, which a rename replaces)."""
        (self.path / _LOCK).unlink(missing_ok=True)
        try:
            os.rename(self.path, target)
        except OSError:
            self.remove()
            return False
        self.path = target
        self._release()
        return True

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def remove_orphaned_workdirs(root: str | None = None) -> list[Path]:
    """Remove the working directories under ``root`` (the temporary directory) that this
    user's processes on this host made and that outlived them; returns them. One whose owner
    holds it, another user's or host's, and anything not named as a working directory (a
    directory of an older suite, ``flexconf repro``'s) are kept."""
    root = root or tempfile.gettempdir()
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match and match["host"] == host_name() and _own_directory(entry) \
                and _orphaned(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def host_name() -> str:
    """This host's name as a directory name may carry it (also kept_builds')."""
    return re.sub(r"[^A-Za-z0-9.]", "_", platform.node()) or "host"


def _own_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False) and \
            entry.stat(follow_symlinks=False).st_uid == os.getuid()
    except OSError:
        return False


def _orphaned(path: Path) -> bool:
    """Whether the lock in ``path`` can be taken: its owner is gone. Without a lock file it
    is not a working directory of this module's making: kept."""
    try:
        fd = os.open(path / _LOCK, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (BlockingIOError), or a lock this file system cannot give
        return False
    finally:
        os.close(fd)
    return True
