"""A results file edited or damaged after its run wrote it (a record deleted, a case id
changed, a record of a case the run did not select): its report is red and says so, as the
gate refuses it (moved out of tests/test_report.py when that passed 500 lines)."""
from __future__ import annotations

from dataclasses import replace

from reports.render import write_report
from reports.summary import verdict_line
from tests.test_report_doctored import case_id, record, run


def test_a_complete_file_that_lacks_selected_records_is_damaged_not_green(tmp_path):
    """One record deleted from a complete file (or its case id edited): the gate refused it,
    while the report said 95/95 PASS, conforms (an outside audit)."""
    from reports.summary import conforms, summary_markdown
    from tests.test_gate import selected

    ids = [case_id(seq=128 * (i + 1)) for i in range(3)]
    whole = selected(run([record(cid) for cid in ids]))
    assert conforms(whole) and verdict_line(whole) == "3/3 PASS"
    edited = replace(whole.records[2], case_id=case_id(seq=4096))
    for damaged in (replace(whole, records=whole.records[:2]),
                    replace(whole, records=(*whole.records[:2], edited)),
                    replace(run([record(cid) for cid in ids[:2]]), selected_count=3)):
        assert not conforms(damaged)
        line = verdict_line(damaged)
        assert line.endswith(" · file DAMAGED: it says complete, but 1 of its 3 selected cases "
                             "has no record (an edited or damaged file)"), line
        assert "❌ does not conform" in summary_markdown(damaged)
        write_report(damaged, tmp_path)
        page = (tmp_path / "index.html").read_text()
        assert 'class="verdict bad"' in page and "file DAMAGED" in page
    # a record beside the selection's (an id a disk fault changed: 5/5 PASS of 4 selected
    # cases, an outside audit); a fuzzed example's record is named by no selection
    for stray, ok in ((case_id(seq=4096), False), ("fuzz/" + case_id(seq=4096), True)):
        more = replace(whole, records=(*whole.records, replace(edited, case_id=stray)))
        assert conforms(more) is ok
        if not ok:
            assert verdict_line(more).endswith(
                f" · file DAMAGED: it says complete, but 1 of its records is of a case it did "
                f"not select ({stray!r}) (an edited or damaged file)"), verdict_line(more)
    # a shard's case_ids are the whole run's: it is held to its own count
    shard = replace(whole, records=whole.records[:2], selected_count=2,
                    selection={**whole.selection, "shard": "1/2"})
    assert conforms(shard)
    assert not conforms(replace(shard, selected_count=3))
