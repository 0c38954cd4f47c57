"""Where `flexconf report` writes: beside the run it describes by default, never over
another run's directory or a page of the user's own (moved out of tests/test_report.py when
that passed 500 lines)."""
from __future__ import annotations

from dataclasses import replace

from conformance.cli import main
from records.results import Label, write_results
from tests.test_report_doctored import case_id, record, run


def test_a_report_into_another_runs_directory_is_refused(tmp_path, capsys):
    """summary.md said 7/8 PASS beside a results.json of 8/8 PASS: a CI job posting
    summary.md would have posted another run's verdict."""
    green = run([record(case_id())])
    red = run([record(case_id(), Label.MISMATCH, message="off")], seed=3)
    directory = tmp_path / "latest"
    directory.mkdir()
    write_results(green, directory / "results.json")
    write_results(red, tmp_path / "red.json")
    write_results(green, tmp_path / "green-copy.json")
    assert main(["report", str(tmp_path / "red.json"), "-o", str(directory)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf report: error: -o {directory} holds the results.json of another run, which "
        "its index.html and summary.md would then contradict; give a directory of its own, "
        "e.g. -o reports/compare"]
    assert not (directory / "summary.md").exists()
    for same in (directory / "results.json", tmp_path / "green-copy.json"):
        assert main(["report", str(same), "-o", str(directory)]) == 0
    assert "1/1 PASS" in (directory / "summary.md").read_text()


def test_a_report_never_overwrites_pages_of_the_users_own(tmp_path, capsys):
    """`flexconf report -o docs/` replaced a user's own index.html without a word. Pages this
    suite wrote are replaced, those of an older report (no generator tag) too."""
    results_file = tmp_path / "run.json"
    write_results(run([record(case_id())]), results_file)
    for name, text in (("index.html", "<html><title>My project</title></html>"),
                       ("summary.md", "# My notes\n")):
        directory = tmp_path / name.split(".")[0]
        directory.mkdir()
        (directory / name).write_text(text)
        assert main(["report", str(results_file), "-o", str(directory)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"flexconf report: error: -o {directory} holds {name}, which no report of this "
            "suite wrote and the report would overwrite; give a directory of its own, e.g. "
            "-o reports/compare"]
        assert (directory / name).read_text() == text
        assert sorted(p.name for p in directory.iterdir()) == [name]
    ours = tmp_path / "ours"
    assert main(["report", str(results_file), "-o", str(ours)]) == 0
    page = (ours / "index.html").read_text()
    assert '<meta name="generator" content="flexattention-conformance">' in page
    older = page.replace('<meta name="generator" content="flexattention-conformance">\n', "")
    assert older != page
    (ours / "index.html").write_text(older)
    assert main(["report", str(results_file), "-o", str(ours)]) == 0
    assert (ours / "index.html").read_text() == page


def test_a_report_without_o_goes_beside_the_run_it_describes(tmp_path, capsys):
    """The default was reports/latest, which holds the last run's results: a report of any
    other file there would now be refused."""
    older, newer = tmp_path / "2.32", tmp_path / "2.33"
    for directory, seed in ((older, 0), (newer, 1)):
        directory.mkdir()
        write_results(run([record(case_id())], seed=seed), directory / "results.json")
    assert main(["report", str(older / "results.json"), str(newer / "results.json")]) == 0
    assert capsys.readouterr().out.strip() == str(newer / "index.html")
    assert "1/1 PASS" in (newer / "summary.md").read_text()
    assert not (older / "index.html").exists()


def test_a_report_into_the_directory_of_a_killed_run_is_refused(tmp_path, capsys):
    """After kill -9, `flexconf report previous/results.json -o DIR` wrote a green summary.md
    beside the killed run's records, with no results.json: the directory read as a run that
    passed (an outside audit). Once recovered, the directory is that run's, as any other."""
    from records.events import RecordWriter
    from records.store import RunManifest, write_manifest

    killed = tmp_path / "latest"
    write_manifest(killed, RunManifest("2026-12-06T01:00:00.000+00:00", "0.1.0", {},
                                       [case_id()]))
    writer = RecordWriter(killed, "gw0")
    writer.started(case_id(), {}, "gw0", "2026-12-06T01:00:01.000+00:00")
    writer.finished(record(case_id(), Label.MISMATCH, message="off"))
    writer.close()
    write_results(run([record(case_id())]), tmp_path / "green.json")
    assert main(["report", str(tmp_path / "green.json"), "-o", str(killed)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf report: error: -o {killed} holds the records of a run that stopped without "
        "writing its results (started 2026-12-06T01:00:00.000+00:00), which a report there "
        f"would read as; keep them first with flexconf recover {killed}, or give a directory "
        "of its own, e.g. -o reports/compare"]
    assert not (killed / "summary.md").exists() and not (killed / "index.html").exists()


def test_a_baseline_that_is_the_described_run_itself_is_refused(tmp_path, capsys):
    """It said "0 regressions" of a run compared with itself, where the gate refuses the pair
    (an outside audit)."""
    write_results(run([record(case_id())]), tmp_path / "new.json")
    assert main(["report", str(tmp_path / "new.json"), "--baseline",
                 f"{tmp_path}/./new.json", "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf report: error: --baseline {tmp_path}/./new.json is the results file of the "
        "run the report describes, and a run compared with itself shows nothing; give the "
        "baseline run's results.json"]
    assert not (tmp_path / "out").exists()
    (tmp_path / "link.json").symlink_to(tmp_path / "new.json")
    assert main(["report", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "link.json"),
                 "-o", str(tmp_path / "out")]) == 2
    assert "is the results file of the run the report describes" in capsys.readouterr().err
    started = replace(run([record(case_id())]), started_at="2026-12-01T10:00:00.000+00:00")
    write_results(started, tmp_path / "new.json")
    write_results(started, tmp_path / "copy.json")  # a copy: the same start on the same host
    assert main(["report", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "copy.json"),
                 "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf report: error: --baseline {tmp_path / 'copy.json'} is a copy of the run the "
        "report describes (started 2026-12-01T10:00:00.000+00:00), and a run compared with "
        "itself shows nothing; give the baseline run's results.json"]
    later = replace(started, started_at="2026-12-01T11:00:00.000+00:00")
    write_results(later, tmp_path / "old.json")
    assert main(["report", str(tmp_path / "new.json"), "--baseline", str(tmp_path / "old.json"),
                 "-o", str(tmp_path / "out")]) == 0
