"""Python's garbage collector in a run's processes (conformance/process_gc.py): paused while
they import torch and warm up, what the imports made frozen, and on for every case."""
from __future__ import annotations

import gc

from cases.model import Case, Shape, Variant
from conformance.process_gc import gc_paused, imported_for_good, warming_up
from records.results import Label
from tests.test_backends_cpu import execute


def test_the_pause_leaves_the_collector_as_it_found_it():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        gc.disable()  # a caller that turned it off keeps it off
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    try:
        with gc_paused():
            raise KeyError("raised in the block")
    except KeyError:
        pass
    assert gc.isenabled()


def test_in_a_process_that_had_torch_already_nothing_is_frozen():
    """A pytest.main() inside a process that had imported torch: freezing there would keep
    that process's garbage of before for good."""
    frozen = gc.get_freeze_count()
    with imported_for_good():
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_what_a_warm_up_leaves_is_collected_and_not_frozen():
    class Cycle:
        def __init__(self):
            self.me = self

    frozen = gc.get_freeze_count()
    with warming_up():
        assert not gc.isenabled()
        Cycle()  # unreachable at once, freed only by a collection
        alive = Cycle()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert not any(type(o) is Cycle and o is not alive for o in gc.get_objects())
    assert gc.is_tracked(alive)  # still the collector's to free when it is dropped


def test_a_childs_cases_run_with_the_collector_on_and_its_imports_frozen(tmp_path, monkeypatch):
    """The child pauses the collector for its imports and warm-up only: a case's phases are
    measured with it on, as in a user's process, and what its imports made is frozen."""
    log = tmp_path / "gc.log"
    monkeypatch.setenv("FLEXCONF_TEST_GC_LOG", str(log))  # the child inherits it
    tiny = Shape(1, 2, 2, 64, 64, 16)
    cases = [Case(Variant("causal"), tiny), Case(Variant("alibi"), tiny)]
    records = execute("tests.contract_fault_backends:LogsTheCollector", cases)
    assert [r.label for r in records] == [Label.PASS, Label.PASS], [r.message for r in records]
    lines = [line.split() for line in log.read_text().splitlines()]
    ours = [line for line in lines if line[0] in {c.id for c in cases}]
    # each case prepared once, then its first call and three timed calls
    assert [(case_id, when) for case_id, when, _, _ in ours] == [
        (c.id, when) for c in cases for when in ("prepare", "call", "call", "call", "call")]
    assert all(enabled == "True" for _, _, enabled, _ in ours), ours
    assert all(int(frozen) > 100_000 for _, _, _, frozen in ours), ours  # torch's own objects
