"""docs/results/release_gate.sh before the release runs it gates: one line naming the missing
results and the tox envs that make them, exit 2, and the files it writes as they were (it
printed only `cp: cannot stat 'reports/release/torch2.13.0/results.json'`)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_missing_release_runs_are_one_line_naming_the_tox_envs(tmp_path):
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    script = shutil.copy(REPO / "docs" / "results" / "release_gate.sh", results)
    (results / "gate-confirmed.txt").write_text("the last gate")
    (tmp_path / "reports" / "release" / "torch2.13.0").mkdir(parents=True)
    (tmp_path / "reports" / "release" / "torch2.13.0" / "results.json").write_text("{}")
    proc = subprocess.run(["bash", script, sys.executable, sys.executable], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "release_gate.sh: no results to gate: reports/release/torch2.14.1/results.json "
        "missing; run the release runs first: tox -e release-torch2.14 && tox -e release-gate "
        "(docs/results/README.md)"]
    assert sorted(p.name for p in results.iterdir()) == ["gate-confirmed.txt", "release_gate.sh"]
    assert (results / "gate-confirmed.txt").read_text() == "the last gate"
    shutil.rmtree(tmp_path / "reports")
    proc = subprocess.run(["bash", script, sys.executable, sys.executable], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "release_gate.sh: no results to gate: reports/release/torch2.13.0/results.json "
        "reports/release/torch2.14.1/results.json missing; run the release runs first: "
        "tox -e release-torch2.13 && tox -e release-torch2.14 && tox -e release-gate "
        "(docs/results/README.md)"]
