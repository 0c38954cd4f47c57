"""Bad input to a run is one line that names the value and the fix, a non-zero exit, and no
change to what the report directory holds: the last run that ran stays where it was."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from records.store import set_aside_results
from tests.test_interrupted_runs import _stale_green_run
from tests.test_plugin_runs import CASES, pytest_args, run


def _assert_nothing_set_aside(report) -> None:
    """The earlier green run (_stale_green_run) is still where it was, and nothing moved."""
    assert (report / "index.html").read_text() == "<p>all green</p>"
    assert not (report / "previous").exists()


def _error_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_a_bad_k_expression_is_one_line_and_sets_nothing_aside(tmp_path, workers):
    """Under xdist each worker failed to collect and the controller died of an INTERNALERROR,
    after it had set the last run aside and before writing an empty results.json in its place:
    two typos in a row, and the last real run was gone from previous/ too."""
    report = tmp_path / "report"
    _stale_green_run(report)
    before = {name: (report / name).read_bytes() for name in ("results.json", "index.html")}
    for _ in range(2):
        proc = run(pytest_args(tmp_path, "cpu-eager", CASES, *workers, "-k", "causal and ("))
        assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "INTERNALERROR" not in proc.stdout + proc.stderr
        assert _error_lines(proc)[0].startswith("ERROR: Wrong expression passed to '-k': "
                                                "causal and (: at column")
    assert {name: (report / name).read_bytes() for name in before} == before
    assert not (report / "previous").exists()


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_a_selection_of_no_case_sets_nothing_aside(tmp_path, workers):
    """A -k that matches nothing used to set the last run aside at the start (and push the
    one before it out of previous/, for good) before it said "0 cases selected"."""
    report = tmp_path / "report"
    _stale_green_run(report / "previous")
    (report / "previous" / "index.html").write_text("<p>the run before</p>")
    _stale_green_run(report)
    before = {path: path.read_bytes() for path in report.rglob("*") if path.is_file()}
    selections = [("-k", "nosuchvariant"), ("-m", "nosuchmark"),
                  ("-k", "test_fuzz"),  # the fuzz test alone, with no examples to draw
                  ("--fuzz-examples", "3", "-k", "nosuchvariant")]
    if workers:  # they deselect the same way; under xdist, -k alone (CI's time)
        selections = selections[:1]
    for selection in selections:
        proc = run(pytest_args(tmp_path, "cpu-eager", CASES, *workers, *selection))
        assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "0 cases selected: nothing ran" in proc.stdout + proc.stderr
    after = {path: path.read_bytes() for path in report.rglob("*") if path.is_file()
             and path.name != ".run.lock"}  # the lock file a run leaves is no result
    assert after == before


def test_restoring_a_set_aside_puts_back_only_what_it_moved(tmp_path):
    from records.store import SUPERSEDED_DIR, forget_superseded, restore_set_aside

    report = tmp_path / "report"
    _stale_green_run(report / "previous")  # a killed run left only previous/
    moved = set_aside_results(report)
    assert moved == []
    restore_set_aside(report, moved)
    assert not (report / "results.json").exists()  # previous/ is not promoted
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"
    _stale_green_run(report)
    (report / "index.html").write_text("<p>latest</p>")
    moved = set_aside_results(report)
    assert (report / SUPERSEDED_DIR / "index.html").read_text() == "<p>all green</p>"
    restore_set_aside(report, moved)
    assert (report / "index.html").read_text() == "<p>latest</p>"
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"
    assert not (report / SUPERSEDED_DIR).exists()
    set_aside_results(report)  # a run that selects cases: the one before the last goes
    forget_superseded(report)
    assert not (report / SUPERSEDED_DIR).exists()
    assert (report / "previous" / "index.html").read_text() == "<p>latest</p>"


def test_results_of_a_run_that_recorded_nothing_do_not_push_the_last_run_out_of_previous(
        tmp_path):
    report = tmp_path / "report"
    _stale_green_run(report)
    set_aside_results(report)  # a run starts: the green run goes to previous/
    (report / "results.json").write_text(json.dumps({"records": [], "started_at": "t1"}))
    (report / "index.html").write_text("<p>nothing ran</p>")
    assert set_aside_results(report) == []  # the next run: the empty one is dropped
    assert not (report / "results.json").exists() and not (report / "index.html").exists()
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"


def test_a_report_dir_that_is_a_file_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--report-dir", str(afile)))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [f"ERROR: --report-dir {afile}: it is a file, not a "
                                  "directory; pass a directory this user can write, e.g. "
                                  "--report-dir reports/latest"]
    assert afile.read_text() == "not a directory"


def test_a_report_dir_that_cannot_be_made_is_one_line(tmp_path):
    inside_a_file = tmp_path / "afile" / "report"
    (tmp_path / "afile").write_text("")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--report-dir", str(inside_a_file)))
    assert proc.returncode == 4
    [line] = _error_lines(proc)
    assert line.startswith(f"ERROR: --report-dir {inside_a_file}: it cannot be made (")


@pytest.mark.parametrize("option", ["--case-file", "--expectations"])
@pytest.mark.parametrize("kind", ["directory", "binary"])
def test_a_named_file_that_is_a_directory_or_binary_is_one_line(tmp_path, option, kind):
    named = tmp_path / "named"
    if kind == "directory":
        named.mkdir()
        problem = "is a directory, not a file"
    else:
        named.write_bytes(b"\x1b[31m\xff\xfe binary")
        problem = "not UTF-8 text (byte 0xff at offset 5)"
    if option == "--case-file":
        args = [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                "--backend", "cpu-eager", "--case-file", str(named),
                "--report-dir", str(tmp_path / "report")]
    else:
        args = pytest_args(tmp_path, "cpu-eager", CASES[:1], "--expectations", str(named))
    proc = run(args)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    [line] = _error_lines(proc)
    prefix = "--case-file " if option == "--case-file" else ""
    assert line.startswith(f"ERROR: {prefix}{named}: {problem}; pass a ")
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_run_lock_that_cannot_be_taken_is_one_line_and_sets_nothing_aside(tmp_path):
    """A lock path this user cannot open (another user's lock file in a shared directory; a
    directory stands in for it here, as root opens any file) is a usage error, not an
    INTERNALERROR, before the last run is moved."""
    report = tmp_path / "report"
    _stale_green_run(report)
    (report / ".run.lock").mkdir()
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    [line] = _error_lines(proc)
    assert line.startswith(f"ERROR: --report-dir {report}: its run lock {report / '.run.lock'} "
                           "cannot be taken (Is a directory); make it this user's"), line
    assert (report / "index.html").read_text() == "<p>all green</p>"


def test_a_run_lock_a_full_disk_refuses_says_to_make_room(tmp_path, monkeypatch):
    """A full disk was told to make the lock file this user's (an outside audit)."""
    import errno
    from types import SimpleNamespace

    from conformance.run_lifecycle import RunLifecycle
    from records import store

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "hold_run_lock", full)
    session = SimpleNamespace(options=SimpleNamespace(report_dir=tmp_path))
    with pytest.raises(pytest.UsageError) as raised:
        RunLifecycle._hold_run_lock(session, "--report-dir", "t")
    assert str(raised.value).endswith("cannot be taken (No space left on device); make room "
                                      "there or give this run another --report-dir")


