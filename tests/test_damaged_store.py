"""What damage in a run's record store costs, and what it must not: a damaged finished line is
its case's record gone (run again by a resume), never a CRASH of a worker that went on; a
record of a case outside the run's selection is damage, never counted; a run already reported
and set aside by a later run is not rendered again as the directory's current results (an
outside audit found all three)."""
from __future__ import annotations

import json

import pytest

from records import Label, Record
from tests.test_bad_input import _error_lines
from tests.test_plugin_runs import CASES, pytest_args, run

A, B, C = "full/a", "causal/a", "alibi/a"
OPTIONS = {"backend": "t", "profile": "smoke", "seed": 0}


def _store(report, starts_and_records):
    """Worker files as workers write them: ``{worker: [(case_id, finished?)]}``."""
    from records.events import RecordWriter
    from records.store import RunManifest, write_manifest

    write_manifest(report, RunManifest("2026-12-07T10:00:00", "v", OPTIONS, [A, B, C],
                                       [A, B, C]))
    for worker, cases in starts_and_records.items():
        writer = RecordWriter(report, worker)
        writer.environment({"torch": "x"})
        for number, (case_id, finishes) in enumerate(cases):
            started = f"2026-12-07T10:0{number}:00"
            writer.started(case_id, {}, worker, started)
            if finishes:
                writer.finished(Record(case_id=case_id, label=Label.PASS, worker=worker,
                                       started_at=started, finished_at=started + "5"))
        writer.close()


def _damage_line(path, number, damage):
    lines = path.read_bytes().splitlines(keepends=True)
    lines[number] = damage(lines[number])
    path.write_bytes(b"".join(lines))


