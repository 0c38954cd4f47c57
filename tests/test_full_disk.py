"""A full disk is the environment's, never a backend's label nor the suite's verdict: a case
that met one is HARNESS_ERROR, "not judged", and ``--resume`` runs it again once there is room;
the caches only save time and are passed by; no write leaves half a file or a torn line behind
(an outside audit: a full cache disk failed every case, a full TMPDIR or report disk baked
HARNESS_ERROR into a complete run that a resume kept, and kept outputs left a partial file).
A full disk is /dev/full here: every write into it fails with ENOSPC."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cases.model import Case, Shape, Variant
from records.errors import NOT_JUDGED_KEY
from records.results import Label, Record, load_results
from tests import fault_backends
from tests.test_plugin_runs import CASES, clean_env, pytest_args, run

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full (Linux)")
SMALL = Case(Variant("causal"), Shape(1, 2, 2, 16, 16, 8), "fp32", "fwd")


def _full_temporary_file(path: Path) -> Path:
    """Where ``save_whole`` writes ``path`` first, made a link to /dev/full."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.symlink_to(FULL)
    return tmp


def test_a_tensor_file_on_a_full_disk_raises_the_disks_error_and_leaves_nothing(tmp_path):
    import torch

    from reference.outputs import save_whole

    path = tmp_path / "out.pt"
    tmp = _full_temporary_file(path)
    with pytest.raises(OSError) as raised:
        save_whole({"x": torch.ones(100_000)}, path)
    assert raised.value.errno == errno.ENOSPC  # torch's own error says "unexpected pos" only
    assert not path.exists() and not tmp.exists() and not tmp.is_symlink()
    save_whole({"x": torch.ones(3)}, path)  # with room, whole
    assert torch.load(path, weights_only=True)["x"].tolist() == [1.0, 1.0, 1.0]


def test_a_reference_cache_that_cannot_be_written_is_passed_by(tmp_path):
    """Every case was HARNESS_ERROR 'the reference computation failed' (an outside audit)."""
    from conformance.reference_cache import ReferenceCache, _variant_module, cache_key

    cache = ReferenceCache(tmp_path, 2**30)
    key = cache_key(SMALL.id, 0, "cpu", _variant_module(SMALL))
    _full_temporary_file(tmp_path / f"{key}.pt")
    golden, baseline = cache.get(SMALL, 0, "cpu")
    assert golden.out.shape == (1, 2, 16, 8) and baseline.out.shape == golden.out.shape
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing cached, nothing left


def _writes_through(writer, write, monkeypatch) -> None:
    """``writer`` (a RecordWriter) writes its lines through ``write``: a disk that refuses."""
    monkeypatch.setattr(writer, "_file", type("Full", (), {
        "write": staticmethod(write), "fileno": writer._file.fileno,
        "close": writer._file.close})())


def test_a_record_line_the_disk_refuses_half_way_is_cut_off_not_torn(tmp_path, monkeypatch):
    from records.events import RecordWriter, finished_ids, merge_records

    writer = RecordWriter(tmp_path, "gw0")
    writer.environment({"torch": "2.13.0"})
    before = (tmp_path / "records" / "gw0.jsonl").read_bytes()
    writer.started("full/a", {}, "gw0", "t1")
    real_write = writer._file.write

    def half_then_full(data):
        real_write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    _writes_through(writer, half_then_full, monkeypatch)
    with pytest.raises(OSError):
        writer.finished(Record(case_id="full/a", label=Label.PASS, finished_at="t2"))
    writer.close()  # nothing held back: no second error
    # the case's started event went with its record: a case the run did not record, not one
    # its worker stopped in (CRASH, in a run that said complete: a review)
    assert (tmp_path / "records" / "gw0.jsonl").read_bytes() == before
    merged = merge_records(tmp_path, ["full/a"])
    assert finished_ids(tmp_path) == set() and merged.damaged == 0 and merged.records == []


