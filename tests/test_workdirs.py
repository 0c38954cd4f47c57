"""The executor's working directories (conformance/workdirs.py): one killed with its process
is removed by the next executor; one in use, another user's or another tool's never is."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
    # not the suite's, or not a process's: flexconf repro keeps its directory for the user
    others = [tmp_path / "flexconf-repro-abc123", tmp_path / "flexconf-abc123",
              tmp_path / "flexconf-12-notes.txt"]
    others[0].mkdir()
    others[1].mkdir()
    others[2].write_text("a file, not a directory")
    try:
        assert killed_dir.name.startswith(f"flexconf-{killed.pid}-")
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


def test_a_directory_made_before_its_lock_is_judged_by_its_process(tmp_path):
    """Made by mkdtemp, its lock not yet taken (or by a suite before the lock): removed only
    when no process has its number."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = tmp_path / f"flexconf-{gone.stdout.strip()}-abc_12"
    alive = tmp_path / f"flexconf-{os.getpid()}-def_34"
    dead.mkdir()
    alive.mkdir()
    assert remove_orphaned_workdirs(str(tmp_path)) == [dead]
    assert alive.is_dir()
