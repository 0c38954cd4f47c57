"""Every file a run or a command writes is written whole or not at all, through one writer
(records/files.write_text_atomic): a link at the output's path is replaced, never written
through; a write that fails leaves the old file as it was and no temporary file behind."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.cli import main
from records.files import write_text_atomic
from tests.test_gate import A, gate
from tests.test_report_doctored import record, run


RELEASES = Path(__file__).resolve().parents[1] / "docs" / "results"


def _leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_link_at_the_output_is_replaced_and_its_target_left_alone(tmp_path):
    target = tmp_path / "someone-elses.txt"
    target.write_text("theirs")
    target.chmod(0o600)
    link = tmp_path / "out.json"
    link.symlink_to(target)
    write_text_atomic(link, "mine\n")
    assert not link.is_symlink() and link.read_text() == "mine\n"
    assert target.read_text() == "theirs" and target.stat().st_mode & 0o777 == 0o600
    assert _leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_permissions_or_the_mode_asked_for(tmp_path):
    old = os.umask(0o027)
    try:
        plain = write_text_atomic(tmp_path / "plain.md", "x")
        script = write_text_atomic(tmp_path / "repro.py", "x", mode=0o755)
    finally:
        os.umask(old)
    assert plain.stat().st_mode & 0o777 == 0o640  # mkstemp would have made it 0o600
    assert script.stat().st_mode & 0o777 == 0o755


def test_a_write_that_fails_keeps_the_old_file_and_leaves_nothing(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "caf\u00e9", encoding="ascii")
    assert path.read_text() == "old\n" and _leftovers(tmp_path) == []


def test_the_gates_outputs_replace_links_instead_of_writing_through_them(tmp_path):
    """`gate --json/--markdown/--junit` wrote through a link the user gave, into its target
    (an outside trial); repro and merge already replaced it."""
    outputs = {flag: tmp_path / f"gate{suffix}" for flag, suffix in
               (("--json", ".json"), ("--markdown", ".md"), ("--junit", ".xml"))}
    targets = {}
    for flag, path in outputs.items():
        targets[flag] = tmp_path / f"target-of-{path.name}"
        targets[flag].write_text("untouched")
        path.symlink_to(targets[flag])
    both = run([record(A)])
    extra = [arg for flag, path in outputs.items() for arg in (flag, str(path))]
    assert gate(tmp_path, both, both, *extra) == 0
    for flag, path in outputs.items():
        assert not path.is_symlink() and "MAY SHIP" in path.read_text().upper().replace(
            "_", " "), flag
        assert targets[flag].read_text() == "untouched", flag
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
@pytest.mark.parametrize("command, flag, example", [
    (["gate", "--baseline", str(RELEASES / "cpu-inductor-smoke-torch2.13.0.json"),
      "--candidate", str(RELEASES / "cpu-inductor-smoke-torch2.14.1.json"), "--confirm", "0",
      "--json"], "--json", "gate.json"),
    (["merge", str(RELEASES / "cpu-inductor-smoke-torch2.13.0.json"), "-o"], "-o",
     "results.json"),
    (["repro", str(RELEASES / "cpu-inductor-smoke-torch2.13.0.json"),
      "full/b1-h8x8-s512x512-d128/bf16/fwd", "-o"], "-o", "repro.py"),
])
def test_an_output_directory_that_cannot_be_made_is_one_line_naming_it(capsys, command, flag,
                                                                         example):
    """/sys passes the permission check (even root may not make a directory there): the
    commands printed "[Errno 1] Operation not permitted: '/sys/x'" (an outside trial)."""
    assert main([*command, "/sys/x/out"]) == 2
    err = capsys.readouterr().err.strip()
    # as root, the directory's mkdir refused; as another user, the permission check did
    assert err.startswith(f"flexconf {command[0]}: error: {flag} /sys/x/out: its directory "
                          "/sys/x: it cannot be made (") and len(err.splitlines()) == 1, err
    assert err.endswith(f"); give a path this user can write, e.g. {flag} {example}"), err


def test_a_device_or_pipe_is_written_into_and_a_regular_file_keeps_its_mode(tmp_path):
    """The atomic writer replaced /dev/null (as root, `gate --junit /dev/null`) and a FIFO
    with regular files, and gave a private 0600 file the umask's 0644 (a review)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_text_atomic(fifo, "through\n")
        assert os.read(reader, 100) == b"through\n"
    finally:
        os.close(reader)
    assert fifo.is_fifo()
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    write_text_atomic(link, "x")
    assert link.is_symlink() and Path("/dev/null").is_char_device()
    private = tmp_path / "gate.json"
    private.write_text("{}")
    private.chmod(0o600)
    write_text_atomic(private, "{}\n")
    assert private.stat().st_mode & 0o777 == 0o600
    long_name = tmp_path / ("\u00e9" * 120 + ".json")  # 245 bytes: legal, near the limit
    assert write_text_atomic(long_name, "x").read_text() == "x"
    assert _leftovers(tmp_path) == []


