"""cpu-inductor's warm-up builds kept between runs (conformance/backends/kept_builds.py): kept
only as a warm-up that succeeded left them, never changed afterwards, never where they could
not be loaded. In-process, with files standing in for the builds (tests/test_backends_cpu.py
runs the real warm-up)."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import cache_dirs
from conformance.backends import kept_builds
from conformance.backends.kept_builds import kept_warm_up_builds

VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_dirs, "DEFAULT_CACHE_ROOT", tmp_path / "cache-root")
    monkeypatch.setenv(VARIABLE, str(tmp_path / "childs-own"))
    return tmp_path / "cache-root" / "warm-up" / "test-backend"


def _build(name: str) -> None:
    """What a warm-up's compile does: builds into the directory Inductor is pointed at."""
    (Path(os.environ[VARIABLE]) / name).write_text(name)


def test_a_successful_warm_up_publishes_its_builds_and_later_ones_start_from_them(root):
    with kept_warm_up_builds("test-backend"):
        private = os.environ[VARIABLE]
        assert private.startswith(str(root / "flexconf-"))  # its own, beside the kept ones
        _build("kernel.so")
    assert os.environ[VARIABLE].endswith("childs-own")  # set back
    kept, = root.glob("torch-*")
    assert sorted(p.name for p in kept.iterdir()) == ["kernel.so"]
    with kept_warm_up_builds("test-backend"):
        assert (Path(os.environ[VARIABLE]) / "kernel.so").read_text() == "kernel.so"  # seeded
        _build("another.so")
    assert sorted(p.name for p in kept.iterdir()) == ["kernel.so"]  # published once, kept
    assert [p.name for p in root.iterdir()] == [kept.name]  # no private directory left


def test_a_warm_up_that_fails_publishes_nothing(root):
    with pytest.raises(RuntimeError, match="g\\+\\+ was killed"):
        with kept_warm_up_builds("test-backend"):
            _build("truncated.so")
            raise RuntimeError("g++ was killed")
    assert list(root.iterdir()) == []
    assert os.environ[VARIABLE].endswith("childs-own")


def test_inductors_memory_of_the_build_directory_is_cleared_when_it_goes(root, monkeypatch):
    """Older torch includes its cpp_prefix.h by a path in the build directory in every later
    kernel (a cached path): cleared after the warm-up, whether it succeeded or not."""
    from conformance import compat

    cleared = []
    monkeypatch.setattr(compat, "clear_inductor_caches", lambda: cleared.append(1) or True)
    with kept_warm_up_builds("test-backend"):
        _build("kernel.so")
    with pytest.raises(RuntimeError):
        with kept_warm_up_builds("test-backend"):
            raise RuntimeError("failed")
    assert cleared == [1, 1]


def test_builds_are_not_kept_where_they_could_not_be_loaded_or_every_stage_would_not_run(
        root, monkeypatch, tmp_path):
    with kept_warm_up_builds("test-backend", usable=False):  # a graph cache forced on
        assert os.environ[VARIABLE].endswith("childs-own")
    real_statvfs = os.statvfs
    monkeypatch.setattr(kept_builds.os, "statvfs", lambda path: SimpleNamespace(
        f_flag=real_statvfs(path).f_flag | os.ST_NOEXEC))
    with kept_warm_up_builds("test-backend"):  # a cache root mounted noexec
        assert os.environ[VARIABLE].endswith("childs-own")
    monkeypatch.undo()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(cache_dirs, "DEFAULT_CACHE_ROOT", tmp_path / "a-file")
    monkeypatch.setenv(VARIABLE, str(tmp_path / "childs-own"))
    with kept_warm_up_builds("test-backend"):  # a cache root that cannot be written
        assert os.environ[VARIABLE].endswith("childs-own")


def test_the_kept_builds_are_per_torch_release_and_host():
    import platform

    import torch

    release = kept_builds._release()
    assert release.startswith(f"torch-{torch.__version__}-{torch.version.git_version[:12]}-")
    assert release.endswith(platform.node().replace("-", "_")) or not platform.node()
