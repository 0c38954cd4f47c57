"""cpu-inductor's child warm-up builds, kept between runs (conformance/backends/cpu.py).

A fresh warm-up spends most of its 13 s on C++ builds: Inductor's probes of the CPU's vector
instructions (a build and a Python process that loads it, per instruction set) and the tiny
kernel. Torch takes a build as done when its file exists, so a build cut off by a kill (g++
goes with its child's process group) would, if kept, break or silently change every later
child (a truncated kernel kills it with SIGBUS; a truncated probe drops an instruction set
for every case). So the builds are kept only as a warm-up that succeeded left them:

- the warm-up builds in a private directory of its own beside the kept one (a
  ``conformance.workdirs.Workdir``: removed if its process dies), seeded with a copy of the
  kept builds, if any;
- once it succeeded, and only if none are kept yet, that directory is renamed to the kept one
  (atomic, the same file system); otherwise it is removed.

Kept per torch release (version and commit) and host (a home shared between hosts), under
the suite's cache root (cache_dirs.warm_up_cache_dir). Not kept at all where that root cannot
be written or is mounted noexec (a build there could not be loaded), or where the caller says
whole compiled graphs could still be cached (then the warm-up would skip its stages)."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

_CACHE_DIR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


@contextmanager
def kept_warm_up_builds(backend_name: str, usable: bool = True):
    """Within: Inductor builds into a private directory seeded with the kept builds (see the
    module); on a normal exit they become the kept builds if there were none. Where builds
    cannot be kept (or not ``usable``), nothing changes: the child's own directory is used."""
    root = _writable_root(backend_name) if usable else None
    if root is None:
        yield
        return
    kept = root / _release()
    try:
        build = _seeded_build_directory(root, kept)
    except OSError:  # a full disk, a quota: build in the child's own directory, as before
        yield
        return
    given = os.environ.get(_CACHE_DIR_VARIABLE)
    os.environ[_CACHE_DIR_VARIABLE] = str(build.path)
    try:
        yield
    except BaseException:
        build.remove()
        raise
    finally:
        if given is None:
            os.environ.pop(_CACHE_DIR_VARIABLE, None)
        else:
            os.environ[_CACHE_DIR_VARIABLE] = given
        # paths into the build directory that Inductor keeps in memory (older torch includes
        # its cpp_prefix.h by a path there in every later kernel) must not outlive it
        from conformance.compat import clear_inductor_caches

        clear_inductor_caches()
    if kept.exists():
        build.remove()
    else:
        build.publish_as(kept)


def _seeded_build_directory(root: Path, kept: Path):
    """A new private build directory under ``root`` holding a copy of the kept builds, if
    any (a copy that failed part-way is thrown away: a file copied in part is not a build)."""
    from conformance.workdirs import Workdir

    build = Workdir(str(root))
    if kept.is_dir():
        try:
            shutil.copytree(kept, build.path, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error):
            build.remove()
            build = Workdir(str(root))
    return build


def _release() -> str:
    import torch

    from conformance.workdirs import host_name

    return (f"torch-{torch.__version__}-{(torch.version.git_version or 'unknown')[:12]}-"
            f"{host_name()}")


def _writable_root(backend_name: str) -> Path | None:
    """The backend's directory of kept builds, made if missing; None where it cannot be
    written or its file system is mounted noexec."""
    from conformance.cache_dirs import warm_up_cache_dir
    from records.files import directory_problem

    root = warm_up_cache_dir(backend_name)
    try:
        if directory_problem(root) or os.statvfs(root).f_flag & os.ST_NOEXEC:
            return None
    except OSError:  # a parent this user may not even look into
        return None
    return root
