"""Working directories (conformance/workdirs.py): one whose process was killed is removed by
the next owner; one in use, one without a lock, another user's, host's or tool's never is."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conformance import workdirs
from conformance.workdirs import Workdir, remove_orphaned_workdirs

REPO = Path(__file__).resolve().parent.parent
_HOLD = ("import sys\n"
         "from conformance.workdirs import Workdir\n"
         "print(Workdir().path, flush=True)\n"
         "sys.stdin.read()\n")  # holds it until its stdin closes or it is killed


def _holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A process of this user that made a working directory under tmp_path and holds it."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_processs_workdir_goes_and_one_in_use_stays(tmp_path, monkeypatch):
    killed, killed_dir = _holder(tmp_path)
    running, running_dir = _holder(tmp_path)
    (killed_dir / "compile-cache-1").mkdir()  # what a case leaves there
    killed.kill()
    killed.wait()
    # not a working directory: flexconf repro keeps its own for the user; an older suite's
    others = [tmp_path / "flexconf-repro-abc123", tmp_path / "flexconf-abc123",
              tmp_path / f"flexconf-{workdirs.host_name()}-12-notes"]
    others[0].mkdir()
    others[1].mkdir()
    others[2].write_text("a file, not a directory")
    try:
        assert killed_dir.name.startswith(f"flexconf-{workdirs.host_name()}-{killed.pid}-")
        assert remove_orphaned_workdirs(str(tmp_path)) == [killed_dir]
        assert not killed_dir.exists() and running_dir.is_dir()
        assert all(p.exists() for p in others)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        mine = Workdir()  # what an executor does first: nothing else is left to remove
        assert mine.path.parent == tmp_path and running_dir.is_dir()
        mine.remove()
        assert not mine.path.exists()
    finally:
        running.stdin.close()
        running.wait()
    assert remove_orphaned_workdirs(str(tmp_path)) == [running_dir]  # it exited, not removed
    assert not list(tmp_path.glob(".flexconf-staging-*"))  # each was renamed once locked


def test_only_a_lock_nobody_holds_on_this_host_makes_a_directory_an_orphan(tmp_path):
    """Named as a working directory but without a lock file (not of this module's making),
    or another host's (its lock may be local to that host): kept, lock free or not."""
    no_lock = tmp_path / f"flexconf-{workdirs.host_name()}-1-abc_12"
    other_host = tmp_path / "flexconf-elsewhere.example-1-def_34"
    free = tmp_path / f"flexconf-{workdirs.host_name()}-2-ghi_56"
    for path in (no_lock, other_host, free):
        path.mkdir()
    for path in (other_host, free):
        (path / workdirs._LOCK).write_text("")
    assert remove_orphaned_workdirs(str(tmp_path)) == [free]
    assert no_lock.is_dir() and other_host.is_dir()


def test_publish_as_renames_it_without_its_lock_and_a_second_publisher_loses(tmp_path):
    first, second = Workdir(str(tmp_path)), Workdir(str(tmp_path))
    (first.path / "built.so").write_text("first")
    (second.path / "built.so").write_text("second")
    target = tmp_path / "kept"
    assert first.publish_as(target) and not second.publish_as(target)
    assert (target / "built.so").read_text() == "first"
    assert not (target / workdirs._LOCK).exists() and not second.path.exists()
    assert first._lock is None and second._lock is None  # neither holds its lock any more
    assert remove_orphaned_workdirs(str(tmp_path)) == []
