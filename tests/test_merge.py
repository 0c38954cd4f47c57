"""flexconf merge on hand-made shard results: joins, refusals, duplicates, missing cases,
completeness judged against the recorded selection (and the fallback for older files)."""
from __future__ import annotations

import json
from pathlib import Path
from dataclasses import replace

import pytest

from cases.catalog import matrix
from conformance.cli import main
from conformance.merge import MergeError, merge_runs
from conformance.sharding import select_shard
from records.results import Label, Record, RunResults, load_results, write_results
from records.selection import Selection

CASES = matrix("smoke")
ENV = {"backend": "cpu-eager", "torch": "2.13.0+cpu", "host": "ci-1", "device": "cpu"}


def shard_run(index: int, count: int = 3, host: str = "ci-1", matrix_name: str = "core",
              keyword: str = "", selected=None, recorded: bool = True, **changes) -> RunResults:
    """The results a machine running ``--shard index/count`` of the smoke matrix
    ``matrix_name`` would write; ``selected`` (case ids) stands for what ``-k keyword`` left,
    ``recorded=False`` for a file of a suite that did not record its selection."""
    cases = matrix("smoke", matrix_name)
    selected = [c.id for c in cases] if selected is None else list(selected)
    part = [c for c in select_shard(cases, index - 1, count) if c.id in selected]
    records = tuple(Record(case_id=c.id, label=Label.PASS, case=c.to_json(), compile_seconds=0.1,
                           run_seconds=0.01, worker="gw0") for c in part)
    selection = Selection(matrix_name, "smoke", (), None, None, keyword, "", f"{index}/{count}",
                          tuple(selected))
    run = RunResults(
        environment={**ENV, "host": host},
        options={"backend": "cpu-eager", "profile": "smoke", "seed": 0, "compile_cache": "cold",
                 "compile_timeout": 600.0, "run_timeout": 300.0, "case_file": None,
                 "matrix": matrix_name, "cases_modules": [], "shard": f"{index}/{count}"},
        records=records, suite_version="0.1.0", started_at=f"2026-01-01T00:0{index}:00+00:00",
        finished_at=f"2026-01-01T01:0{index}:00+00:00",
        selection=selection.to_json() if recorded else None)
    return replace(run, **changes)


def write(tmp_path, name: str, run: RunResults) -> str:
    path = tmp_path / name
    write_results(run, path)
    return str(path)


def test_three_shards_merge_into_the_whole_matrix_in_matrix_order():
    runs = [(f"s{i}.json", shard_run(i, host=f"ci-{i}")) for i in (3, 1, 2)]  # any order given
    merged = merge_runs(runs)
    assert merged.clean and merged.results.complete
    assert [r.case_id for r in merged.results.records] == [c.id for c in CASES]
    assert merged.results.options["merged_shards"] == ["1/3", "2/3", "3/3"]
    assert merged.results.options["shard"] is None
    assert merged.results.environment["hosts"] == ["ci-3", "ci-1", "ci-2"]  # as given
    assert merged.results.started_at.startswith("2026-01-01T00:01")
    assert merged.results.finished_at.startswith("2026-01-01T01:03")


