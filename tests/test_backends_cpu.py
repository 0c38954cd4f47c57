"""The built-in CPU backends on real computation (tiny shapes), through the executor."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cases.catalog import CORE_VARIANTS
from cases.model import Case, Shape
from conformance.backends.base import WorkerSlot
from conformance.backends.registry import load_backend
from conformance.executor import Executor, Settings
from conformance.reference_cache import ReferenceCache
from records.results import Label

SEQ = 128
SHAPE = Shape(1, 2, 2, SEQ, SEQ, 16)
#: the eight core variants on a tiny shape (length parameters scaled as in the smoke profile)
CORE_TINY = [Case(make(SEQ, 8), SHAPE) for _, make in CORE_VARIANTS]


def execute(spec: str, cases, seeds=None, **settings):
    """The records of ``cases`` on ``spec`` through one executor; with ``seeds``, every case on
    each seed in turn, through the same executor and child (as one worker runs one case after
    another: the seed is read per case), so the child starts once, not once per seed."""
    executor = Executor(load_backend(spec), spec, WorkerSlot(0, 1), Settings(**settings),
                        ReferenceCache(None, 0), worker="test")
    try:
        if seeds is None:
            return [executor.execute(case) for case in cases]
        records = []
        for seed in seeds:
            executor.settings = replace(executor.settings, seed=seed)
            records += [executor.execute(case) for case in cases]
        return records
    finally:
        executor.close()


@pytest.mark.slow
def test_cpu_eager_passes_every_core_variant():
    records = execute("cpu-eager", CORE_TINY)
    assert [(r.case_id, r.label) for r in records] == [(c.id, Label.PASS) for c in CORE_TINY], \
        [r.message for r in records if r.label is not Label.PASS]
    assert all(r.cache_hit is None for r in records)  # no compiler, no cache to tell about


def test_no_case_is_a_recompile_of_an_earlier_cases_graph(tmp_path):
    """Eager flex_attention traces its calls with Dynamo: the child forgets the graphs of a
    child's earlier cases before each case, whatever the backend (cpu-eager's begin_case, as a
    plugin's may, resets nothing), so each case's first call is traced for its own shape and
    captured floats (torch 2.15.0 fails the recompile of an eager call whose score mod's
    captured float changed, docs/findings.md, finding 10: a soft-cap case's label hung on the
    case before it). Dynamo is told to raise on any recompile, and three cases run through the
    child's own path in one process: two soft-caps whose cap differs, then another shape."""
    import torch

    from cases.variants import softcap
    from conformance.child import run_case
    from conformance.protocol import CaseRequest, DoneEvent, load_output

    backend = load_backend("cpu-eager")
    outputs = []
    with torch._dynamo.config.patch(error_on_recompile=True):
        backend.warm_up()
        for n, case in enumerate((Case(softcap(50.0), SHAPE), Case(softcap(20.0), SHAPE),
                                  Case(softcap(20.0), replace(SHAPE, Sq=64, Skv=64)))):
            events = []
            run_case(backend, CaseRequest(case.to_json(), str(tmp_path / f"{n}.pt"), cold=False),
                     events.append)
            assert isinstance(events[-1], DoneEvent), (case.id, events[-1])
            results = load_output(events[-1].output_path)
            assert results.calls == 4 and not results.differing  # its first call and 3 timed
            outputs.append(results.first.out)
    assert not torch.equal(outputs[0], outputs[1])  # the caps were two, and both were used


@pytest.mark.slow
def test_cpu_inductor_compiles_cold_and_hits_a_warm_cache(tmp_path, monkeypatch):
    """Also: a child's warm-up builds are kept between children (conformance/backends/
    kept_builds.py): the first child on this (fresh) cache root publishes them once its
    warm-up succeeded, the second leaves them as they were, and neither serves a case."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))  # the children read it
    alibi, document = CORE_TINY[5], CORE_TINY[4]
    cold, = execute("cpu-inductor", [alibi])
    warm_up_builds = _built_objects(tmp_path / "cache-home")
    assert warm_up_builds, "the first child's warm-up published no build to keep"
    assert cold.label is Label.PASS, cold.message
    assert cold.cache_hit is False  # Inductor looked the graph up and compiled it
    # compile anatomy from torch's own timers: the stages sum to the compile phase
    stages = cold.compile_breakdown
    assert list(stages) == ["dynamo_tracing", "aot_autograd", "inductor_lowering",
                            "inductor_codegen", "cxx_compile", "other"], stages
    assert abs(sum(stages.values()) - cold.compile_seconds) <= 0.02 * cold.compile_seconds + 1e-3
    assert stages["inductor_lowering"] > 0 and stages["dynamo_tracing"] > 0
    assert stages["other"] < cold.compile_seconds / 2  # the named stages are most of it
    first, second = execute("cpu-inductor", [document, document], compile_cache="warm",
                            warm_cache_dir=str(tmp_path / "inductor-cache"))
    assert (first.label, second.label) == (Label.PASS, Label.PASS), (first.message, second.message)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    # the kept builds are as the first child published them, no private build directory is
    # left; no whole graph was cached there (every stage ran in the child), and the cold
    # case's kernel was built anew
    assert _built_objects(tmp_path / "cache-home") == warm_up_builds
    kept, = (tmp_path / "cache-home").glob("flexattention-conformance/warm-up/cpu-inductor/*")
    assert kept.name.startswith("torch-") and not list(kept.rglob("fxgraph"))
    assert stages["cxx_compile"] > 0


def _built_objects(root) -> dict[str, int]:
    """The shared objects under ``root``, by path, with their modification times."""
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*.so")}


@pytest.mark.slow
def test_cpu_inductor_with_a_too_small_compile_budget_times_out():
    record, = execute("cpu-inductor", [CORE_TINY[7]], compile_timeout=0.5)
    assert record.label is Label.COMPILE_TIMEOUT, record.message
    assert record.message.startswith("the compile phase did not finish within 0.5 s")
    assert record.compile_seconds >= 0.5
