"""Where the suite keeps what outlives a run, under one cache root (``XDG_CACHE_HOME``, else
``~/.cache``): the golden outputs (``--reference-cache``'s default), the compiler cache of
``--compile-cache warm``, and a backend child's warm-up builds; and the one-line errors for a
directory there that cannot be used."""
from __future__ import annotations

import os
from pathlib import Path

def _home() -> Path:
    """This user's home: HOME when it names one, else the password database's. An empty HOME
    is unset, not the root (Path.home() gave "/", and a run as root cached into /.cache: an
    outside audit)."""
    home = os.environ.get("HOME")
    if home:
        return Path(home)
    import pwd
    import tempfile

    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid with no entry (a container's --user 1234): no home to take
        return Path(tempfile.gettempdir()) / f"flexattention-conformance-home-{os.getuid()}"


_CACHE_HOME = os.environ.get("XDG_CACHE_HOME") or None  # empty is unset (the XDG spec)
DEFAULT_CACHE_ROOT = Path(_CACHE_HOME or _home() / ".cache") / "flexattention-conformance"
#: where DEFAULT_CACHE_ROOT came from, for the errors that name a directory under it
CACHE_ROOT_SOURCE = "XDG_CACHE_HOME" if _CACHE_HOME else "~/.cache, as XDG_CACHE_HOME is unset"


def check_reference_cache(directory: Path | None, given: bool = True) -> None:
    """ValueError, one line, unless ``directory`` (the parsed --reference-cache; not
    ``given``: its default, under the cache root) is a writable directory, made here when
    missing as the cache would make it. The controller checks it before a run sets anything
    aside (unchecked, every case would be a HARNESS_ERROR); option parsing does not, as it
    runs for ``pytest tests/`` too."""
    if directory is None:
        return
    from records.files import directory_problem
    from records.text import one_line

    problem = directory_problem(directory)
    if problem is None:
        return
    if not given:
        raise ValueError(_cache_root_error("the reference cache", directory, problem,
                                           "give --reference-cache DIR (none: cache no golden "
                                           "output)"))
    raise ValueError(f"--reference-cache {one_line(str(directory))}: {problem}; give a "
                     "directory this user can write, or --reference-cache none to cache no "
                     "golden output")


def warm_cache_dir(backend_name: str) -> Path:
    """The compiler cache directory of ``--compile-cache warm`` for a backend."""
    return DEFAULT_CACHE_ROOT / "compile" / backend_name


def warm_up_cache_dir(backend_name: str) -> Path:
    """Where a backend's child warm-up keeps its builds between runs, one directory per
    release of its compiler (conformance/backends/kept_builds.py); no case's compile ever
    reads it."""
    return DEFAULT_CACHE_ROOT / "warm-up" / backend_name


def check_compile_cache(options, backend_name: str) -> None:
    """ValueError, one line, unless the warm compiler cache directory a run would use is a
    writable directory (made here when missing), checked where --reference-cache is, before
    the run sets anything aside: unchecked, every case was the backend's RUNTIME_ERROR, its
    cause buried in a traceback."""
    if options.compile_cache != "warm":
        return
    from records.files import directory_problem

    directory = warm_cache_dir(backend_name)
    problem = directory_problem(directory)
    if problem is not None:
        cold = "" if options.phase == "compile" else "run with --compile-cache cold"
        raise ValueError(_cache_root_error("the warm compile cache", directory, problem, cold))


def _cache_root_error(what: str, directory: Path, problem: str, alternative: str) -> str:
    """The line for a directory under DEFAULT_CACHE_ROOT that cannot be used: it names where
    the root came from (XDG_CACHE_HOME, else ~/.cache), and how to give another."""
    from records.text import one_line

    fix = "set XDG_CACHE_HOME to a directory this user can write"
    return (f"{what} {one_line(str(directory))} (from {CACHE_ROOT_SOURCE}): {problem}; {fix}"
            + (f", or {alternative}" if alternative else ""))