def test_report_merge_and_recover_do_not_write_into_a_directory_whose_run_goes_on(tmp_path,
                                                                                   capsys):
    """What they would write would mix with the run's files, or (recover) record its cases
    going on as CRASH; the lock is another process's in a real run, another open file of this
    one here (flock holds between open files of one process too)."""
    from conformance.cli import main
    from records.store import hold_run_lock, run_in_progress

    report = tmp_path / "report"
    _stale_green_run(report)
    (report / "records").mkdir()
    (report / "records" / "run.json").write_text("{}")
    lock = hold_run_lock(report, "pid 42 on ci-7, started t0")
    results = str(report / "results.json")
    for args, writing in ((["report", results, "-o", str(report)], "index.html and summary.md"),
                          (["merge", results, "-o", results], "the merged results.json")):
        assert main(args) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"flexconf {args[0]}: error: {report}: a run is going on there (pid 42 on ci-7, "
            f"started t0); {writing} would mix with its files: wait for it to end, or write "
            "elsewhere"]
    assert main(["recover", str(report)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf recover: error: {report}: its run is still going on (pid 42 on ci-7, started "
        "t0); recover is for a run that was killed: wait for it to end, or stop it first"]
    assert (report / "index.html").read_text() == "<p>all green</p>"
    lock.close()  # the run ends: recover may take the directory, and leaves it free after
    assert main(["recover", str(report)]) == 2  # the stand-in manifest has no cases
    assert "nothing to recover" in capsys.readouterr().err
    assert run_in_progress(report) is None


@pytest.mark.parametrize("kind", ["a file", "inside a file"])
def test_an_unusable_reference_cache_is_one_line_and_sets_nothing_aside(tmp_path, kind):
    """Every case was a HARNESS_ERROR, after the last run had been set aside."""
    report = tmp_path / "report"
    _stale_green_run(report)
    afile = tmp_path / "afile"
    afile.write_text("")
    cache, problem = ((afile, "it is a file, not a directory") if kind == "a file" else
                      (afile / "cache", "it cannot be made (Not a directory)"))
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--reference-cache", str(cache)))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"ERROR: --reference-cache {cache}: {problem}; give a directory this user can write, "
        "or --reference-cache none to cache no golden output"]
    _assert_nothing_set_aside(report)


def test_a_missing_reference_cache_is_made_as_the_cache_would_make_it(tmp_path):
    from conformance.cache_dirs import check_reference_cache

    check_reference_cache(tmp_path / "cache" / "reference")
    assert (tmp_path / "cache" / "reference").is_dir()
    check_reference_cache(None)  # --reference-cache none: nothing to check


def test_a_case_file_that_lists_no_cases_is_one_line_and_sets_nothing_aside(tmp_path):
    """It ran pytest's placeholder case NOTSET, exit 0, and set the last run aside."""
    from conformance.case_file import load_case_file

    report = tmp_path / "report"
    _stale_green_run(report)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    proc = run([sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                "--backend", "cpu-eager", "--case-file", str(empty),
                "--report-dir", str(report)])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"ERROR: --case-file {empty} lists no cases; give a file with at least one case spec "
        "(Case.to_json, docs/cases.md)"]
    _assert_nothing_set_aside(report)
    empty.write_text('{"cases": []}')
    with pytest.raises(ValueError, match="lists no cases"):
        load_case_file(str(empty))


