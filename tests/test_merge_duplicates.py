"""flexconf merge of files that hold a case more than once (a retried part beside the first),
or a doctored shard count: which copy is kept, and what the merged file, its report and the
gate say of it (moved out of tests/test_merge.py when that passed 500 lines)."""
from __future__ import annotations

import json
from dataclasses import replace

from conformance.cli import main
from records.results import Label, load_results
from tests.test_merge import shard_run, write


def test_a_shard_merged_twice_says_so_in_the_merged_file_its_report_and_the_gate(
        tmp_path, capsys):
    """Two copies of one shard merged (a retried CI job's artifact beside the first) printed
    the duplicates, but the merged file said complete: true with no trace of them, and kept the
    first copy: its report and the gate saw a clean run where the second copy had failed."""
    first = [write(tmp_path, f"s{i}.json", shard_run(i)) for i in (1, 2, 3)]
    retry = shard_run(2)
    broken = retry.records[1].case_id
    retry = replace(retry, records=tuple(
        replace(r, label=Label.MISMATCH, message="off by 1e-2") if r.case_id == broken else r
        for r in retry.records))
    retried = write(tmp_path, "s2-retry.json", retry)
    out = tmp_path / "merged" / "results.json"
    assert main(["merge", *first, retried, "-o", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    count = len(retry.records)
    assert err[0] == (f"duplicated: {count} cases are in more than one file (the first "
                      "finished failing copy is kept, else the first finished one), 1 with "
                      "different labels:")
    assert err[1] == f"  {broken}: {first[1]} (PASS), {retried} (MISMATCH)"
    merged = load_results(out)
    assert merged.complete and merged.by_id()[broken].label is Label.MISMATCH  # seen once
    assert all(r.label is Label.PASS for r in merged.records if r.case_id != broken)
    assert [p["file"] for p in merged.options["merged_parts"]] == [*first, retried]
    assert len(merged.options["merged_duplicates"]) == count

    assert main(["report", str(out)]) == 0
    note = (f"{count} case(s) were in more than one merged file, each kept as its first "
            f"finished failing copy, else its first finished one; 1 of them with different labels, "
            f"e.g. {broken}: PASS in {first[1]}, MISMATCH in {retried}")
    page = (out.parent / "index.html").read_text()
    assert f'<p id="merge-note" class="note">Merged: {note}.</p>' in page
    summary = (out.parent / "summary.md").read_text()
    assert "Merge note: " in summary and "MISMATCH in" in summary

    clean = tmp_path / "clean.json"  # last release's run, merged from its three shards
    older = [write(tmp_path, f"old{i}.json", shard_run(i, started_at=f"2025-12-0{i}T00:00:00"))
             for i in (1, 2, 3)]
    assert main(["merge", *older, "-o", str(clean)]) == 0
    capsys.readouterr()
    assert "merged_duplicates" in load_results(clean).options
    assert not load_results(clean).options["merged_duplicates"]
    decision = tmp_path / "gate.json"
    assert main(["gate", "--baseline", str(clean), "--candidate", str(out),
                 "--json", str(decision)]) == 1  # the MISMATCH a copy saw blocks
    notes = json.loads(decision.read_text())["notes"]
    assert [(n["kind"], n["flagged"]) for n in notes if n["kind"] == "MERGE_DUPLICATES"] == [
        ("MERGE_DUPLICATES", True)]
    assert "  ! MERGE_DUPLICATES: the candidate is a merge: " in capsys.readouterr().out


def test_a_doctored_shard_count_is_refused_not_listed(tmp_path, capsys):
    """merge listed every shard of '1/99999999999' as missing (an outside trial's gate hang,
    the same arithmetic)."""
    doctored = replace(shard_run(1), options={**shard_run(1).options, "shard": "1/99999999999"})
    path = write(tmp_path, "d.json", doctored)
    assert main(["merge", path, "-o", str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "flexconf merge: error: options.shard '1/99999999999' is not I/N; is this a "
        "results.json of this suite?")


def test_a_copy_an_interruption_cut_off_never_replaces_one_that_finished(tmp_path, capsys):
    """A cut-off CRASH (the worker stopped; no finished_at) was kept over a finished PASS of
    the same case (an outside review): it says nothing of the backend."""
    from records.results import Label

    finished = shard_run(2)
    case = finished.records[0].case_id
    cut = replace(finished, complete=False, records=tuple(
        replace(r, label=Label.CRASH, message="worker gw0 stopped while running this case",
                finished_at="") if r.case_id == case else r for r in finished.records))
    failed = replace(finished, records=tuple(
        replace(r, label=Label.MISMATCH, finished_at="2026-01-01T01:00:00+00:00")
        if r.case_id == case else r for r in finished.records))
    for order, kept in (((cut, finished), Label.PASS), ((finished, cut), Label.PASS),
                        ((cut, failed), Label.MISMATCH)):
        paths = [write(tmp_path, f"s1-{kept.value}.json", shard_run(1)),
                 write(tmp_path, "a.json", order[0]), write(tmp_path, "b.json", order[1]),
                 write(tmp_path, f"s3-{kept.value}.json", shard_run(3))]
        main(["merge", *paths, "-o", str(tmp_path / "m.json")])
        capsys.readouterr()
        assert load_results(tmp_path / "m.json").by_id()[case].label is kept