@pytest.mark.parametrize("change, what", [
    ({"suite_version": "0.2.0"}, "suite_version is '0.2.0' there but '0.1.0' here"),
    ({"options_profile": "full"}, "profile is 'full' there but 'smoke' here"),
    ({"options_backend": "cpu-inductor"}, "backend is 'cpu-inductor' there but 'cpu-eager' here"),
    ({"environment_torch": "2.11.0+cu126"}, "torch version is '2.11.0+cu126' there"),
    ({"environment_reference_version": 17}, "reference version is 17 there but None here"),
    ({"environment_backend_code": "0123abcd"}, "plugin code (backend_code) is '0123abcd' there "
                                                "but None here"),
    ({"environment_NEURON_CC_FLAGS": "-O1"}, "NEURON_CC_FLAGS is '-O1' there but None here"),
    ({"options_shard": "2/4"}, "shard count is 4 there but 3 here"),
    ({"options_timed_runs": 5}, "timed_runs is 5 there but None here"),
    # each record's expected_failure came from its shard's --expectations
    ({"options_expectations_sha256": "ab" * 32}, "--expectations is 'a file of sha256 "
                                                 "abababababab' there but 'none' here"),
])
def test_mixed_runs_are_refused_with_one_line(tmp_path, capsys, change, what):
    (key, value), = change.items()
    other = shard_run(2)
    if key.startswith("options_"):
        other = replace(other, options={**other.options, key[len("options_"):]: value})
    elif key.startswith("environment_"):
        other = replace(other, environment={**other.environment, key[len("environment_"):]: value})
    else:
        other = replace(other, **{key: value})
    a, b = write(tmp_path, "a.json", shard_run(1)), write(tmp_path, "b.json", other)
    out = tmp_path / "merged.json"
    assert main(["merge", a, b, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flexconf merge: error: cannot merge {b} into {a}: {what}")
    assert len(err.splitlines()) == 1 and not out.exists()


def test_shards_naming_one_expectations_file_by_two_paths_merge():
    def judged(index, path):
        run = shard_run(index)
        return replace(run, options={**run.options, "expectations": path,
                                     "expectations_sha256": "cd" * 32})

    merged = merge_runs([("a", judged(1, "/ci-1/known.toml")), ("b", judged(2, "/ci-2/k.toml")),
                         ("c", judged(3, "known.toml"))])
    assert merged.clean and merged.results.options["expectations"] == "/ci-1/known.toml"


def test_an_output_that_cannot_be_written_is_one_line_naming_it_not_a_temporary_file(
        tmp_path, capsys):
    """A read-only directory gave "[Errno 30] Read-only file system: '.../m.json.tmp'" (an
    audit): the temporary file's name, and no fix. Checked before any file is read, as the
    gate checks its outputs."""
    a = write(tmp_path, "a.json", shard_run(1))
    afile = tmp_path / "afile"
    afile.write_text("")
    for output, problem in ((afile / "m.json", f"its directory {afile}: it is a file, not a "
                                               "directory"),
                            (tmp_path, "it is a directory, not a file")):
        assert main(["merge", a, "-o", str(output)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"flexconf merge: error: -o {output}: {problem}; give a path this user can write, "
            "e.g. -o results.json"]


def test_an_input_given_twice_or_as_the_output_and_a_whole_run_are_refused(tmp_path, capsys):
    """-o naming a shard's own file overwrote it with the merge; a whole run among the shards
    said 'shard count is None there but 3 here'."""
    a, b = write(tmp_path, "a.json", shard_run(1)), write(tmp_path, "b.json", shard_run(2))
    before = Path(a).read_bytes()
    assert main(["merge", a, b, "-o", a]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf merge: error: -o {a}: it is one of the files to merge, which the merge would "
        "overwrite; give another path, e.g. -o merged/results.json"]
    assert Path(a).read_bytes() == before
    assert main(["merge", a, str(tmp_path / "." / "a.json"), "-o", str(tmp_path / "m.json")]) == 2
    assert f"is given twice (as {a}); give each shard's results.json once" in \
        capsys.readouterr().err
    whole = replace(shard_run(1), options={**shard_run(1).options, "shard": None})
    w = write(tmp_path, "whole.json", whole)
    assert main(["merge", a, w, "-o", str(tmp_path / "m.json")]) == 2
    assert (f"cannot merge {w} into {a}: {w} is a whole run, not a --shard part, and the other "
            "is shard 1/3") in capsys.readouterr().err


def test_missing_shard_and_duplicates_are_reported_and_still_written(tmp_path, capsys):
    one, two = shard_run(1), shard_run(2)
    again = replace(shard_run(1), records=shard_run(1).records[:2], options={**one.options})
    paths = [write(tmp_path, "one.json", one), write(tmp_path, "two.json", two),
             write(tmp_path, "again.json", again)]
    out = tmp_path / "merged.json"
    assert main(["merge", *paths, "-o", str(out)]) == 1
    captured = capsys.readouterr()
    merged = load_results(out)
    missing = {c.id for c in select_shard(CASES, 2, 3)}
    assert {r.case_id for r in merged.records} == {c.id for c in CASES} - missing
    assert not merged.complete
    assert "missing: shard 3/3 is in no file given" in captured.err
    assert (f"missing: {len(missing)} cases of the selection (matrix 'core', profile 'smoke') "
            "are in no file:") in captured.err
    assert "note:" not in captured.err  # the recorded selection, not a guess
    assert ("duplicated: 2 cases are in more than one file (the first finished failing copy "
            "is kept, else the first finished one):") in captured.err
    first_dup = one.records[0].case_id
    assert f"  {first_dup}: {paths[0]} (PASS), {paths[2]} (PASS)" in captured.err
    assert captured.out.startswith("merged 3 files (shards 1/3, 1/3, 2/3): 64 cases: 64 PASS -> ")


def test_the_two_shards_of_an_extended_run_merge_clean(tmp_path, capsys):
    paths = [write(tmp_path, f"s{i}.json", shard_run(i, 2, matrix_name="extended"))
             for i in (1, 2)]
    out = tmp_path / "merged.json"
    assert main(["merge", *paths, "-o", str(out)]) == 0, capsys.readouterr().err
    merged = load_results(out)
    extended = [c.id for c in matrix("smoke", "extended")]
    assert [r.case_id for r in merged.records] == extended and merged.complete
    assert merged.selection["matrix"] == "extended" and merged.selection["shard"] is None
    assert merged.selection["case_ids"] == extended
    assert capsys.readouterr().err == ""


def test_the_shards_of_a_k_run_are_complete_with_the_selected_cases(tmp_path, capsys):
    selected = [c.id for c in CASES if c.id.startswith("causal/")]
    paths = [write(tmp_path, f"s{i}.json", shard_run(i, 3, keyword="causal", selected=selected))
             for i in (1, 2, 3)]
    out = tmp_path / "merged.json"
    assert main(["merge", *paths, "-o", str(out)]) == 0, capsys.readouterr().err
    merged = load_results(out)
    assert [r.case_id for r in merged.records] == selected and merged.complete
    assert merged.selection["keyword"] == "causal"


def test_a_missing_case_of_a_k_run_is_missing(tmp_path, capsys):
    selected = [c.id for c in CASES if c.id.startswith("causal/")]
    whole = shard_run(1, 2, keyword="causal", selected=selected)
    one = replace(whole, records=whole.records[1:])
    paths = [write(tmp_path, "a.json", one),
             write(tmp_path, "b.json", shard_run(2, 2, keyword="causal", selected=selected))]
    assert main(["merge", *paths, "-o", str(tmp_path / "m.json")]) == 1
    err = capsys.readouterr().err
    assert ("missing: 1 cases of the selection (matrix 'core', profile 'smoke', -k 'causal') "
            "are in no file:") in err
    assert f"  {whole.records[0].case_id}\n" in err
    assert not load_results(tmp_path / "m.json").complete


@pytest.mark.parametrize("other, what", [
    (dict(matrix_name="extended"), "matrix is 'extended' there but 'core' here"),
    (dict(keyword="causal"), "-k expression is 'causal' there but '' here"),
    (dict(selected=[c.id for c in CASES[:5]]), "the selected cases differ (96 in {a}, 5 in {b}; "
                                                "'" + CASES[5].id + "' only in {a})"),
    (dict(recorded=False), "the selection is not recorded there but recorded here"),
])
def test_shards_of_different_selections_are_refused(tmp_path, capsys, other, what):
    a = write(tmp_path, "a.json", shard_run(1, 2))
    b = write(tmp_path, "b.json", shard_run(2, 2, **other))
    out = tmp_path / "merged.json"
    assert main(["merge", a, b, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    what = what.format(a=a, b=b)
    assert err.startswith(f"flexconf merge: error: cannot merge {b} into {a}: {what}"), err
    assert len(err.splitlines()) == 1 and not out.exists()


def test_a_core_shard_does_not_merge_with_an_extended_one_without_a_selection(tmp_path, capsys):
    a = write(tmp_path, "a.json", shard_run(1, 2, recorded=False))
    b = write(tmp_path, "b.json", shard_run(2, 2, matrix_name="extended", recorded=False))
    assert main(["merge", a, b, "-o", str(tmp_path / "m.json")]) == 2
    assert "matrix is 'extended' there but 'core' here" in capsys.readouterr().err


def test_older_files_fall_back_to_the_matrix_of_their_options_and_say_so(tmp_path, capsys):
    paths = [write(tmp_path, f"s{i}.json", shard_run(i, 2, matrix_name="extended",
                                                     recorded=False)) for i in (1, 2)]
    out = tmp_path / "merged.json"
    assert main(["merge", *paths, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err == (f"note: {paths[0]} records no selection (written before results files did): "
                   "expecting the whole matrix 'extended' of profile 'smoke'\n")
    assert len(load_results(out).records) == len(matrix("smoke", "extended"))
    assert load_results(out).selection is None


def test_unreadable_input_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "something else"}))
    assert main(["merge", str(bad), "-o", str(tmp_path / "m.json")]) == 2
    assert "not a valid results file" in capsys.readouterr().err


def test_nothing_to_merge_is_refused():
    with pytest.raises(MergeError, match="nothing to merge"):
        merge_runs([])


def test_hosts_and_devices_may_differ_and_are_listed():
    other = replace(shard_run(2, host="ci-2"),
                    environment={**shard_run(2).environment, "host": "ci-2", "device_name": "B"})
    merged = merge_runs([("a", replace(shard_run(1), environment={**ENV, "device_name": "A"})),
                         ("b", other), ("c", shard_run(3))])
    assert merged.clean
    assert merged.results.environment["differs_between_shards"] == {"device_name": ["A", "B", None]}


def test_a_merge_given_again_with_its_missing_shard_says_to_merge_the_shards(tmp_path, capsys):
    """The gate's hint (merge the missing shard in) led to merging the merged file with the
    last shard, refused as 'a whole run'."""
    parts = [write(tmp_path, f"s{i}.json", shard_run(i)) for i in (1, 2)]
    partial = tmp_path / "m.json"
    assert main(["merge", *parts, "-o", str(partial)]) == 1  # shard 3/3 missing
    last = write(tmp_path, "s3.json", shard_run(3))
    capsys.readouterr()
    assert main(["merge", str(partial), last, "-o", str(tmp_path / "m2.json")]) == 2
    assert (f"{partial} is already a merge of shards 1/3, 2/3: merge the shards' own "
            "results.json files, all in one command, and the other is shard 3/3"
            ) in capsys.readouterr().err


def test_the_expectations_digest_is_read_once_at_the_start(tmp_path):
    """It was read again when the run ended: an edited file gave the digest of a content that
    had not judged the run, and a deleted one lost the run's results.json."""
    import hashlib
    from types import SimpleNamespace

    from conformance.run_lifecycle import RunLifecycle

    known = tmp_path / "known.toml"
    known.write_text("# no known failures\n")
    lifecycle = RunLifecycle()
    lifecycle.options = SimpleNamespace(expectations=str(known))
    digest = lifecycle._expectations_sha256()
    assert digest == hashlib.sha256(known.read_bytes()).hexdigest()
    known.unlink()
    assert lifecycle._expectations_sha256() == digest


def test_a_part_of_a_run_that_did_not_finish_makes_the_merge_exit_1_naming_it(tmp_path, capsys):
    """Merged with every case present, an interrupted part (complete: false) exited 0 with no
    word, and the gate then refused the merge without naming the part."""
    parts = [write(tmp_path, f"s{i}.json", shard_run(i)) for i in (1, 2)]
    cut = tmp_path / "copied" / "shard-3.json"  # a copy, away from where the part ran
    third = shard_run(3)
    write_results(replace(third, complete=False, options={
        **third.options, "report_dir": "/runs/part3", "matrix_path": "conformance/"}), cut)
    out = tmp_path / "merged" / "results.json"
    assert main(["merge", *parts, str(cut), "-o", str(out)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"incomplete: {cut} holds the results of a run that did not finish "
                           "(complete: false); finish it (pytest conformance/ --backend ")
    assert line.endswith(" --shard 3/3 --resume /runs/part3), then merge again")
    merged = load_results(out)
    assert not merged.complete and len(merged.records) == merged.selected_count == len(CASES)
    # the gate names the part and where it finishes (it said "one of whose shards")
    baseline = write(tmp_path, "base.json", replace(merged, complete=True))
    assert main(["gate", "--baseline", baseline, "--candidate", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf gate: error: {out}: a merge of a part whose run did not finish "
        f"({len(CASES)} of {len(CASES)} selected cases have a record; complete=false): {cut} "
        "(shard 3/3), --resume /runs/part3; finish it with --resume, merge again and gate that"]


def test_an_output_that_is_a_runs_own_results_or_ends_in_a_slash_is_refused(tmp_path, capsys):
    """-o DIR/results.json of another run's report directory overwrote its results, leaving
    its index.html beside the merge; -o DIR/ wrote a file named DIR."""
    parts = [write(tmp_path, f"s{i}.json", shard_run(i)) for i in (1, 2, 3)]
    other = tmp_path / "other"
    (other / "records").mkdir(parents=True)
    (other / "records" / "run.json").write_text("{}")
    write_results(replace(shard_run(1), options={**shard_run(1).options, "shard": None}),
                  other / "results.json")
    before = (other / "results.json").read_bytes()
    assert main(["merge", *parts, "-o", str(other / "results.json")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf merge: error: -o {other / 'results.json'}: it lies in the report directory "
        f"of a run ({other}), where it would pass for that run's results; give the merge a "
        "path of its own, e.g. -o merged/results.json"]
    (other / "records" / "run.json").unlink()  # a run's results.json, wherever it lies
    assert main(["merge", *parts, "-o", str(other / "results.json")]) == 2
    assert "it is the results.json of a run, not of a merge" in capsys.readouterr().err
    assert (other / "results.json").read_bytes() == before
    again = tmp_path / "m" / "results.json"
    assert main(["merge", *parts, "-o", str(again)]) == 0
    assert main(["merge", *parts, "-o", str(again)]) == 0  # an earlier merge's: replaced
    notes = tmp_path / "notes.txt"  # not results at all: kept (it overwrote /etc/passwd)
    notes.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main(["merge", *parts, "-o", str(notes)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf merge: error: -o {notes}: it exists and is not a results file the merge "
        "wrote, which it would overwrite; give the merge a path of its own, e.g. -o "
        "merged/results.json"]
    assert notes.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    notes.write_text('{"schema": "flexattention-conformance/results", "records": 7}')
    assert main(["merge", *parts, "-o", str(notes)]) == 2  # a results file it cannot read
    assert "it is a results file this suite cannot read, which the merge would overwrite" \
        in capsys.readouterr().err
    (tmp_path / "empty.json").write_text("")  # mktemp's: written
    assert main(["merge", *parts, "-o", str(tmp_path / "empty.json")]) == 0
    whole = write(tmp_path, "w.json", replace(shard_run(1), options={**shard_run(1).options,
                                                                    "shard": None}))
    assert main(["merge", whole, "-o", str(tmp_path / "mw.json")]) in (0, 1)
    assert main(["merge", whole, "-o", str(tmp_path / "mw.json")]) in (0, 1)  # unsharded too
    killed = tmp_path / "killed"  # a killed run's directory: no results.json yet
    (killed / "records").mkdir(parents=True)
    (killed / "records" / "run.json").write_text("{}")
    assert main(["merge", *parts, "-o", str(killed / "results.json")]) == 2
    assert not (killed / "results.json").exists()
    assert main(["merge", *parts, str(tmp_path / "missing.json"),
                 "-o", str(tmp_path / "new" / "deep" / "results.json")]) == 2  # nothing made
    assert not (tmp_path / "new").exists()
    capsys.readouterr()
    assert main(["merge", *parts, "-o", str(tmp_path / "mdir") + "/"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf merge: error: -o {tmp_path / 'mdir'}/: it ends in a slash, so it names a "
        "directory, not a file; give a path this user can write, e.g. -o results.json"]
    assert not (tmp_path / "mdir").exists()
    whole = write(tmp_path, "whole.json", replace(shard_run(1), options={
        **shard_run(1).options, "shard": None}, selection=None))
    assert main(["gate", "--baseline", whole, "--candidate", whole, "--json",
                 str(tmp_path / "gdir") + "/"]) == 2
    assert "--json " + str(tmp_path / "gdir") + "/: it ends in a slash" in capsys.readouterr().err
    case = shard_run(1).records[0].case_id
    assert main(["repro", parts[0], case, "-o", str(tmp_path / "rdir") + "/"]) == 2
    assert "-o " + str(tmp_path / "rdir") + "/: it ends in a slash" in capsys.readouterr().err
    assert not (tmp_path / "gdir").exists() and not (tmp_path / "rdir").exists()


def test_a_missing_part_whose_directory_holds_a_killed_run_says_recover_or_resume(tmp_path,
                                                                                  capsys):
    killed = tmp_path / "k2"
    (killed / "records").mkdir(parents=True)
    (killed / "records" / "run.json").write_text("{}")
    part = write(tmp_path, "s1.json", shard_run(1))
    assert main(["merge", part, str(killed / "results.json"), "-o", str(tmp_path / "m.json")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf merge: error: {killed / 'results.json'}: no such file; {killed} holds the "
        "records of a run that wrote no results.json (killed, or still going on): keep what "
        f"finished with flexconf recover {killed}, or finish it with --resume {killed} and its "
        "options"]
    assert main(["recover", str(tmp_path / "s1.json")]) == 2
    assert capsys.readouterr().err.rstrip().endswith(
        f"{tmp_path / 's1.json'}: a file, not a report directory; pass the --report-dir of the "
        "run")
    assert main(["recover", str(killed / "results.json")]) == 2  # missing, in a run's directory
    assert capsys.readouterr().err.rstrip().endswith(
        f"{killed / 'results.json'}: not a report directory; its directory holds a run's "
        f"records: flexconf recover {killed}")


def test_recover_refuses_to_overwrite_another_runs_results_in_the_directory(tmp_path, capsys):
    """A merge written into a killed run's directory was overwritten by flexconf recover
    without a word."""
    from records.store import RunManifest, write_manifest
    from records.events import RecordWriter

    killed = tmp_path / "k2"
    write_manifest(killed, RunManifest("2026-01-01T09:00:00+00:00", "0.1.0",
                                       dict(shard_run(2).options), [c.id for c in CASES]))
    writer = RecordWriter(killed, "gw0")
    writer.environment(dict(ENV))
    writer.close()
    merge = shard_run(1)  # another run's results, there
    write_results(merge, killed / "results.json")
    before = (killed / "results.json").read_bytes()
    assert main(["recover", str(killed)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf recover: error: {killed}: its results.json reports another run (started "
        f"{merge.started_at}; the records are of the run started 2026-01-01T09:00:00+00:00), "
        "which recover would overwrite; move that results.json away, then recover"]
    assert (killed / "results.json").read_bytes() == before


def test_an_unfinished_merge_given_again_says_to_finish_and_merge_its_parts(tmp_path, capsys):
    """Its finish command was a --resume of the first part's directory without its --shard,
    which the suite then refused."""
    parts = [write(tmp_path, f"s{i}.json", shard_run(i)) for i in (1, 2)]
    first = tmp_path / "m" / "results.json"
    assert main(["merge", *parts, "-o", str(first)]) == 1
    capsys.readouterr()
    assert main(["merge", str(first), "-o", str(tmp_path / "again.json")]) == 1
    assert (f"incomplete: {first} is a merge of parts not all finished (complete: false); "
            "finish those with --resume and merge the parts again") in capsys.readouterr().err
