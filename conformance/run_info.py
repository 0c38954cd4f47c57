"""Facts recorded beside every run: the suite's version and git revision, and what the run
selected (results.json's ``selection`` block, read by reports/selection.py)."""
from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent


def import_paths(backend: str, cases_modules: Sequence[str]) -> dict[str, Any]:
    """The options that say where a ``module:object`` backend (``backend_pythonpath``) and the
    case modules (``cases_modules_pythonpath``) were imported from, so a printed rerun command
    puts them on PYTHONPATH again (reports.summary.rerun_backend); a module found in the
    interpreter's own site-packages needs no entry (and must get none: another environment's
    site-packages on PYTHONPATH would shadow that environment's own torch)."""
    from conformance.backends.registry import import_root, module_root
    from conformance.source_closure import site_packages

    own = site_packages()
    paths: dict[str, Any] = {}
    backend_root = import_root(backend)
    if backend_root and backend_root not in own:
        paths["backend_pythonpath"] = backend_root
    roots = [module_root(module) for module in cases_modules]
    roots = list(dict.fromkeys(r for r in roots if r and r not in own))
    if roots:
        paths["cases_modules_pythonpath"] = roots
    return paths


def rerun_backend_spec(options: dict[str, Any], default: str = "?") -> str:
    """The ``--backend`` that runs a recorded run's backend again: what the run was given (a
    plugin's entry point may be named otherwise than the backend calls itself, and a
    ``module:object`` is found only so), or for ``auto`` the backend it resolved to."""
    requested = options.get("backend_requested")
    if isinstance(requested, str) and requested and requested != "auto":
        return requested
    return str(options.get("backend") or default)


def pythonpath_env(options: dict[str, Any]) -> dict[str, str]:
    """The environment a rerun adds for ``options`` (as ``import_paths`` records them):
    PYTHONPATH naming the backend's and the case modules' directories, or nothing."""
    import os

    roots = [options.get("backend_pythonpath")] + list(
        options.get("cases_modules_pythonpath") or [])
    roots = list(dict.fromkeys(str(root) for root in roots if root))
    return {"PYTHONPATH": os.pathsep.join(roots)} if roots else {}


#: What a printed PYTHONPATH keeps of the one the person's shell has (a plugin installed with
#: ``pip --target`` onto it, say): the shell's own entries, after the run's.
KEEPS_PYTHONPATH = "${PYTHONPATH:+:$PYTHONPATH}"


def shell_command(env: dict[str, str], words: Sequence[str]) -> str:
    """``KEY=value ... word ...`` as a POSIX shell line, each value and word quoted (and kept
    to one line): every command the suite prints for a person to paste goes through here. A
    PYTHONPATH adds to the shell's own (KEEPS_PYTHONPATH) instead of replacing it."""
    import shlex

    from records.text import one_line

    return " ".join([f"{key}={shlex.quote(one_line(value))}"
                     + (KEEPS_PYTHONPATH if key == "PYTHONPATH" else "")
                     for key, value in env.items()]
                    + [shlex.quote(one_line(word)) for word in words])


def case_file_command(case_file: str | Path, backend: str, seed: int,
                      cases_modules: Sequence[str], report_dir: str | Path) -> str:
    """The command that runs the cases of ``case_file`` (a shrunk or fuzzed failure) through
    the matrix from the current directory, loading the backend and the case modules again
    from where they were found, into ``report_dir`` (never over the run it came from)."""
    env = pythonpath_env(import_paths(backend, cases_modules))
    words = ["pytest", matrix_path(), "--backend", backend]
    for module in cases_modules:
        words += ["--cases-module", module]
    words += ["--case-file", str(case_file)] + (["--seed", str(seed)] if seed else [])
    words += ["--report-dir", str(report_dir)]
    return shell_command(env, words)


def repro_command(options: dict[str, Any], results: str | Path, case_id: str) -> str:
    """``flexconf repro`` of ``case_id`` of the run whose results file is ``results``, with
    the PYTHONPATH its backend and case modules need (``options``: the run's)."""
    return shell_command(pythonpath_env(options),
                         ["flexconf", "repro", str(results), case_id, "-o", "repro.py"])


def matrix_path(cwd: str | Path | None = None) -> str:
    """The suite's ``conformance/`` directory as a pytest argument from ``cwd`` (default: the
    current directory): ``conformance/`` from the checkout's root, relative below it, absolute
    from anywhere else, so a printed command runs where it is printed."""
    import os

    here = Path(cwd or os.getcwd()).resolve()
    target = REPO_ROOT / "conformance"
    try:
        return f"{target.relative_to(here)}/"
    except ValueError:
        return f"{target}/"


@lru_cache(maxsize=1)
def suite_version() -> str:
    """The version in the pyproject.toml beside this code (a checkout, installed editable or
    not at all: an editable install's metadata keeps the version of its last install, and a
    pull that changed the matrix would have run under the old one), else the installed
    package's."""
    try:
        try:
            import tomllib
        except ImportError:  # Python 3.10: the project requires tomli there
            import tomli as tomllib

        with open(REPO_ROOT / "pyproject.toml", "rb") as f:
            data = tomllib.load(f)["project"]
        if data.get("name") == "flexattention-conformance" and isinstance(data["version"], str):
            return data["version"]
    except (OSError, KeyError, TypeError, ImportError, ValueError):
        pass
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("flexattention-conformance")
    except PackageNotFoundError:
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


def run_selection(options, keyword: str, markexpr: str,
                  case_ids: Sequence[str] | None) -> dict[str, Any]:
    """The ``selection`` block of a run of ``options`` (conformance.options.RunOptions) with
    pytest's ``-k`` and ``-m``; ``case_ids`` are the cases selected for the whole run before
    sharding (None when the run ended before they were known)."""
    from records.selection import Selection

    digest = None
    if options.case_file:
        try:
            digest = hashlib.sha256(Path(options.case_file).read_bytes()).hexdigest()
        except OSError:
            digest = None  # read when the cases were loaded; gone now: the path must do
    shard = f"{options.shard[0] + 1}/{options.shard[1]}" if options.shard else None
    return Selection(matrix=options.matrix, profile=options.profile,
                     cases_modules=tuple(options.cases_modules), case_file=options.case_file,
                     case_file_sha256=digest, keyword=keyword or "", markexpr=markexpr or "",
                     shard=shard, case_ids=None if case_ids is None else tuple(case_ids)
                     ).to_json()
