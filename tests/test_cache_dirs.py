"""A cache directory under the default cache root ($XDG_CACHE_HOME, else ~/.cache) that
cannot be used is a usage error of one line naming the directory and where it came from,
before a run sets anything aside (tests/test_bad_input.py has --reference-cache DIR's)."""
from __future__ import annotations

import os

import pytest

from tests.test_bad_input import _assert_nothing_set_aside, _error_lines
from tests.test_interrupted_runs import _stale_green_run
from tests.test_plugin_runs import CASES, REPO, clean_env, pytest_args, run


@pytest.mark.parametrize("cache", ["reference", "compile"])
def test_a_cache_under_an_unusable_xdg_cache_home_names_it_and_sets_nothing_aside(tmp_path,
                                                                                  cache):
    """XDG_CACHE_HOME a file: --compile-cache warm made the case a RUNTIME_ERROR (an
    AssertionError, NotADirectoryError buried in a traceback) after the last run was set
    aside; the default reference cache's line said --reference-cache, which was not given."""
    report = tmp_path / "report"
    _stale_green_run(report)
    afile = tmp_path / "afile"
    afile.write_text("")
    args = pytest_args(tmp_path, "cpu-eager", CASES[:1])
    if cache == "reference":
        args = args[:args.index("--reference-cache")] + args[args.index("--reference-cache") + 2:]
        what = "the reference cache"
        fix = "give --reference-cache DIR (none: cache no golden output)"
    else:
        args.extend(["--compile-cache", "warm"])
        what, fix = "the warm compile cache", "run with --compile-cache cold"
    directory = afile / "flexattention-conformance" / (
        "reference" if cache == "reference" else "compile/cpu-eager")
    proc = run(args, env=clean_env(XDG_CACHE_HOME=str(afile)))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"ERROR: {what} {directory} (from XDG_CACHE_HOME): it cannot be made (Not a directory); "
        f"set XDG_CACHE_HOME to a directory this user can write, or {fix}"]
    _assert_nothing_set_aside(report)


def test_an_empty_home_or_xdg_cache_home_is_unset_not_the_root():
    """HOME= put the cache at /.cache (as root, a write outside any home: an outside audit)."""
    import pwd
    import subprocess
    import sys

    code = "from conformance.cache_dirs import DEFAULT_CACHE_ROOT as r; print(r)"
    home = pwd.getpwuid(os.getuid()).pw_dir
    for env in ({"HOME": "", "XDG_CACHE_HOME": ""}, {"HOME": ""}):
        base = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
        out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == f"{home}/.cache/flexattention-conformance", (env, out)


def test_the_line_of_results_not_written_pastes_as_printed(tmp_path):
    import shlex

    from conformance.run_lifecycle import results_not_written

    report = tmp_path / "my run"
    line = results_not_written(report, OSError(28, "No space left on device"))
    command = line.split("then ", 1)[1].split(" (or", 1)[0]
    assert shlex.split(command) == ["flexconf", "recover", str(report)], line
