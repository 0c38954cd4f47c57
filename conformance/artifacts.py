"""Where a case's compile artefacts go in the report directory, and how they get there.

    <report-dir>/artifacts/<case dir>/<the compiler's own layout>   (FX graph, StableHLO, NEFF...)
    <report-dir>/artifacts/<case dir>/child.log                    (what the child printed)

``case_dir_name`` turns a case id into one directory name (ids hold ``/``); the report links
a failed case's row to the directory recorded in ``Record.artifacts``.
"""
from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

ARTIFACTS_DIRNAME = "artifacts"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=-]")


def case_dir_name(case_id: str) -> str:
    """A directory name for ``case_id``: readable, and unique (a hash of the exact id)."""
    readable = _UNSAFE.sub("_", case_id.replace("/", "__"))[:150]
    return f"{readable}-{hashlib.sha256(case_id.encode()).hexdigest()[:8]}"


def clear_artifacts(report_dir: str | Path) -> None:
    """Remove an earlier run's artefacts from ``report_dir`` (at the start of a run)."""
    shutil.rmtree(Path(report_dir) / ARTIFACTS_DIRNAME, ignore_errors=True)


def file_case_artifacts(case_id: str, files: list[Path], source_root: Path | None, log: str,
                        artifacts_root: Path) -> str:
    """Copy ``files`` (under ``source_root``, layout kept) and the child's ``log`` of the case
    into ``artifacts_root/<case dir>``; returns that directory relative to the report dir.
    A full disk's OSError is raised with the directory removed (no half-copied file stays)."""
    from records.errors import is_disk_full

    target = artifacts_root / case_dir_name(case_id)
    if target.exists():  # a rerun of the case in the same report directory replaces it
        shutil.rmtree(target, ignore_errors=True)
    try:
        target.mkdir(parents=True)
        for path in files:
            relative = path.relative_to(source_root) if source_root else Path(path.name)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copy2(path, target / relative)
            except OSError as exc:  # removed by the compiler meanwhile: keep what remains
                if is_disk_full(exc):
                    raise
        (target / "child.log").write_text(log, encoding="utf-8", errors="backslashreplace")
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return f"{ARTIFACTS_DIRNAME}/{target.name}"
