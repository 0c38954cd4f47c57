"""records/ is the ground floor: torch-free, importing nothing of the project, and the only
place the label set is written."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from records import Label, Record, RunResults, load_results, results_schema, write_results
from records.results import SCHEMA_VERSION, ResultsError
from reports.render import write_report

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = {"cases", "conformance", "reference", "reports", "tests", "benchmarks"}


def test_records_imports_nothing_of_the_project_nor_torch():
    code = ("import sys, records, records.store, records.text, records.labels, records.results\n"
            f"print([m for m in sys.modules if m.split('.')[0] in {sorted(PROJECT_PACKAGES | {'torch'})!r}])")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    assert loaded == "[]"
    for path in (ROOT / "records").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in PROJECT_PACKAGES | {"torch"}, (path, name)


def _label_members(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "Label" and n.attr in Label.__members__}


def test_no_module_outside_records_writes_a_label_list():
    """A literal list, tuple, set or dict naming more than three labels is a second label
    table: it goes stale when a label is added (a KeyError at render time, once)."""
    offenders = []
    # sample messages for synthetic runs, read with a fallback: data keyed by label, not a
    # label set; the child's outcomes map to labels in one table (conformance/protocol.py)
    allowed = {"reports/synthetic.py", "conformance/protocol.py"}
    for package in ("cases", "conformance", "reference", "reports"):
        for path in (ROOT / package).rglob("*.py"):
            if str(path.relative_to(ROOT)) in allowed:
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict):
                    if len(_label_members(node)) > 3:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if {"COMPILE_TIMEOUT", "OUT_OF_MEMORY", "HARNESS_ERROR"} <= set(
                            node.value.replace(",", " ").split()):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_schema_enum_and_docs_follow_the_label_table():
    assert results_schema()["$defs"]["record"]["properties"]["label"]["enum"] == \
        [label.value for label in Label]
    documented = (ROOT / "docs" / "labels.md").read_text()
    for label in Label:
        assert f"| `{label.value}` |" in documented, label


def test_a_report_renders_every_label(tmp_path):
    records = tuple(Record(case_id=f"case/{label.value.lower()}", label=label,
                           message=f"{label.value} happened", compile_seconds=1.0)
                    for label in Label)
    run = RunResults(environment={"backend": "test"}, options={"backend": "test",
                     "profile": "smoke", "seed": 0}, records=records, suite_version="t")
    write_results(run, tmp_path / "results.json")
    loaded = load_results(tmp_path / "results.json")
    write_report(loaded, tmp_path)
    html = (tmp_path / "index.html").read_text()
    for label in Label:
        assert f".l-{label.value}{{background:{label.info.cell_colour}" in html
        assert f'class="l-{label.value}"' in html
        assert label.meaning.replace("'", "&#39;") in html
    assert [r.label for r in loaded.records] == list(Label)


def test_the_run_lock_admits_one_run_says_who_holds_it_and_goes_with_its_process(tmp_path):
    """records.store's run lock: a second holder is refused with the first one's words, and a
    process that ends, however it ends, leaves the directory free (the kernel's flock)."""
    import pytest

    from records.store import RunInProgress, hold_run_lock, run_in_progress

    assert run_in_progress(tmp_path) is None  # no run ever started here
    held = hold_run_lock(tmp_path, "pid 1 on here, started now")
    assert run_in_progress(tmp_path) == "pid 1 on here, started now"
    with pytest.raises(RunInProgress) as refused:
        hold_run_lock(tmp_path, "pid 2")
    assert refused.value.holder == "pid 1 on here, started now"
    held.close()
    assert run_in_progress(tmp_path) is None
    hostile = hold_run_lock(tmp_path, "pid 3\x1b[2J\nok")  # read back as one safe line
    said = run_in_progress(tmp_path)
    assert "pid 3" in said and "\x1b" not in said and "\n" not in said, said
    hostile.close()

    holder = subprocess.Popen(  # a process that holds the lock until it is killed
        [sys.executable, "-c", "import sys, time; from records.store import hold_run_lock; "
         f"held = hold_run_lock({str(tmp_path)!r}, 'pid ' + str(__import__('os').getpid())); "
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline() == "held\n"  # the event: the lock is taken
        assert run_in_progress(tmp_path) == f"pid {holder.pid}"
    finally:
        holder.kill()
        holder.wait()
    assert run_in_progress(tmp_path) is None


def test_only_a_run_that_left_records_and_no_results_of_its_own_is_unreported(tmp_path):
    """What a new run may not clear without a word (records.store.unreported_run): the store
    of a run killed before it wrote its results. A run a signal stopped wrote them
    (``complete: false``), as recover does, also when they are moved away since; an earlier
    run's results do not report this one; a run resumed is unreported until it ends."""
    from records.events import RecordWriter, merge_records
    from records.store import (RunManifest, set_aside_results, unreported_run, write_manifest,
                               write_run)

    ids = ["full/a", "causal/a"]
    write_manifest(tmp_path, RunManifest("t1", "v", {}, ids))
    assert unreported_run(tmp_path) is None  # killed before its first case: nothing to lose
    writer = RecordWriter(tmp_path, "gw0")
    writer.started(ids[0], {}, "gw0", "t1")
    writer.finished(Record(case_id=ids[0], label=Label.PASS, finished_at="t2"))
    writer.close()
    assert unreported_run(tmp_path).started_at == "t1"  # killed after a case finished

    def results(started_at: str, finished_at: str, complete: bool) -> None:
        write_run(tmp_path, merge_records(tmp_path, ids), {},
                  {"backend": "t", "profile": "smoke", "seed": 0}, "v", started_at, finished_at,
                  complete)

    write_results(RunResults({}, {}, (), "v", started_at="t0"), tmp_path / "results.json")
    assert unreported_run(tmp_path).started_at == "t1"  # the run before's, put back by hand
    results("t1", "t3", False)  # stopped by a signal: its own results, incomplete
    assert unreported_run(tmp_path) is None
    (tmp_path / "results.json").rename(tmp_path / "kept.json")  # archived elsewhere
    assert unreported_run(tmp_path) is None
    set_aside_results(tmp_path, resuming=RunManifest("t1", "v", {}, ids))  # --resume starts
    assert unreported_run(tmp_path).started_at == "t1"
    results("t1", "", False)  # flexconf recover's
    assert unreported_run(tmp_path) is None


def test_a_resumed_worker_file_loses_its_torn_line_not_its_next_event(tmp_path):
    """A worker killed mid-write (or a full disk) leaves a torn last line; the resumed run's
    worker appended its first event onto it, and that event was lost (an outside audit)."""
    from records.events import DAMAGED_EVENT, RecordWriter, read_events

    writer = RecordWriter(tmp_path, "gw0")
    writer.started("full/a", {}, "gw0", "t1")
    writer.finished(Record(case_id="full/a", label=Label.PASS, finished_at="t2"))
    writer.close()
    with open(tmp_path / "records" / "gw0.jsonl", "a") as f:
        f.write('{"event": "finished", "record": {"case_id": "full/b' + "x" * 70000)
    resumed = RecordWriter(tmp_path, "gw0")
    resumed.environment({"torch": "2.13.0"})
    resumed.close()
    events = [event["event"] for event in read_events(tmp_path)]
    assert events == ["started", "finished", "environment"] and DAMAGED_EVENT not in events
    whole = RecordWriter(tmp_path, "gw0")  # a file that ends with its newline is kept whole
    whole.close()
    assert [event["event"] for event in read_events(tmp_path)] == events
    # a last event short of its newline only is whole: read_events reads it, and a resume
    # counted its case as finished (an outside review: it was cut off, and the case lost)
    path = tmp_path / "records" / "gw0.jsonl"
    path.write_text(path.read_text().rstrip("\n"))
    again = RecordWriter(tmp_path, "gw0")
    again.selection(["full/a"])
    again.close()
    assert [event["event"] for event in read_events(tmp_path)] == events + ["selection"]
    # read as read_events reads it: a last line with a byte that is not UTF-8 (a disk fault)
    # is damage, cut off as a torn line is (read as U+FFFD, such a byte changed a case id)
    head, _, last = path.read_bytes().rstrip(b"\n").rpartition(b"\n")
    path.write_bytes(head + b"\n" + last.replace(b"full/a", b"full/a\xff"))
    again = RecordWriter(tmp_path, "gw0")
    again.close()
    assert [event["event"] for event in read_events(tmp_path)] == events
    assert path.read_bytes() == head + b"\n"


def test_a_line_with_a_byte_that_is_not_utf8_is_damage_not_a_record(tmp_path):
    """One byte of a finished record's case id changed to 0xff (a disk fault): read as U+FFFD,
    the record was of a case the run never selected, and the resumed run said 5/5 PASS of 4
    selected cases, the gate MAY SHIP (an outside audit). It is a damaged line: the case has
    no record, and a resume runs it again."""
    from records.events import RecordWriter, finished_ids, merge_records

    writer = RecordWriter(tmp_path, "gw0")
    for cid in ("full/a", "full/b"):
        writer.started(cid, {}, "gw0", "t1")
        writer.finished(Record(case_id=cid, label=Label.PASS, finished_at="t2"))
    writer.close()
    path = tmp_path / "records" / "gw0.jsonl"
    assert finished_ids(tmp_path) == {"full/a", "full/b"}
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"full/a"', b'"full/\xffa"')
    path.write_bytes(b"".join(lines))
    assert finished_ids(tmp_path) == {"full/b"}
    merged = merge_records(tmp_path, ["full/a", "full/b"])
    assert merged.damaged == 1
    # right after its start, the damaged line was its record: no record, and no CRASH (its
    # worker went on to the next case; tests/test_damaged_store.py)
    assert [(r.case_id, r.label) for r in merged.records] == [("full/b", Label.PASS)]
    assert merged.damaged_records == ("full/a",) and merged.unfinished == []
    # the last line too, when whole (its newline there): damage, counted (a review: it was
    # skipped as a torn line, and recover said 0 damaged)
    lines[-1] = lines[-1].replace(b'"full/b"', b'"full/\xffb"')
    path.write_bytes(b"".join(lines))
    assert merge_records(tmp_path, ["full/a", "full/b"]).damaged == 2


def test_a_schema_version_of_another_type_says_so(tmp_path):
    """A string "1" read "schema_version '1' is not supported (this suite reads version 1)"
    (an audit): the same words for two values that look alike."""
    for version, expected in ((str(SCHEMA_VERSION), f"schema_version '{SCHEMA_VERSION}' is not "
                               f"supported (this suite reads version {SCHEMA_VERSION}, a str "
                               "where a number belongs)"),
                              (SCHEMA_VERSION + 98, f"schema_version {SCHEMA_VERSION + 98} is not "
                               f"supported (this suite reads version {SCHEMA_VERSION})")):
        path = tmp_path / "results.json"
        path.write_text(json.dumps({"schema_version": version}))
        with pytest.raises(ResultsError) as raised:
            load_results(path)
        assert str(raised.value).startswith(f"{path}: {expected}; "), str(raised.value)


def test_a_case_recorded_twice_is_not_a_valid_results_file(tmp_path):
    """A doctored file of 8 cases and one again read "9/9 PASS" in the report and the gate
    (an audit); no run writes one (a worker records a case once, merge keeps the first)."""
    records = tuple(Record(case_id=f"case/{i}", label=Label.PASS) for i in range(3))
    run = RunResults(environment={"backend": "test"}, options={"backend": "test",
                     "profile": "smoke", "seed": 0}, records=records + records[1:2],
                     suite_version="t")
    write_results(run, tmp_path / "results.json")
    with pytest.raises(ResultsError) as raised:
        load_results(tmp_path / "results.json")
    assert str(raised.value).startswith(
        f"{tmp_path / 'results.json'}: not a valid results file at records/3: case case/1 is "
        "also records/1; a run records each case once; "), str(raised.value)


def test_a_time_that_is_nan_or_infinite_is_not_a_valid_results_file(tmp_path):
    """Python's json reads NaN and Infinity, and NaN passes the schema's minimum of 0: a
    doctored compile time of NaN went through the gate as MAY SHIP (an audit)."""
    for field_path, value in (("compile_seconds", "NaN"), ("run_seconds", "Infinity"),
                              ("compile_breakdown/cxx_compile", "NaN")):
        run = RunResults(environment={"backend": "test"}, options={"backend": "test",
                         "profile": "smoke", "seed": 0},
                         records=(Record(case_id="case/0", label=Label.PASS, compile_seconds=1.0,
                                         run_seconds=0.5,
                                         compile_breakdown={"cxx_compile": 0.8}),),
                         suite_version="t")
        write_results(run, tmp_path / "results.json")
        data = json.loads((tmp_path / "results.json").read_text())
        target, _, stage = field_path.partition("/")
        if stage:
            data["records"][0][target][stage] = "__VALUE__"
        else:
            data["records"][0][target] = "__VALUE__"
        (tmp_path / "results.json").write_text(json.dumps(data).replace('"__VALUE__"', value))
        with pytest.raises(ResultsError) as raised:
            load_results(tmp_path / "results.json")
        assert str(raised.value).startswith(
            f"{tmp_path / 'results.json'}: not a valid results file at records/0/{field_path}: "
            "not a finite number of seconds; "), str(raised.value)


@pytest.mark.parametrize("doctor, says", [
    (lambda text: "[" * 100_000 + "]" * 100_000, "nested too deeply for JSON this suite writes"),
    (lambda text: text.replace('"backend": "test"', '"backend": "test", "x": '
                               + "[" * 900 + "]" * 900, 1),
     "it nests deeper than 64 levels, which no file of this suite holds"),
    (lambda text: text.replace('"compile_seconds": 1.0', '"compile_seconds": 1' + "0" * 800),
     "it holds an integer of 801 digits, which no file of this suite holds"),
    (lambda text: text.replace('"seed": 0', '"seed": 1' + "0" * 5000),
     "not JSON this suite writes (Exceeds the limit (4300 digits)"),
])
def test_a_doctored_file_is_one_line_not_a_recursion_or_overflow_traceback(tmp_path, doctor,
                                                                            says):
    """Nesting thousands deep and integers no float holds reached the readers (RecursionError,
    OverflowError: tracebacks in gate, report, merge and --schedule-from; an outside trial)."""
    run = RunResults(environment={"backend": "test"}, options={"backend": "test",
                     "profile": "smoke", "seed": 0},
                     records=(Record(case_id="case/0", label=Label.PASS, compile_seconds=1.0),),
                     suite_version="t")
    path = tmp_path / "results.json"
    write_results(run, path)
    doctored = doctor(json.dumps(json.loads(path.read_text())))
    assert doctored != path.read_text()
    path.write_text(doctored)
    with pytest.raises(ResultsError) as raised:
        load_results(path)
    assert str(raised.value).startswith(f"{path}: {says}"), str(raised.value)


def _strict(text: str):
    """JSON as a strict reader (jq, JSON.parse) reads it: NaN and Infinity are errors."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_a_metric_that_is_not_finite_is_written_as_strict_json_and_shown(tmp_path):
    """An Inf in a backend's output makes a verdict metric infinite; results.json used to
    carry it as ``Infinity``, which only Python's json reads (an audit)."""
    inf, nan = float("inf"), float("nan")
    record = Record(case_id="case/0", label=Label.MISMATCH, message="out: 3 Inf",
                    metrics={"error_ratio": inf, "out": {"worst_margin": -inf, "lse": nan},
                             "places": [1.5, inf]})
    run = RunResults(environment={"backend": "test"}, options={"backend": "test",
                     "profile": "smoke", "seed": 0}, records=(record,), suite_version="t")
    write_results(run, tmp_path / "results.json")
    data = _strict((tmp_path / "results.json").read_text())
    assert data["records"][0]["metrics"] == {
        "error_ratio": "inf", "out": {"worst_margin": "-inf", "lse": "nan"},
        "places": [1.5, "inf"]}
    loaded = load_results(tmp_path / "results.json")  # and it is still a valid results file
    assert loaded.records[0].metrics["error_ratio"] == "inf"
    write_report(loaded, tmp_path / "report")
    html = (tmp_path / "report" / "index.html").read_text()
    assert "inf" in html and "Infinity" not in html


def test_a_resume_drops_pages_without_results_and_keeps_nothing_superseded(tmp_path):
    """Pages without their results.json (a report rendered into a killed run's directory)
    went into previous/ at a resume's start, and what previous/ held into
    .superseded-previous/, which nothing removed (an outside audit); removing it then lost
    the run before's pages (an outside review). Such pages are no run's results: they go, and
    previous/ keeps the run before; another run's results are set aside as by any run."""
    from records.store import PREVIOUS_DIR, SUPERSEDED_DIR, RunManifest, set_aside_results

    resuming = RunManifest("t1", "v", {}, ["full/a"])
    (tmp_path / PREVIOUS_DIR).mkdir()
    (tmp_path / PREVIOUS_DIR / "summary.md").write_text("the run before")
    (tmp_path / "summary.md").write_text("a report rendered here")
    assert set_aside_results(tmp_path, resuming=resuming) == []
    assert (tmp_path / PREVIOUS_DIR / "summary.md").read_text() == "the run before"
    assert not (tmp_path / "summary.md").exists()
    write_results(RunResults({}, {}, (Record(case_id="full/a", label=Label.PASS),), "v",
                             started_at="t0"), tmp_path / "results.json")
    (tmp_path / "summary.md").write_text("the run t0")
    set_aside_results(tmp_path, resuming=resuming)
    assert (tmp_path / PREVIOUS_DIR / "summary.md").read_text() == "the run t0"
    assert not (tmp_path / SUPERSEDED_DIR).exists()


def test_a_directory_named_like_a_worker_file_is_damage_not_a_traceback(tmp_path):
    """`flexconf recover` said "[Errno 21] Is a directory" of records/main.jsonl made a
    directory (an outside audit)."""
    from records.events import DAMAGED_EVENT, RecordWriter, read_events

    writer = RecordWriter(tmp_path, "gw0")
    writer.started("full/a", {}, "gw0", "t1")
    writer.close()
    (tmp_path / "records" / "main.jsonl").mkdir()
    assert [event["event"] for event in read_events(tmp_path)] == ["started", DAMAGED_EVENT]