def test_a_full_disk_is_known_by_its_errno_in_the_chain_never_by_text():
    """Inductor's error on a full cache disk is an InductorError whose chain holds the OSError
    (seen on torch 2.13 with a 64 KiB tmpfs as TORCHINDUCTOR_CACHE_DIR); words alone (a mod's
    message, a log's) are no full disk."""
    from conformance.child import _guard, classify_exception
    from conformance.protocol import Outcome, Phase

    full = OSError(errno.ENOSPC, "No space left on device")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    for cause in (full, quota):
        try:
            raise RuntimeError(f"InductorError: OSError: {cause}") from cause
        except RuntimeError as exc:
            assert classify_exception(exc) is Outcome.DISK_FULL
    words = RuntimeError("my mod says: OSError: [Errno 28] No space left on device")
    assert classify_exception(words) is Outcome.ERROR
    # g++ or ld run as a subprocess: no OSError, only the tool's words (a review reproduced it
    # with TORCHINDUCTOR_CACHE_DIR on a 300 KiB tmpfs: "ld: final link failed: No space left
    # on device"); Inductor's CppCompileError carries them as its output
    import subprocess

    class CppCompileError(RuntimeError):  # torch._inductor.exc's, known by its name
        def __init__(self, output):
            super().__init__("C++ compile error")
            self.output = output

    link = subprocess.CalledProcessError(1, ["ld"], output=b"ld: final link failed: No space "
                                                           b"left on device")
    for tool in (link, CppCompileError("ld: final link failed: No space left on device")):
        try:
            raise RuntimeError("InductorError: C++ compile error") from tool
        except RuntimeError as exc:
            assert classify_exception(exc) is Outcome.DISK_FULL
    other = subprocess.CalledProcessError(1, ["g++"], output=b"error: 'x' was not declared")
    try:
        raise RuntimeError("InductorError: No space left on device") from other
    except RuntimeError as exc:  # the words outside the tool's output are not read
        assert classify_exception(exc) is Outcome.ERROR
    for harness, expected in ((True, Outcome.DISK_FULL), (False, Outcome.DISK_FULL)):
        def write():
            raise full
        with pytest.raises(Exception) as raised:
            _guard(Phase.RUN, write, harness=harness)
        assert raised.value.outcome is expected
    with pytest.raises(Exception) as raised:
        _guard(Phase.SETUP, lambda: (_ for _ in ()).throw(words), harness=True)
    assert raised.value.outcome is Outcome.HARNESS


@pytest.mark.parametrize("phase", ["compile", "run", "setup"])
def test_a_case_the_child_saw_meet_a_full_disk_is_not_judged(phase):
    from conformance.decision import decide
    from conformance.protocol import Observation, Outcome, Phase

    text = "InductorError: OSError: [Errno 28] No space left on device"
    decision = decide(SMALL, Observation(Outcome.DISK_FULL, Phase(phase), message=text), None)
    assert decision.label is Label.HARNESS_ERROR
    assert decision.message.startswith("not judged: a disk was full (InductorError: ")
    assert decision.metrics == {NOT_JUDGED_KEY: "disk full"}
    other = decide(SMALL, Observation(Outcome.ERROR, Phase.COMPILE, message=text), None)
    assert other.label is Label.COMPILE_ERROR and not other.metrics  # words are no full disk


def test_a_case_not_judged_is_run_again_by_a_resume_until_it_is(tmp_path):
    from records.events import RecordWriter, finished_ids

    writer = RecordWriter(tmp_path, "gw0")
    full = Record(case_id="x/a", label=Label.HARNESS_ERROR, finished_at="t1",
                  metrics={NOT_JUDGED_KEY: "disk full"})
    writer.finished(full)
    writer.finished(Record(case_id="x/b", label=Label.HARNESS_ERROR, finished_at="t1"))
    assert finished_ids(tmp_path) == {"x/b"}  # a harness bug of ours is a result: kept
    writer.finished(Record(case_id="x/a", label=Label.PASS, finished_at="t2"))
    assert finished_ids(tmp_path) == {"x/a", "x/b"}
    writer.close()


