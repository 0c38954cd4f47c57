"""An option given an empty value is one line naming the option, a usage error (exit 4 for the
run's options, 2 for flexconf's), and nothing written: before, `--report-dir=` ran into
reports/latest, `--reference-cache=` cached golden outputs in the current directory,
`--expectations=` ran with none, `flexconf report -o ''` wrote into the current directory, and
`flexconf gate --json ''` exited 0 writing nothing."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance import options as opts
from conformance.cli import main
from tests.test_interrupted_runs import _stale_green_run
from tests.test_plugin_runs import REPO, clean_env, run

CID = "full/b1-h8x8-s128x128-d128/bf16/fwd"


@pytest.mark.parametrize("flag, line", [
    ("--report-dir", "--report-dir is empty; give a directory, or leave the option out"),
    ("--resume", "--resume is empty; give the report directory of the interrupted run, or "
                 "leave the option out"),
    ("--reference-cache", "--reference-cache is empty; give a directory, or none to cache no "
                          "golden output, or leave the option out"),
    ("--expectations", "--expectations is empty; give an expectations file (TOML), or leave "
                       "the option out"),
    ("--case-file", "--case-file is empty; give a case file (JSON), or leave the option out"),
])
def test_an_empty_path_option_of_a_run_is_one_line(flag, line):
    defaults = {option.flag: option.default for option in opts.OPTIONS}
    with pytest.raises(ValueError) as raised:
        opts.parse(lambda name: "" if name == flag else defaults[name], Path("/somewhere"))
    assert str(raised.value) == line


def test_an_empty_report_dir_is_a_usage_error_that_sets_nothing_aside(tmp_path):
    """Run from tmp_path: reports/latest, where `--report-dir=` ran, keeps the last run."""
    latest = tmp_path / "reports" / "latest"
    _stale_green_run(latest)
    before = {p.name: p.read_bytes() for p in latest.iterdir()}
    for flag in ("--report-dir=", "--resume=", "--reference-cache="):
        proc = run([sys.executable, "-m", "pytest", str(REPO / "conformance"), "-p",
                    "no:cacheprovider", "--backend", "cpu-eager", "--profile", "smoke",
                    "--case-id", CID, flag], cwd=tmp_path, env=clean_env(PYTHONPATH=str(REPO)))
        assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines == [f"ERROR: {flag[:-1]} is empty; give " + lines[0].split("; give ")[1]]
    assert {p.name: p.read_bytes() for p in latest.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]  # no golden .pt here


@pytest.mark.parametrize("words, line", [
    (["report", "{run}/results.json", "-o", ""],
     "flexconf report: error: -o is empty; give a directory, or leave the option out"),
    (["report", "{run}/results.json", "--baseline", ""],
     "flexconf report: error: --baseline is empty; give a run's results.json, or leave the "
     "option out"),
    (["gate", "--baseline", "{run}/results.json", "--candidate", "{run}/results.json",
      "--json", ""],
     "flexconf gate: error: --json is empty; give a file path, or leave the option out"),
    (["gate", "--baseline", "{run}/results.json", "--candidate", "{run}/results.json",
      "--markdown", ""],
     "flexconf gate: error: --markdown is empty; give a file path, or leave the option out"),
    (["gate", "--baseline", "{run}/results.json", "--candidate", "{run}/results.json",
      "--junit", ""],
     "flexconf gate: error: --junit is empty; give a file path, or leave the option out"),
    (["gate", "--baseline", "{run}/results.json", "--candidate", "{run}/results.json",
      "--expectations", ""],
     "flexconf gate: error: --expectations is empty; give an expectations file (TOML), or "
     "leave the option out"),
    (["gate", "--baseline", "{run}/results.json", "--candidate", "{run}/results.json",
      "--confirm-dir", ""],
     "flexconf gate: error: --confirm-dir is empty; give a directory, or leave the option out"),
    (["gate", "--baseline", "", "--candidate", "{run}/results.json"],
     "flexconf gate: error: --baseline is empty; give a run's results.json"),
    (["merge", "{run}/results.json", "-o", ""],
     "flexconf merge: error: -o is empty; give a file path"),
    (["merge", "", "-o", "merged.json"],
     "flexconf merge: error: the RESULTS.json argument is empty; give a run's results.json"),
    (["repro", "{run}/results.json", CID, "-o", ""],
     "flexconf repro: error: -o is empty; give a file path, or leave the option out"),
    (["repro", "{run}/results.json", CID, "--backend", ""],
     "flexconf repro: error: --backend is empty; give a backend (flexconf backends lists "
     "them), or leave the option out"),
    (["shrink", "--backend", "cpu-eager", CID, "--out", ""],
     "flexconf shrink: error: --out is empty; give a directory, or leave the option out"),
    (["shrink", "--backend", "cpu-eager", CID, "--reference-cache", ""],
     "flexconf shrink: error: --reference-cache is empty; give a directory, or none to cache "
     "no golden output, or leave the option out"),
    (["expectations", "update", "{run}/results.json", "--expectations", ""],
     "flexconf expectations update: error: --expectations is empty; give an expectations file "
     "(TOML)"),
    (["recover", ""],
     "flexconf recover: error: the REPORT_DIR argument is empty; give the report directory "
     "of the killed run"),
])
def test_an_empty_value_of_flexconf_is_one_line_and_writes_nothing(tmp_path, monkeypatch,
                                                                   capsys, words, line):
    run_dir = tmp_path / "run"
    _stale_green_run(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    monkeypatch.chdir(tmp_path)  # where an empty path wrote
    try:
        code = main([word.format(run=run_dir) for word in words])
    except SystemExit as exited:  # argparse's usage errors
        code = exited.code
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