def test_a_report_output_that_is_a_file_is_one_line(tmp_path, capsys):
    """-o naming a file failed with [Errno 20] on the run lock inside it."""
    from conformance.cli import main
    from records.results import RunResults, write_results

    results = tmp_path / "results.json"
    write_results(RunResults({"backend": "cpu-eager"}, {"backend": "cpu-eager"}, (), "0.1.0"),
                  results)
    before = results.read_bytes()
    assert main(["report", str(results), "-o", str(results)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf report: error: -o {results}: it is a file, not a directory; give a "
        "directory this user can write, e.g. -o reports/compare"]
    assert results.read_bytes() == before
    not_results = tmp_path / "notes.json"  # a bad input leaves no empty -o behind
    not_results.write_text("not json")
    assert main(["report", str(not_results), "-o", str(tmp_path / "new" / "report")]) == 2
    assert capsys.readouterr().err.startswith(f"flexconf report: error: {not_results}")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("extra, line", [
    (("--resume", "{tmp}/other"), "--resume {tmp}/other and --report-dir {tmp}/report differ: "
                                  "--resume names the report directory; drop --report-dir"),
    (("--matrix", "custom"), "--matrix custom runs only the cases of case modules, and none is "
                             "given; pass --cases-module MODULE (docs/cases.md)"),
    (("--matrix", "custom", "--cases-module", "tests.broken_mod_variants", "--fuzz-examples", "2"),
     "--matrix custom fuzzes only case modules' variants, and no case module defines "
     "fuzz_variants(shape); define one (docs/cases.md)"),
    (("--matrix", "extended"), "--matrix extended does not apply with --case-file, which runs "
                               "the file's cases alone; drop --matrix"),
])
def test_options_a_run_would_ignore_are_one_line_usage_errors(tmp_path, extra, line):
    """--report-dir was dropped without a word under --resume; --matrix custom without a case
    module was one only without --case-file (pytest_args gives both a case file and a report
    directory)."""
    extra = [word.format(tmp=tmp_path) for word in extra]
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], *extra))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == ["ERROR: " + line.format(tmp=tmp_path)]
    assert not (tmp_path / "report").exists()


def test_an_empty_shard_parts_results_survive_a_selection_of_no_case(tmp_path):
    """A merge needs an empty part's results.json; a -k typo run into its directory found
    them, deleted them (results of no case) and, selecting nothing, had nothing to put back."""
    empty = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--shard", "2/2"))
    assert empty.returncode == 5, empty.stdout[-2000:]
    report = tmp_path / "report"
    before = (report / "results.json").read_bytes()
    typo = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--shard", "2/2", "-k", "nosuch"))
    assert typo.returncode == 4, typo.stdout[-2000:]
    assert (report / "results.json").read_bytes() == before


