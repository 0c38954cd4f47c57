"""Reading a file a person named on the command line: any way it cannot be read is one line
that names the file (escaped, records.text.one_line), says what is wrong and what to do.

Every command and option that takes such a file reads it here (results files, case files,
expectations, a run's manifest), so a directory, a missing file, a file without permission or
bytes that are not UTF-8 text give the same kind of message everywhere, never a traceback.
A directory a person names for writing (a report directory, the reference cache, where the
gate writes) is checked by ``directory_problem``, the same way everywhere. An option or
argument given an empty value (which a path reads as the current directory, and other code as
"not given") is refused by ``empty_value_problem``, through ``NonEmpty`` for flexconf's
arguments and in conformance/options.py for the run's options.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from records.text import one_line


class UserFileError(ValueError):
    """A named file that cannot be used: ``problem`` (which names the file), then ``fix``, on
    one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def empty_value_problem(name: str, value: Any, what: str, optional: bool = True) -> str | None:
    """The one line for ``name`` given an empty or blank ``value`` (never meant: an unset
    variable in a script): ``--report-dir is empty; give a directory, or leave the option
    out`` (``optional``: the option has a meaning when left out); None for any other value,
    and for None (not given)."""
    if value is None or str(value).strip():
        return None
    return f"{name} is empty; give {what}" + (", or leave the option out" if optional else "")


class NonEmpty(argparse.Action):
    """argparse's store (of one value or of ``nargs`` values) refusing an empty value with
    ``empty_value_problem``'s line (exit 2, flexconf's usage errors): declare an option with
    ``action=NonEmpty, what="a directory"``."""

    def __init__(self, option_strings, dest, what: str = "a path", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.what = what

    def __call__(self, parser, namespace, values, option_string=None):
        name = option_string or f"the {self.metavar or self.dest} argument"
        optional = bool(self.option_strings) and not self.required
        for value in values if isinstance(values, list) else [values]:
            problem = empty_value_problem(name, value, self.what, optional)
            if problem:
                parser.exit(2, f"{parser.prog}: error: {one_line(problem)}\n")
        setattr(namespace, self.dest, values)


def read_text(path: str | Path, fix: str) -> str:
    """The UTF-8 text of ``path``; UserFileError (``"<path>: <problem>; <fix>"``) otherwise."""
    shown = one_line(str(path))
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserFileError(f"{shown}: no such file", fix) from None
    except IsADirectoryError:
        raise UserFileError(f"{shown}: is a directory, not a file", fix) from None
    except PermissionError:
        raise UserFileError(f"{shown}: cannot be read (permission denied)", fix) from None
    except OSError as exc:
        raise UserFileError(f"{shown}: cannot be read ({one_line(exc.strerror or exc)})",
                            fix) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{shown}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                            f"{exc.start})", fix) from None