def test_a_refusal_of_one_output_is_recorded_in_the_others(tmp_path):
    """An output refused before judging (here: it would overwrite the candidate) left a
    --markdown of an earlier gate saying MAY SHIP (a review)."""
    both = run([record(A)])
    markdown = tmp_path / "gate.md"
    markdown.write_text("## Release gate: \u2705 MAY SHIP (yesterday)\n")
    assert gate(tmp_path, both, both, "--markdown", str(markdown),
                "--json", str(tmp_path / "new.json")) == 2
    assert markdown.read_text().startswith("## Release gate: \u26d4 REFUSED")


def test_a_temporary_file_a_killed_writer_left_is_removed_by_the_next_write(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    # a writer killed between writing its temporary file and renaming it
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, time\n"
        "os.replace = lambda *args: time.sleep(600)\n"
        "from records.files import write_text_atomic\n"
        f"write_text_atomic({str(tmp_path / 'results.json')!r}, 'half')\n")],
        cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 120
    while not _leftovers(tmp_path):
        assert writer.poll() is None and time.monotonic() < deadline, "no temporary file"
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    [abandoned] = _leftovers(tmp_path)
    assert abandoned.startswith(f".flexconf-{writer.pid}-")
    live = tmp_path / f".flexconf-{os.getpid()}-0123456789ab.tmp"  # a writer still at work
    live.write_text("x")
    odd = tmp_path / ".flexconf-\u00b2-0123456789ab.tmp"  # no pid: '²'.isdigit() is True
    odd.write_text("x")
    long_ago = time.time() - 7200
    for name in (abandoned, live.name, odd.name):
        os.utime(tmp_path / name, (long_ago, long_ago))

    write_text_atomic(tmp_path / "summary.md", "next\n")
    assert _leftovers(tmp_path) == sorted([live.name, odd.name])
    assert not (tmp_path / "results.json").exists()


def test_a_dead_writers_temporary_file_is_kept_while_it_is_young(tmp_path):
    # on a file system shared between hosts a writer's pid means nothing here: only the age
    # of its file says it was abandoned
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    young = tmp_path / f".flexconf-{gone.stdout.strip()}-0123456789ab.tmp"
    young.write_text("x")
    write_text_atomic(tmp_path / "summary.md", "next\n")
    assert _leftovers(tmp_path) == [young.name]


def test_a_write_the_disk_refuses_names_the_file_and_leaves_no_temporary(tmp_path,
                                                                          monkeypatch):
    """flexconf recover, report -o, merge -o and gate --json on a full disk said only
    "error: [Errno 28] No space left on device", naming no file (an outside audit)."""
    import errno
    import io

    class Full(io.StringIO):
        def write(self, _text):
            raise OSError(errno.ENOSPC, "No space left on device")

    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda handle, *a, **k: (real_fdopen(handle).close(),
                                                                 Full())[1])
    target = tmp_path / "results.json"
    with pytest.raises(OSError) as raised:
        write_text_atomic(target, "{}")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert str(raised.value) == f"[Errno 28] No space left on device: '{target}'"
    assert list(tmp_path.iterdir()) == []


def test_a_gate_whose_output_the_disk_refuses_prints_no_verdict(tmp_path, capsys, monkeypatch):
    """It printed 'gate: MAY SHIP', then failed writing --markdown (an outside audit)."""
    import errno

    import records.files

    def full(path, *_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    base = run([record(A)])
    assert gate(tmp_path, base, base) == 0 and "MAY SHIP" in capsys.readouterr().out
    monkeypatch.setattr(records.files, "write_text_atomic", full)
    md = tmp_path / "gate.md"
    assert gate(tmp_path, base, base, "--markdown", str(md)) == 2
    out, err = capsys.readouterr()
    assert "MAY SHIP" not in out and f"No space left on device: '{md}'" in err
