"""A candidate that started before its baseline is flagged (! ORDER): with --baseline and
--candidate swapped, every finding reads backwards."""
from __future__ import annotations

import json
from dataclasses import replace

from records.results import Label
from tests.test_gate import A, B, gate
from tests.test_report_doctored import record, run


def test_a_candidate_older_than_its_baseline_is_flagged_and_the_verdict_kept(tmp_path, capsys):
    older = replace(run([record(A), record(B)]), started_at="2026-12-01T19:08:42.701+00:00",
                    environment={**run([]).environment, "torch": "2.13.0+cpu"})
    newer = replace(run([record(A), record(B, Label.MISMATCH)]),
                    started_at="2026-12-01T19:13:55.831+00:00",
                    environment={**run([]).environment, "torch": "2.14.1+cpu"})
    assert gate(tmp_path, newer, older, "--json", str(tmp_path / "gate.json")) == 0
    out = capsys.readouterr().out
    assert ("  ! ORDER: the candidate started before the baseline (2026-12-01T19:08:42.701+00:00 "
            "against 2026-12-01T19:13:55.831+00:00; torch 2.13.0+cpu against 2.14.1+cpu): if "
            "--baseline and --candidate are swapped, every finding reads backwards") \
        in out.splitlines()
    notes = json.loads((tmp_path / "gate.json").read_text())["notes"]
    assert [(n["kind"], n["flagged"]) for n in notes] == [("ORDER", True)]
    # the right way round: the regression blocks and nothing is said of the order
    assert gate(tmp_path, older, newer) == 1
    assert "ORDER" not in capsys.readouterr().out


def test_runs_without_a_readable_start_are_not_ordered(tmp_path, capsys):
    timed = replace(run([record(A)]), started_at="2026-12-01T19:08:42.701+00:00")
    for other in ("", "yesterday", "2026-12-01T19:00:00"):  # none, garbage, no time zone
        assert gate(tmp_path, replace(timed, started_at=other), timed) == 0
        assert gate(tmp_path, timed, replace(timed, started_at=other)) == 0
    assert "ORDER" not in capsys.readouterr().out