@pytest.mark.slow
def test_a_run_on_a_full_disk_says_what_was_not_judged_and_a_resume_judges_it(tmp_path):
    backend = "tests.fault_backends:DiskFullWhileFileExists"
    full = tmp_path / "disk-is-full"
    full.touch()
    env = clean_env(**{fault_backends.DISK_FULL_FILE: str(full)})
    report = tmp_path / "report"
    first = run(pytest_args(tmp_path, backend, CASES[:2]), env=env)
    assert first.returncode == 1, first.stdout[-3000:]
    results = load_results(report / "results.json")
    assert [r.label for r in results.records] == [Label.PASS, Label.HARNESS_ERROR]
    assert results.records[1].message.startswith("not judged: a disk was full (")
    lines = first.stdout.splitlines()
    assert "1 case(s) not judged: a disk was full; make room, then --resume runs them again" \
        in lines, first.stdout[-3000:]
    again = [x for x in lines if x.startswith("run them again: ")]
    assert len(again) == 1 and again[0].endswith(f"--resume {report}"), first.stdout[-3000:]
    full.unlink()  # room again
    resumed = run(pytest_args(tmp_path, backend, CASES[:2], "--resume", str(report)), env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    results = load_results(report / "results.json")
    assert results.complete and [r.label for r in results.records] == [Label.PASS, Label.PASS]


def _not_judged(case_id: str, finished_at: str = "t1") -> Record:
    return Record(case_id=case_id, label=Label.HARNESS_ERROR, finished_at=finished_at,
                  message="not judged: a disk was full (OSError: [Errno 28] ...)",
                  metrics={NOT_JUDGED_KEY: "disk full"})


def test_a_case_not_judged_is_never_a_known_failure_nor_a_run_to_gate(tmp_path, capsys):
    """An expectations entry of HARNESS_ERROR made a full disk xfail and KNOWN, and
    expectations update replaced a triaged entry with it (a review)."""
    from types import SimpleNamespace

    from conformance.runner import Runner
    from reports.expectations import parse_expectations
    from reports.gate_inputs import not_a_whole_finished_run
    from tests.test_gate import gate
    from tests.test_report_doctored import case_id, record, run as a_run

    a = case_id(seq=128)
    known = parse_expectations(f'version = 1\n[[failure]]\nbackend = "*"\ncase = "{a}"\n'
                               'label = "HARNESS_ERROR"\nreason = "a bad mod"\n')
    runner = SimpleNamespace(expectations=known, backend_name="cpu-eager")
    harness = Record(case_id=a, label=Label.HARNESS_ERROR)
    assert Runner._expected_failure(runner, harness) == "a bad mod"
    assert Runner._expected_failure(runner, _not_judged(a)) is None
    full = a_run([_not_judged(a)])
    assert not_a_whole_finished_run(full, "gate") == (
        "1 of its cases was not judged (a disk was full: " + a + "); make room, --resume its "
        "report directory (a merged file's: each shard's, then merge again) to judge them, and "
        "gate that")
    assert gate(tmp_path, a_run([record(a)]), full) == 2
    assert "was not judged (a disk was full" in capsys.readouterr().err


def test_a_resume_cut_off_while_judging_a_case_again_leaves_it_cut_off(tmp_path):
    """Started again after its not-judged record and stopped: the old record stood, and the
    stopped run said it was complete (a review)."""
    from records.events import RecordWriter, merge_records

    writer = RecordWriter(tmp_path, "gw0")
    writer.started("x/a", {}, "gw0", "2026-12-07T05:00:00")
    writer.finished(_not_judged("x/a", "2026-12-07T05:00:01"))
    writer.started("x/a", {}, "gw0", "2026-12-07T06:00:00")  # the resume, then a kill
    merged = merge_records(tmp_path, ["x/a"])
    assert merged.unfinished == ["x/a"] and merged.records[0].label is Label.CRASH
    writer.finished(Record(case_id="x/a", label=Label.PASS, finished_at="2026-12-07T06:00:02"))
    writer.close()
    merged = merge_records(tmp_path, ["x/a"])
    assert merged.unfinished == [] and merged.records[0].label is Label.PASS


def test_a_merge_keeps_a_judged_copy_over_one_not_judged():
    from conformance.merge import _rank

    judged = [Record(case_id="x/a", label=label, finished_at="t") for label in
              (Label.PASS, Label.MISMATCH)]
    assert all(_rank(_not_judged("x/a")) > _rank(r) for r in judged)


def test_artefacts_a_full_disk_refuses_leave_no_half_copy(tmp_path, monkeypatch):
    """A MISMATCH became 'not judged' when its artefacts could not be filed (a review): the
    executor keeps the verdict with a note (conformance/executor.py), and what was copied
    half-way is removed."""
    import conformance.artifacts as artifacts

    source = tmp_path / "build"
    source.mkdir()
    (source / "kernel.cpp").write_text("int main() {}\n")

    def half_then_full(src, dst, *args, **kwargs):
        Path(dst).write_text("int ma")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts.shutil, "copy2", half_then_full)
    root = tmp_path / "artifacts"
    with pytest.raises(OSError) as raised:
        artifacts.file_case_artifacts("x/a", [source / "kernel.cpp"], source, "log", root)
    assert raised.value.errno == errno.ENOSPC and list(root.iterdir()) == []
    monkeypatch.setattr(artifacts.shutil, "copy2", lambda *a, **k: (_ for _ in ()).throw(
        FileNotFoundError(errno.ENOENT, "gone")))  # removed by the compiler meanwhile: kept
    where = artifacts.file_case_artifacts("x/a", [source / "kernel.cpp"], source, "log", root)
    assert (tmp_path / where / "child.log").read_text() == "log"


