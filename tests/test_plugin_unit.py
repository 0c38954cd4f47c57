"""The plugin's small decisions: when it is active, and how a label becomes a pytest outcome."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.plugin import MATRIX_DIR, _case_ids, _reaches_matrix
from conformance.runner import outcome, worker_slot
from records.results import Label, Record

REPO = MATRIX_DIR.parent


def fake_config(*args: str, cwd: Path = REPO):
    return SimpleNamespace(args=list(args), invocation_params=SimpleNamespace(dir=cwd))


@pytest.mark.parametrize("args, active", [
    (["conformance/"], True), (["conformance"], True), ([str(MATRIX_DIR)], True),
    (["conformance/test_matrix.py::test_case"], True), (["."], True),
    (["tests"], False), (["tests/test_gate.py", "reports"], False),
])
def test_active_only_when_the_matrix_is_reached(args, active):
    assert _reaches_matrix(fake_config(*args)) is active


def test_active_from_another_directory():
    assert _reaches_matrix(fake_config("../conformance", cwd=REPO / "tests"))
    assert not _reaches_matrix(fake_config("test_gate.py", cwd=REPO / "tests"))


def test_case_ids_from_node_ids():
    ids = _case_ids(["conformance/test_matrix.py::test_case[causal/b1-h8x8-s128x128-d128/bf16/fwd]",
                     "tests/test_gate.py::test_x[a]"])
    assert ids == {"causal/b1-h8x8-s128x128-d128/bf16/fwd"}


def record(label: Label, message: str = "") -> Record:
    return Record("full/b1-h2x2-s64x64-d16/bf16/fwd", label, message=message,
                  compile_seconds=1.5, run_seconds=0.25)


def test_pass_passes_and_so_does_a_compiled_case_of_a_compile_only_pass():
    assert outcome(record(Label.PASS)) is None
    assert outcome(record(Label.COMPILED)) is None


def test_unsupported_skips_with_the_reason():
    with pytest.raises(pytest.skip.Exception, match=r"^\[UNSUPPORTED\] no backward on CPU$"):
        outcome(record(Label.UNSUPPORTED, "no backward on CPU"))


@pytest.mark.parametrize("label", [l for l in Label
                                   if l not in (Label.PASS, Label.UNSUPPORTED, Label.COMPILED)])
def test_every_other_label_fails_with_the_label_first(label):
    with pytest.raises(pytest.fail.Exception) as failed:
        outcome(record(label, "what happened\ntraceback line"))
    lines = str(failed.value).splitlines()
    assert lines[0] == f"[{label.value}] what happened"
    assert "compile 1.5 s, run 0.25 s" in lines[1] and "traceback line" in lines


def test_expected_failure_is_xfail():
    with pytest.raises(pytest.xfail.Exception, match=r"^\[MISMATCH\] known MISMATCH: bug 12"):
        outcome(record(Label.MISMATCH, "off"), "known MISMATCH: bug 12")


def test_worker_slots_from_xdist():
    assert worker_slot(None)[1] == "main"
    slot, name = worker_slot({"workerid": "gw3", "workercount": 8})
    assert (slot.index, slot.count, name) == (3, 8, "gw3")
    assert worker_slot({"workerid": "gw9", "workercount": 8})[0].index == 1  # a restarted worker