def test_a_run_that_dies_before_its_selection_keeps_an_empty_parts_results_and_the_run_before(
        tmp_path):
    """Store-level, the paths a run stopped or killed during collection takes."""
    from records.store import RunManifest, restore_held_empty_run

    def results(where, started: str, records: int, complete: bool = True):
        where.mkdir(parents=True, exist_ok=True)
        (where / "results.json").write_text(json.dumps(
            {"started_at": started, "finished_at": "x", "complete": complete,
             "records": [{}] * records}))
        (where / "index.html").write_text(started)

    part = tmp_path / "part"  # an empty --shard part; a rerun stopped during collection
    results(part, "E", 0)
    set_aside_results(part)
    restore_held_empty_run(part)  # the interrupted run's end (keep_empty_run_results)
    assert (part / "index.html").read_text() == "E"
    set_aside_results(part)  # a rerun killed (SIGKILL) during collection ...
    set_aside_results(part)  # ... and the run after it finds the held results and holds them
    restore_held_empty_run(part)
    assert (part / "index.html").read_text() == "E"

    run_dir = tmp_path / "run"  # Z complete, A stopped (SIGTERM), B killed in collection
    results(run_dir / "previous", "Z", 3)
    results(run_dir, "A", 1, complete=False)
    set_aside_results(run_dir)  # B
    set_aside_results(run_dir, resuming=RunManifest("A", "v", {}, ["c1", "c2"]))  # --resume A
    assert (run_dir / "previous" / "index.html").read_text() == "Z"  # not A's own part
    assert not (run_dir / "results.json").exists()


def test_a_backend_object_the_module_lacks_names_the_backends_it_has():
    from conformance.backends.registry import BackendError, resolve_backend

    with pytest.raises(BackendError) as caught:
        resolve_backend("tests.fault_backends:WrongNumber")
    text = str(caught.value)
    assert text.startswith("backend 'tests.fault_backends:WrongNumber': module "
                           "'tests.fault_backends' has no 'WrongNumber'; its backends: ")
    assert "WrongNumbers" in text.split("its backends: ")[1].split(", ")


@pytest.mark.parametrize("spec, line", [
    ("/src/plug/zap_backend.py:Zap", "backend '/src/plug/zap_backend.py:Zap' names a file; name "
     "its module: --backend zap_backend:Zap with PYTHONPATH=/src/plug (docs/backends.md)"),
    ("zap_backend.py:Zap", "backend 'zap_backend.py:Zap' names a file; name its module: "
     "--backend zap_backend:Zap with PYTHONPATH=. (docs/backends.md)"),
    ("os:sep", "backend 'os:sep' is a str, not a conformance.backends.base.Backend (subclass "
     "it)"),
    ("json:JSONDecodeError", "backend 'json:JSONDecodeError': constructing 'JSONDecodeError' "
     "raised TypeError: "),
])
def test_a_backend_given_as_a_file_or_as_no_backend_is_told_what_to_give(spec, line):
    """A file path used to read "No module named '/src/plug/zap_backend'"."""
    from conformance.backends.registry import BackendError, load_backend

    with pytest.raises(BackendError) as caught:
        load_backend(spec)
    assert str(caught.value).startswith(line)


def _refused_run(tmp_path):
    """A one-case run into tmp_path/report that the suite refuses (exit 4)."""
    refused = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert refused.returncode == 4, refused.stdout[-3000:] + refused.stderr[-3000:]
    return refused