def test_fuzzing_takes_a_case_a_full_disk_kept_from_being_judged_for_no_finding():
    """It stopped at such an example and shrank it while the disk was still full (a review)."""
    from cases.model import fuzz_id
    from conformance import fuzz

    def execute(case):
        return _not_judged(fuzz_id(case))

    result = fuzz.search(execute, examples=5, seed=3)
    assert result.failure is None and len(result.tried) == 5


def test_what_a_resume_judged_stands_whichever_file_or_clock_says_otherwise(tmp_path):
    """The first run's store main.jsonl; the resume's worker gw0.jsonl, read first; a resume on
    a host whose clock is behind (a review: the old start won, and the not-judged record
    beat a PASS with an earlier finished_at, so every resume ran the case again)."""
    from records.events import RecordWriter, finished_ids, merge_records

    first = RecordWriter(tmp_path, "main")
    first.started("x/a", {}, "main", "2026-12-07T05:00:00")
    first.finished(_not_judged("x/a", "2026-12-07T05:00:01"))
    first.close()
    resumed = RecordWriter(tmp_path, "gw0")
    resumed.started("x/a", {}, "gw0", "2026-12-07T06:00:00")  # then killed
    merged = merge_records(tmp_path, ["x/a"])
    assert merged.unfinished == ["x/a"] and finished_ids(tmp_path) == set()
    resumed.finished(Record(case_id="x/a", label=Label.PASS, finished_at="2026-12-07T04:00:00"))
    resumed.close()  # finished by a clock an hour behind
    merged = merge_records(tmp_path, ["x/a"])
    assert merged.unfinished == [] and merged.records[0].label is Label.PASS
    assert finished_ids(tmp_path) == {"x/a"}


def test_shrink_stops_at_a_case_a_full_disk_kept_from_being_judged():
    """It said "fix the case" of one, and took one met while shrinking for a case that loses
    the label, so it kept a larger case (a review)."""
    from conformance.shrink import shrink

    big = Case(Variant("causal"), Shape(2, 4, 4, 64, 64, 16), "fp32", "fwd")
    with pytest.raises(ValueError, match="was not judged: a disk was full; make room"):
        shrink(big, lambda case: _not_judged(case.id))

    def mismatch_then_full(case):
        if case.id == big.id:
            return Record(case_id=case.id, label=Label.MISMATCH, case=case.to_json())
        return _not_judged(case.id)

    with pytest.raises(ValueError, match=f"not judged while shrinking {big.id}"):
        shrink(big, mismatch_then_full)


