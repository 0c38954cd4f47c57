"""Facts about the suite itself recorded beside every run: its version and git revision."""
from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def suite_version() -> str:
    """The installed package version, else the one in pyproject.toml of this checkout."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("flexattention-conformance")
    except PackageNotFoundError:
        pass
    try:
        import tomllib

        with open(REPO_ROOT / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"]
    except (OSError, KeyError, ImportError, ValueError):
        return "unknown"


@lru_cache(maxsize=1)
def git_revision() -> str | None:
    """``<sha>`` of this checkout, with ``-dirty`` when it has uncommitted changes; None
    outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")