def test_a_report_dir_holding_folders_no_run_wrote_is_refused_untouched(tmp_path):
    """A run replaces records/, outputs/ and artifacts/ whole: --report-dir . in a checkout of
    the suite deleted its records/ package, and a user's own records/ folder went too."""
    report = tmp_path / "report"
    (report / "records").mkdir(parents=True)
    (report / "records" / "mydata.csv").write_text("important\n")
    refused = _refused_run(tmp_path)
    assert _error_lines(refused) == [
        f"ERROR: --report-dir {report}: it holds records/ with no records/run.json (not a "
        "run's, or an older suite's), and a run replaces records/ whole; give this run another "
        "--report-dir (e.g. reports/latest), or move it away"]
    assert (report / "records" / "mydata.csv").read_text() == "important\n"
    assert sorted(p.name for p in report.iterdir()) == ["records"]  # nothing moved or made
    (report / "records" / "mydata.csv").unlink()  # an empty one is nobody's: it is taken
    (report / "outputs").mkdir()
    (report / "index.html").write_text("<h1>my team's page</h1>")  # beside no results file
    refused = _refused_run(tmp_path)
    assert (f"ERROR: --report-dir {report}: it holds index.html with no results file of this "
            "suite beside it (a file of your own, or a report flexconf report rendered there), "
            "and a run moves it into previous/ and the run after drops it; give this run "
            "another --report-dir") in refused.stderr
    (report / "index.html").unlink()
    # in previous/: the first run left it, the second replaced it (an outside audit)
    (report / "previous").mkdir()
    (report / "previous" / "results.json").write_text('{"precious": true}')
    refused = _refused_run(tmp_path)
    assert (f"ERROR: --report-dir {report}: it holds previous/results.json with no results "
            "file of this suite beside it (a file of your own), and each run replaces "
            "previous/'s files with the last run's; give this run another --report-dir") \
        in refused.stderr
    assert (report / "previous" / "results.json").read_text() == '{"precious": true}'
    shutil.rmtree(report / "previous")
    # a link was followed (a run replaced the files of the folder it names; a review), and a
    # file was a FileExistsError traceback
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (report / "previous").symlink_to(elsewhere)
    for kind in ("link", "file"):
        refused = _refused_run(tmp_path)
        assert _error_lines(refused) == [
            f"ERROR: --report-dir {report}: its previous is a {kind}, where a run keeps the last "
            "run's results (a folder of its own); give this run another --report-dir (e.g. "
            "reports/latest), or move it away"]
        (report / "previous").unlink()
        if kind == "link":
            (report / "previous").write_text("mine\n")
    assert not any(elsewhere.iterdir())
    done = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))  # a run's own: replaced
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (report / "previous" / "index.html").exists()
    # in a run's own directory too: a file was a FileExistsError traceback, a link to another
    # disk an EXDEV traceback (an outside audit)
    shutil.rmtree(report / "previous")
    (report / "previous").write_text("mine\n")
    refused = _refused_run(tmp_path)
    assert _error_lines(refused) == [
        f"ERROR: --report-dir {report}: its previous is a file, where a run keeps the last "
        "run's results (a folder of its own); give this run another --report-dir (e.g. "
        "reports/latest), or move it away"]
    assert (report / "index.html").exists() and (report / "previous").read_text() == "mine\n"


def test_a_case_id_of_another_matrix_or_profile_names_the_one_that_has_it(tmp_path):
    """--case-id of an extended-matrix case said only "not a case of --matrix core" and sent
    the user to flexconf list, which lists the core matrix."""
    from cases.catalog import matrix
    from conformance.run_cases import matrix_of as _matrix_of

    extended = next(c.id for c in matrix("smoke", "extended")
                    if c.id not in {k.id for k in matrix("smoke", "core")})
    proc = run([sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                "--profile", "smoke", "--case-id", extended,
                "--report-dir", str(tmp_path / "report")])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"ERROR: --case-id {extended!r} is not a case of --matrix core --profile smoke; it is a "
        "case of --matrix extended --profile smoke: give those"]
    assert not (tmp_path / "report").exists()
    smoke = matrix("smoke", "core")[0].id
    assert _matrix_of(smoke, ()) == "--matrix core --profile smoke"
    assert _matrix_of(smoke + "x", ()) is None


def test_a_fuzzed_case_id_is_sent_to_repro_not_to_a_matrix(tmp_path):
    """A fuzz/... id was told to give the same --matrix and --profile, which hold no fuzzed
    case (an outside audit)."""
    fuzzed = "fuzz/composed-causal0/b1-h2x2-s64x64-d16/fp32/fwd"
    proc = run([sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                "--profile", "smoke", "--case-id", fuzzed,
                "--report-dir", str(tmp_path / "report")])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [
        f"ERROR: --case-id {fuzzed!r} is not a case of --matrix core --profile smoke; a fuzzed "
        f"case is in no matrix: rerun it with flexconf repro RESULTS_JSON {fuzzed}, or its "
        "saved spec with --case-file (docs/cases.md)"]


def test_a_report_dir_too_long_for_what_a_run_writes_below_it_is_one_line(tmp_path):
    """One of about 4,060 characters was made, then a record's path was 'File name too long':
    a traceback, and an empty records/ stayed (an outside audit)."""
    from conformance.report_dir_checks import BELOW_REPORT_DIR

    deep = tmp_path
    while len(str(deep)) < 4096 - BELOW_REPORT_DIR + 10:
        deep = deep / ("d" * 200)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1])[:-4] + [  # the deep --report-dir
        "--report-dir", str(deep), "--reference-cache", "none"])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    [line] = _error_lines(proc)
    assert line.startswith(f"ERROR: --report-dir {deep}: its path is ")
    assert line.endswith("beyond this system's 4096; pass a directory this user can write, "
                         "e.g. --report-dir reports/latest"), line
    assert not (tmp_path / ("d" * 200)).exists()  # nothing made