def test_outputs_and_artefacts_a_full_disk_refuses_are_said_so_and_the_verdict_stays(
        tmp_path, monkeypatch):
    """Outputs a full disk refused were listed as over --keep-outputs-cap; artefacts it refused
    turned a MISMATCH into 'not judged' (a review)."""
    from types import SimpleNamespace

    import conformance.executor as executor
    from conformance.kept_outputs import SKIPPED_NOTE, summary_lines

    capped = Record(case_id="x/a", label=Label.MISMATCH,
                    message=f"off\n{SKIPPED_NOTE} 9.0 MiB is over --keep-outputs-cap (8.0 MiB)")
    refused = Record(case_id="x/b", label=Label.MISMATCH,
                     message=f"off\n{SKIPPED_NOTE} OSError: [Errno 28] No space left on device")
    assert summary_lines([capped, refused], tmp_path) == [
        f"{SKIPPED_NOTE} x/a (over --keep-outputs-cap)",
        f"{SKIPPED_NOTE} x/b (they could not be written)"]

    built = tmp_path / "kernel.so"
    built.write_text("x")

    def full(*_args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(executor, "file_case_artifacts", full)
    fake = SimpleNamespace(
        settings=SimpleNamespace(keep_artifacts=True, artifacts_dir=str(tmp_path / "a")),
        supervisor=SimpleNamespace(case_artifacts=lambda: [built], artifact_dir=tmp_path,
                                   case_log=lambda: "log"))
    record = executor.Executor._with_artifacts(
        fake, Record(case_id="x/c", label=Label.MISMATCH, message="1 row off"))
    assert record.label is Label.MISMATCH and record.artifacts is None
    assert record.message == ("1 row off\n(its compile artefacts were not kept: OSError: "
                              "[Errno 28] No space left on device)")
    assert not built.exists()  # the child's copies go either way


def test_a_fuzzing_run_goes_on_recording_after_a_case_not_judged():
    """After one, every later example went the shrinking path: run but never recorded (a
    review: 6 examples, 2 records)."""
    from types import SimpleNamespace

    from conformance import fuzz
    from conformance.fuzz_log import FuzzLog

    calls = []

    def record_case(case, record_id):
        calls.append(record_id)
        return _not_judged(record_id) if len(calls) == 2 else \
            Record(case_id=record_id, label=Label.PASS)

    config = SimpleNamespace(getoption=lambda *a: 0,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    runner = SimpleNamespace(record_case=record_case, options=SimpleNamespace(resume=None),
                             executor=SimpleNamespace(
                                 execute=lambda case: pytest.fail("an example ran unrecorded")))
    log = FuzzLog(config, runner)
    result = fuzz.search(log.execute, examples=6, seed=5)
    assert result.failure is None and len(calls) == 6 and len(log.recorded) == len(set(calls))
    assert all(cid.startswith("fuzz/") for cid in calls)


def test_a_record_with_no_start_just_before_it_takes_no_other_record_with_it(tmp_path,
                                                                             monkeypatch):
    """Fuzzing writes its minimal case's record with no started event: refused by the disk,
    it must not cut off the case recorded before it."""
    from records.events import RecordWriter, finished_ids

    writer = RecordWriter(tmp_path, "gw0")
    writer.started("x/a", {}, "gw0", "t1")
    writer.finished(Record(case_id="x/a", label=Label.PASS, finished_at="t2"))
    kept = (tmp_path / "records" / "gw0.jsonl").read_bytes()

    def full(_data):
        raise OSError(errno.ENOSPC, "No space left on device")

    _writes_through(writer, full, monkeypatch)
    with pytest.raises(OSError):
        writer.finished(Record(case_id="fuzz/x/b", label=Label.MISMATCH, finished_at="t3"))
    writer.close()
    assert (tmp_path / "records" / "gw0.jsonl").read_bytes() == kept
    assert finished_ids(tmp_path) == {"x/a"}



def test_a_case_whose_record_the_disk_refuses_fails_in_one_line():
    """It was a raw OSError traceback in the test's failure (an outside audit)."""
    from types import SimpleNamespace

    from conformance.runner import Runner

    def refused(_case):
        raise OSError(errno.ENOSPC, "No space left on device", "r/records/gw0.jsonl")

    with pytest.raises(pytest.fail.Exception) as raised:
        Runner.check(SimpleNamespace(record_case=refused), SMALL)
    assert str(raised.value) == (
        f"[not recorded] {SMALL.id}: its record could not be written ([Errno 28] No space "
        "left on device: 'r/records/gw0.jsonl'); the run's results say how to finish it "
        "(--resume runs this case)")
    assert raised.value.pytrace is False