def read_json(path: str | Path, fix: str) -> Any:
    """The JSON value in ``path``; UserFileError, one line, when it is unreadable or not JSON."""
    text = read_text(path, fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserFileError(f"{one_line(str(path))}: not JSON ({exc})", fix) from None
    except RecursionError:
        raise UserFileError(f"{one_line(str(path))}: nested too deeply for JSON this suite "
                            "writes", fix) from None
    except ValueError as exc:  # an integer of more digits than int() takes
        raise UserFileError(f"{one_line(str(path))}: not JSON this suite writes "
                            f"({one_line(str(exc))[:80]})", fix) from None
    problem = shape_problem(data)
    if problem:
        raise UserFileError(f"{one_line(str(path))}: {problem}, which no file of this suite "
                            "holds", fix)
    return data


#: Deeper than any file of the suite nests (results: about 6 levels), and numbers no float holds.
MAX_JSON_DEPTH, MAX_JSON_NUMBER = 64, 10 ** 300


def shape_problem(data: Any) -> str | None:
    """What makes parsed JSON unreadable by the readers after it (which recurse and convert to
    float): nesting deeper than MAX_JSON_DEPTH, an integer beyond MAX_JSON_NUMBER."""
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            return f"it nests deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            todo += [(v, depth + 1) for v in value]
        elif isinstance(value, int) and not isinstance(value, bool) \
                and abs(value) > MAX_JSON_NUMBER:
            return f"it holds an integer of {len(str(abs(value)))} digits"
    return None


def directory_problem(directory: Path, make: bool = True) -> str | None:
    """Why ``directory`` cannot be written into (made first when missing and ``make``), as
    the words after its name in a one-line error; None when it can (or is missing and not
    to be made)."""
    if directory.exists() and not directory.is_dir():
        return "it is a file, not a directory"
    if not directory.exists():
        if not make:
            return None
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"it cannot be made ({exc.strerror or exc})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def output_directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be written into, or made by this user when it is missing, as
    the words after its name in a one-line error; None when it can. Nothing is made here: a
    command refused later (a bad input file) leaves no empty directory behind."""
    return _makeable_problem(directory)


def _makeable_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot be written into, or made by this user, without making it."""
    existing = directory
    while not existing.exists() and not existing.is_symlink() and existing.parent != existing:
        existing = existing.parent
    if existing.is_symlink() and not existing.exists():
        return f"{one_line(str(existing))} is a broken symbolic link"
    if existing == directory:
        return directory_problem(directory, make=False)
    if not existing.is_dir():
        return f"{one_line(str(existing))} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"it cannot be made ({one_line(str(existing))} is not writable)"
    return None


def output_file_problem(given: str | Path) -> str | None:
    """Why a command cannot write the file ``given`` (its missing directories made when it
    writes), as the words after its name in a one-line error; None when it can. Nothing is
    made here: a command refused later leaves no trace. Give the path as typed: one that ends
    in a slash names a directory (Path drops the slash)."""
    if isinstance(given, str) and given.endswith(("/", os.sep)):
        return "it ends in a slash, so it names a directory, not a file"
    path = Path(given)
    if path.is_dir():
        return "it is a directory, not a file"
    problem = _makeable_problem(path.parent)
    if problem:
        return f"its directory {one_line(str(path.parent))}: {problem}"
    if path.exists() and not os.access(path, os.W_OK):
        return "it is not writable"
    return None


def parent_problem(given: str | Path) -> str | None:
    """Make the missing directories above the file ``given`` and try making a file there;
    why either fails, as the words after its name in a one-line error (what
    output_file_problem passed may still be refused: /sys and /proc, even to root), or None.
    An output that exists and is no regular file (/dev/null) is written into, not beside."""
    path = Path(given)
    if path.exists() and not path.is_file():
        return None if os.access(path, os.W_OK) else "it is not writable"
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"its directory {one_line(str(parent))}: it cannot be made ({exc.strerror or exc})"
    probe = parent / f".flexconf-{secrets.token_hex(6)}.tmp"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        return (f"its directory {one_line(str(parent))}: a file cannot be made there "
                f"({exc.strerror or exc})")
    return None


def write_text_atomic(path: str | Path, text: str, encoding: str = "utf-8",
                      errors: str = "strict", mode: int | None = None) -> Path:
    """Write ``text`` to ``path`` whole or not at all, the one way every file of a run or a
    command is written (results, reports, manifests, the gate's outputs, expectations, case
    files, repro scripts): into a new file of its own beside ``path`` (O_EXCL: no link at a
    temporary name is followed, and two writers never share one), then renamed over ``path``.
    A reader, or a kill mid-write, never sees half a file, and a link at ``path`` is replaced,
    never written through. A regular file there keeps its permissions; a new one gets a new
    file's (0o666 less the umask); ``mode`` overrides both. What is not a regular file, itself
    or through a link (``/dev/null``, ``/dev/stdout``, a FIFO), is written into as it is:
    replacing it would destroy a device as root. A temporary file that could not be finished
    is removed; one a kill leaves (``.flexconf-PID-*.tmp``) is removed by the next write into
    its directory (``_remove_abandoned_temporaries``)."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a device or a pipe, maybe through a link
        with open(path, "w", encoding=encoding, errors=errors) as f:
            f.write(text)
        return path
    if mode is None and path.is_file() and not path.is_symlink():
        mode = path.stat().st_mode & 0o7777
    _remove_abandoned_temporaries(path.parent)
    while True:  # a short name of its own: any legal name of the output fits beside it
        temporary = path.with_name(f"{_TEMPORARY_PREFIX}{os.getpid()}-{secrets.token_hex(6)}.tmp")
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(handle, "w", encoding=encoding, errors=errors) as f:
            f.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            # a write's error names no file ("[Errno 28] No space left on device"): the one
            # line a command prints would not say which (an outside audit)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path


#: write_text_atomic's temporary files: the prefix, then the writer's pid, a dash and a random
#: part, then ".tmp".
_TEMPORARY_PREFIX = ".flexconf-"
#: A temporary file older than this whose writer is gone is abandoned (kill -9 mid-write). The
#: age keeps a writer on another host (a shared file system, where its pid means nothing
#: here, and whose clock may differ from the server's by minutes) safe: any write of this
#: suite ends within seconds.
_ABANDONED_AFTER_SECONDS = 3600.0


def _remove_abandoned_temporaries(directory: Path) -> None:
    """Remove write_text_atomic's temporary files in ``directory`` that a killed writer left:
    its pid runs no process here and the file is older than _ABANDONED_AFTER_SECONDS. Best
    effort: what cannot be listed or removed stays."""
    try:
        entries = [e for e in os.scandir(directory)
                   if e.name.startswith(_TEMPORARY_PREFIX) and e.name.endswith(".tmp")]
    except OSError:
        return
    now = time.time()
    for entry in entries:
        pid = entry.name[len(_TEMPORARY_PREFIX):].split("-", 1)[0]
        try:
            if (not re.fullmatch(r"[0-9]{1,10}", pid) or _process_exists(int(pid))
                    or now - entry.stat(follow_symlinks=False).st_mtime
                    < _ABANDONED_AFTER_SECONDS):
                continue
            os.unlink(entry.path)
        except OSError:
            continue


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none, or no pid at all
        return False
    except PermissionError:  # another user's
        return True
    return True


def strict_json_text(data: Any, indent: int | None = 1) -> str:
    """``data`` as JSON that every reader accepts: a float that is not finite (a verdict's
    metric over an output holding Inf) is written as the string ``"inf"``, ``"-inf"`` or
    ``"nan"``, never as Python's ``Infinity``/``NaN``, which strict JSON readers (jq, JSON.parse,
    serde) refuse; plain ASCII, whatever the strings hold."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # inf, -inf, nan
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