DAMAGE = {
    "a byte that is not UTF-8": lambda line: line.replace(b"PASS", b"PA\xffS"),
    "a NUL": lambda line: line[:20] + b"\x00" + line[21:],
    "torn in the middle of the file": lambda line: line[:len(line) // 2] + b"\n",
    "a label that does not exist": lambda line: line.replace(b'"PASS"', b'"GREEN"'),
    "a case id that is not UTF-8": lambda line: line.replace(b"full/a", b"full/\xff"),
    # JSON objects of no event of ours (a review: they closed no start, counted nothing)
    "an unknown event kind": lambda line: line.replace(b'"finished"', b'"finishee"'),
    "an empty object": lambda line: b"{}\n",
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_finished_line_leaves_its_case_without_a_record_not_a_crash(tmp_path, damage):
    from records.events import finished_ids, merge_records

    _store(tmp_path, {"gw0": [(A, True), (B, True)], "gw1": [(C, False)]})
    _damage_line(tmp_path / "records" / "gw0.jsonl", 2, damage)  # A's finished line
    merged = merge_records(tmp_path, [A, B, C])
    assert [r.case_id for r in merged.records] == [B, C]
    assert merged.records[1].label is Label.CRASH  # C: its worker was killed in it
    assert merged.unfinished == [C] and merged.damaged_records == (A,)
    assert merged.damaged == 1
    assert finished_ids(tmp_path) == {B}  # a resume runs A again


def test_a_case_started_again_after_its_damaged_record_and_cut_off_is_a_crash(tmp_path):
    from records.events import merge_records

    _store(tmp_path, {"gw0": [(A, True), (B, True)], "gw1": [(C, True), (A, False)]})
    _damage_line(tmp_path / "records" / "gw0.jsonl", 2, DAMAGE["a NUL"])
    merged = merge_records(tmp_path, [A, B, C])
    assert merged.unfinished == [A] and merged.damaged_records == ()
    assert [(r.case_id, r.label) for r in merged.records] == \
        [(A, Label.CRASH), (B, Label.PASS), (C, Label.PASS)]


def test_a_record_of_a_case_outside_the_selection_is_damage(tmp_path):
    from records.events import RecordWriter, merge_records

    _store(tmp_path, {"gw0": [(A, True)]})
    writer = RecordWriter(tmp_path, "gw0")
    fuzzed = "fuzz/x/b1-h1x1-s8x8-d8/fp32/fwd"  # no selection names a fuzzed example
    for case_id in ("other/b1", fuzzed):
        writer.started(case_id, {}, "gw0", "2026-12-07T10:05:00")
        writer.finished(Record(case_id=case_id, label=Label.PASS, finished_at="t"))
    writer.close()
    assert [r.case_id for r in merge_records(tmp_path, [A], [A]).records] == [A, fuzzed]
    assert merge_records(tmp_path, [A], [A]).damaged == 2  # its start and its record
    # a selection that is not known leaves every record in
    assert len(merge_records(tmp_path, [A]).records) == 3


def test_recover_names_the_run_and_the_case_whose_record_is_damaged(tmp_path, capsys):
    from conformance.cli import main
    from records.results import load_results

    report = tmp_path / "report"
    _store(report, {"gw0": [(A, True), (B, True)], "gw1": [(C, False)]})
    _damage_line(report / "records" / "gw0.jsonl", 2, DAMAGE["a byte that is not UTF-8"])
    assert main(["recover", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("recovered 1 finished of 3 selected cases of the run started "
                      f"2026-12-07T10:00:00, 1 cut off (CRASH): {report / 'index.html'}")
    assert out[1] == (f"skipped 1 damaged line(s) of {report / 'records'}/*.jsonl (no event "
                      "of this run: a hand edit or a disk fault); among them the record of 1 "
                      f"finished case ({A}): it has no record, and --resume runs it again")
    assert [(r.case_id, r.label) for r in load_results(report / "results.json").records] == \
        [(B, Label.PASS), (C, Label.CRASH)]


@pytest.mark.parametrize("complete, finished_at, how", [
    (False, "2026-12-07T10:09:00", "stopped before its end"), (False, "", "recovered"),
    (True, "2026-12-07T10:09:00", "complete")])
def test_recover_refuses_a_reported_run_that_a_later_run_set_aside(tmp_path, complete,
                                                                   finished_at, how):
    """A run's results set aside by a later run killed in its collection: recover rendered the
    earlier run, stopped by a signal, again as the directory's current results (an outside
    audit; a complete one was refused already)."""
    from records.events import merge_records
    from records.store import read_manifest, set_aside_results, write_run
    from reports.cmd_recover import run as recover

    report = tmp_path / "report"
    _store(report, {"gw0": [(A, True), (B, False)]})
    write_run(report, merge_records(report, [A, B, C]), {}, OPTIONS, "v",
              "2026-12-07T10:00:00", finished_at, complete)
    set_aside_results(report)  # the later run, killed right after
    assert read_manifest(report).started_at == "2026-12-07T10:00:00"
    with pytest.raises(ValueError) as refused:
        recover(type("Args", (), {"report_dir": str(report)}))
    message = str(refused.value)
    assert message.startswith(
        f"{report}: its records are those of the run reported in {report / 'previous'}/ "
        f"(started 2026-12-07T10:00:00, {how}; a later run stopped before its first case and "
        "set it aside); nothing to recover: "), message
    assert ("--resume" in message) is (not complete), message
    assert not (report / "results.json").exists()


def test_recover_of_a_reported_run_without_its_pages_says_how_to_write_them(tmp_path):
    from records.events import merge_records
    from records.store import write_run
    from reports.cmd_recover import run as recover

    report = tmp_path / "report"
    _store(report, {"gw0": [(A, True)]})
    write_run(report, merge_records(report, [A]), {}, OPTIONS, "v", "2026-12-07T10:00:00",
              "2026-12-07T10:09:00", True)  # killed before index.html and summary.md
    with pytest.raises(ValueError) as refused:
        recover(type("Args", (), {"report_dir": str(report)}))
    assert str(refused.value).endswith(
        "nothing to recover (recover is for a run that was killed); its index.html and "
        f"summary.md are missing: flexconf report {report / 'results.json'} -o {report} writes "
        "them"), str(refused.value)


def test_a_resume_drops_a_record_outside_its_selection_and_says_what_it_wrote(tmp_path):
    """A valid record of a case the run did not select, in its store: the resume said "3
    cases: 3 PASS" and exit 0, and wrote a file its own report called damaged."""
    from records.results import load_results
    from reports.summary import summary_markdown
    from tests.test_recover_inputs import _killed_after_the_last_case

    report = _killed_after_the_last_case(tmp_path, 2)
    foreign = CASES[2].id  # a case the run's case file does not hold
    with open(next((report / "records").glob("*.jsonl")), "a") as f:
        f.write(json.dumps({"event": "finished", "record": Record(
            case_id=foreign, label=Label.PASS, finished_at="2026-12-07T23:00:00").to_json()})
            + "\n")
    resumed = run(pytest_args(tmp_path, "cpu-eager", CASES[:2]) + ["--resume", str(report)])
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    results = load_results(report / "results.json")
    assert results.complete and [r.case_id for r in results.records] == [c.id for c in CASES[:2]]
    assert "2 cases on cpu-eager: 2 PASS" in resumed.stdout, resumed.stdout[-2000:]
    assert (f"skipped 1 damaged line(s) of {report / 'records'}/*.jsonl (no event of this run: "
            "a hand edit or a disk fault)") in resumed.stdout, resumed.stdout[-2000:]
    assert "DAMAGED" not in summary_markdown(results)
    assert not _error_lines(resumed)


def test_a_not_judged_case_whose_new_record_is_damaged_keeps_its_old_record_unnamed(tmp_path):
    """Recover said "3 finished of 3" and then that the case "has no record" (a review): it
    keeps the record a full disk kept from being judged, and a resume runs it again."""
    from records.errors import NOT_JUDGED_KEY
    from records.events import RecordWriter, finished_ids, merge_records

    _store(tmp_path, {"gw0": [(B, True)]})
    writer = RecordWriter(tmp_path, "gw1")
    writer.started(A, {}, "gw1", "2026-12-07T10:01:00")
    writer.finished(Record(case_id=A, label=Label.HARNESS_ERROR, worker="gw1",
                           metrics={NOT_JUDGED_KEY: True}, finished_at="2026-12-07T10:02:00"))
    writer.started(A, {}, "gw1", "2026-12-07T11:00:00")  # a resume runs it again
    writer.finished(Record(case_id=A, label=Label.PASS, worker="gw1",
                           finished_at="2026-12-07T11:01:00"))
    writer.close()
    _damage_line(tmp_path / "records" / "gw1.jsonl", 3, DAMAGE["a NUL"])  # the new record
    merged = merge_records(tmp_path, [A, B, C])
    assert merged.unfinished == [] and merged.damaged_records == () and merged.damaged == 1
    assert [(r.case_id, r.label) for r in merged.records] == \
        [(A, Label.HARNESS_ERROR), (B, Label.PASS)]
    assert finished_ids(tmp_path) == {B}
