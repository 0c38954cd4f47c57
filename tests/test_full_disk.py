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


def test_a_record_line_the_disk_refuses_half_way_is_cut_off_not_torn(tmp_path, monkeypatch):
    from records.events import RecordWriter, finished_ids, merge_records

    writer = RecordWriter(tmp_path, "gw0")
    writer.started("full/a", {}, "gw0", "t1")
    before = (tmp_path / "records" / "gw0.jsonl").read_bytes()
    real_write = writer._file.write

    def half_then_full(data):
        real_write(bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer, "_file", type("Full", (), {
        "write": staticmethod(half_then_full), "fileno": writer._file.fileno,
        "close": writer._file.close})())
    with pytest.raises(OSError):
        writer.finished(Record(case_id="full/a", label=Label.PASS, finished_at="t2"))
    writer.close()  # nothing held back: no second error
    assert (tmp_path / "records" / "gw0.jsonl").read_bytes() == before
    assert finished_ids(tmp_path) == set() and merge_records(tmp_path, ["full/a"]).damaged == 0


@pytest.mark.parametrize("label", [Label.COMPILE_ERROR, Label.RUNTIME_ERROR, Label.HARNESS_ERROR])
def test_an_error_a_full_disk_explains_is_not_judged(label):
    from conformance.decision import decide
    from conformance.protocol import Observation, Outcome, Phase

    outcome = {Label.COMPILE_ERROR: Outcome.ERROR, Label.RUNTIME_ERROR: Outcome.ERROR,
               Label.HARNESS_ERROR: Outcome.HARNESS}[label]
    phase = Phase.RUN if label is Label.RUNTIME_ERROR else Phase.COMPILE
    text = "LoweringException: OSError: [Errno 28] No space left on device: '/c/x.so'"
    decision = decide(SMALL, Observation(outcome, phase, message=text), None)
    assert decision.label is Label.HARNESS_ERROR
    assert decision.message.startswith("not judged: a disk was full (LoweringException: ")
    assert decision.metrics == {NOT_JUDGED_KEY: "disk full"}
    other = decide(SMALL, Observation(outcome, phase, message="LoweringException: x"), None)
    assert other.label is label and not other.metrics  # a compiler's own error stays its own


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
    line = [x for x in first.stdout.splitlines() if "not judged: a disk was full;" in x]
    assert len(line) == 1 and f"--resume {report}" in line[0], first.stdout[-3000:]
    full.unlink()  # room again
    resumed = run(pytest_args(tmp_path, backend, CASES[:2], "--resume", str(report)), env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    results = load_results(report / "results.json")
    assert results.complete and [r.label for r in results.records] == [Label.PASS, Label.PASS]
