"""The Neuron SDK's published rules as the backend applies them, without the stand-in: which
releases are usable, NeuronCores in their documented forms, the child's environment, and the
runtime's errors (timeouts, out of memory) and fallback tracking, each from its source
(conformance/backends/neuron_sdk.py: [RN], [SDK], [SRC]). The stand-in's end-to-end tests are in
tests/test_backends_accel_neuron.py.
"""
from __future__ import annotations

import pytest

from cases import variants
from cases.model import Case, Shape
from conformance.backends import neuron_sdk as sdk
from conformance.backends.base import WorkerSlot
from conformance.backends.neuron import Neuron

CAUSAL = Case(variants.causal(), Shape(1, 2, 2, 64, 64, 16), "fp32")


# -- the package -------------------------------------------------------------------------------
@pytest.mark.parametrize("probe, torch_version, expected", [
    (sdk.PackageProbe(True, version="2.14.3.0"), "2.13.0+cpu",
     "torch-neuronx 2.14.3.0 does not match torch 2.13.0+cpu (torch-neuronx 2.14 needs torch 2.14)"),
    (sdk.PackageProbe(True, version="2.1.2.2.3.0"), "2.1.2",
     "torch-neuronx 2.1.2.2.3.0 is older than the native backend the suite drives"),
    (sdk.PackageProbe(True, error="OSError: libnrt.so.1: cannot open shared object file"),
     "2.13.0", "torch_neuronx cannot be imported (OSError: libnrt.so.1: cannot open shared"),
])
def test_only_a_real_matching_release_is_available(probe, torch_version, expected):
    assert sdk.unavailable_reason(probe, torch_version).startswith(expected)


def test_matching_release_is_available():
    assert sdk.unavailable_reason(sdk.PackageProbe(True, version="2.13.3.0"), "2.13.0+cpu") is None
    assert sdk.unavailable_reason(sdk.PackageProbe(True, version="2.13.3.0", device_count=4),
                                  "2.13.0+cpu") is None


def test_a_release_without_neuroncores_is_unavailable(monkeypatch):
    monkeypatch.setenv(sdk.VISIBLE_CORES_ENV, "8-15")
    none = sdk.PackageProbe(True, version="2.13.3.0", device_count=0)
    assert sdk.unavailable_reason(none, "2.13.0").startswith(
        "torch_neuronx sees no NeuronCore here with NEURON_RT_VISIBLE_CORES='8-15' "
        "(torch_neuronx.device_count() is 0)")
    broken = sdk.PackageProbe(True, version="2.13.3.0",
                              device_count_error="RuntimeError: nrt_init failed\nmore")
    assert sdk.unavailable_reason(broken, "2.13.0").startswith(
        "torch_neuronx.device_count() failed with NEURON_RT_VISIBLE_CORES='8-15' "
        "(RuntimeError: nrt_init failed), so torch.neuron.is_available() is False")


def test_worker_slices_must_fit_the_cores_the_sdk_sees():
    sdk.check_core_budget(4, 2, 8, None)  # 8 of 8
    sdk.check_core_budget(4, 2, None, None)  # unknown: not checked
    sdk.check_core_budget(4, 2, 4, "0-7")  # the caller's own range is checked by its slices
    with pytest.raises(ValueError, match=r"^3 worker\(s\) of 2 NeuronCore\(s\) each need 6, "
                                         r"and torch_neuronx.device_count\(\) sees 4 here"):
        sdk.check_core_budget(3, 2, 4, " ")


# -- cores and the child's environment ---------------------------------------------------------
def test_cores_only_in_their_documented_forms():
    assert [sdk.cores_for_worker(i, 8, 1) for i in (0, 3, 7)] == ["0", "3", "7"]
    assert sdk.cores_for_worker(1, 4, 4) == "4-7"
    assert sdk.cores_for_worker(1, 2, 4, "8-15") == "12-15"  # from the caller's cores
    assert sdk.parse_cores("3") == [3] and sdk.parse_cores("0-3") == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"NEURON_RT_VISIBLE_CORES='0,2,4,6' is not one of its "
                                         r"documented forms, one index or an inclusive range"):
        sdk.parse_cores("0,2,4,6")
    with pytest.raises(ValueError, match=r"worker 2 of 3 needs NeuronCores 8\.\.11 of "
                                         r"NEURON_RT_VISIBLE_CORES='8-15'.*use fewer workers"):
        sdk.cores_for_worker(2, 3, 4, "8-15")
    with pytest.raises(ValueError, match="are not one index or one range"):
        sdk.format_cores([0, 2])


def test_child_env_forces_the_guards_and_keeps_settings_read_once_per_process(monkeypatch, tmp_path):
    monkeypatch.setenv(sdk.FALLBACK_ENV, "0")  # a caller who allows fallbacks does not get them
    monkeypatch.delenv(sdk.VISIBLE_CORES_ENV, raising=False)
    backend = Neuron(cores_per_worker=4)
    assert backend.child_env(WorkerSlot(1, 2), None) == {
        sdk.FALLBACK_ENV: "1", sdk.AUTOCOPY_ENV: "1", sdk.METRICS_ENV: "1",
        sdk.VISIBLE_CORES_ENV: "4-7"}
    cold = backend.process_cache_env(str(tmp_path), cold=True)
    assert cold["TORCH_NEURONX_NEFF_DISABLE_CACHE"] == cold["TORCH_NEURONX_DISABLE_NEFF_CACHE"] == "1"
    assert cold[sdk.NEFF_CACHE_DIR_ENV] == str(tmp_path / "neff")  # never /tmp/neff_cache
    warm = backend.process_cache_env(str(tmp_path), cold=False)
    assert warm["TORCH_NEURONX_NEFF_DISABLE_CACHE"] == "0"
    assert warm[sdk.NEFF_CACHE_DIR_ENV].startswith(str(tmp_path / "neff" / "release-"))
    assert warm[sdk.NEFF_LOCAL_CACHE_DIR_ENV] == str(tmp_path / "neff-local")
    assert backend.artifact_env("/x") == {"TORCH_NEURONX_DEBUG_DIR": "/x",
                                          "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS": "1"}
    assert "NEURON_COMPILE_CACHE_URL" not in {**cold, **warm}  # the XLA-era variable


def test_a_warm_run_keeps_each_compiler_releases_neffs_apart(monkeypatch, tmp_path):
    """[SRC] a NEFF's cache key does not name the compiler's release: one directory for all
    would serve a new neuronx-cc the old one's NEFFs (an outside review)."""
    backend = Neuron()
    releases = iter([{"torch_neuronx": "2.13.3.0", "neuronx_cc": "2.28.7631.0"},
                     {"torch_neuronx": "2.13.3.0", "neuronx_cc": "2.28.7631.0"},
                     {"torch_neuronx": "2.13.3.0", "neuronx_cc": "2.29.100.0"},
                     {"torch_neuronx": "2.13.4.0", "neuronx_cc": "2.28.7631.0"}])
    monkeypatch.setattr(backend, "_compiler_release", lambda: next(releases))
    dirs = [backend.process_cache_env(str(tmp_path), cold=False)[sdk.NEFF_CACHE_DIR_ENV]
            for _ in range(4)]
    assert dirs[0] == dirs[1] and len(set(dirs)) == 3


_STATS = {"in_memory_hits": 4, "in_memory_misses": 1, "persistent_hits": 0,
          "total_compilations": 1}


@pytest.mark.parametrize("graphs, entries, before, stats_after, expected", [
    # every execution counts an in-memory hit [SRC]: a cold first call's graphs, compiled
    (["fw", "bw"], [{"cache_key": "fw", "compilation_time_ms": 41_000},
                    {"cache_key": "bw", "compilation_time_ms": 93_000}], {"eager"},
     {**_STATS, "in_memory_hits": 7, "in_memory_misses": 3, "total_compilations": 3}, False),
    # the backward read from the disk cache (an entry of 0 ms): served, in part
    (["fw", "bw"], [{"cache_key": "fw", "compilation_time_ms": 41_000},
                    {"cache_key": "bw", "compilation_time_ms": 0}], set(), _STATS, True),
    # compiled by an earlier case of the same (warm) child: in memory before the first call
    (["fw"], [{"cache_key": "fw", "compilation_time_ms": 41_000}], {"fw"}, _STATS, True),
    # entries that do not name a graph: the counters, never their in-memory hits
    (["fw"], [], set(), {**_STATS, "in_memory_hits": 9, "total_compilations": 2}, False),
    (["fw"], None, None, {**_STATS, "persistent_hits": 1}, True),
    (["fw"], None, None, {**_STATS, "in_memory_hits": 9}, None),
    ([], None, None, None, None),
])
def test_a_cache_hit_is_a_graph_served_never_an_executions_lookup(graphs, entries, before,
                                                                  stats_after, expected):
    from conformance.backends.neuron_cache import served_from_cache

    assert served_from_cache(graphs, entries, before, _STATS, stats_after) is expected


def test_runtime_timeouts_are_recognised_in_the_runtimes_words():
    """[SRC] ErrorHandler.cpp: an execution error names its NRT status in words."""
    backend = Neuron()
    error = ('NRT Execution error occurred on Neuron for operation=aten::mm\nerror message="NRT '
             'EXECUTION FAILED: Async execution error: seq_id=12, Operation timed out"')
    assert backend.is_execution_timeout(RuntimeError(error))
    assert backend.is_execution_timeout(RuntimeError("nrt_execute returned NRT_TIMEOUT"))
    for other in ("Failed to allocate resource", "Software notification queue overflow",
                  "Execution completed with errors"):  # statuses 4, 1204, 1004
        assert not backend.is_execution_timeout(RuntimeError(error.replace(
            "Operation timed out", other)))


def test_an_execution_error_of_the_first_call_is_a_runtime_error():
    """[SRC] ErrorHandler.cpp: running a NEFF fails with "NRT Execution error occurred"; the
    first call's execution is asynchronous and surfaces at synchronize, in the compile phase,
    where any error was a COMPILE_ERROR. The timeout keeps its RUN_TIMEOUT, the OOM its
    OUT_OF_MEMORY, and a compiler's failure its COMPILE_ERROR."""
    from conformance.child import classify_exception
    from conformance.protocol import Observation, Outcome, Phase, label_of
    from records.labels import Label

    backend = Neuron()
    error = ('NRT Execution error occurred on Neuron for operation=aten::bmm\nerror message="NRT '
             'EXECUTION FAILED: {}"')
    cases = [(error.format("Execution completed with errors"), Label.RUNTIME_ERROR),
             (error.format("Async execution error: seq_id=3, Operation timed out"),
              Label.RUN_TIMEOUT),
             (error.format("Failed to allocate host memory"), Label.OUT_OF_MEMORY),
             ("Command failed (neuronx-cc compilation): exit status 70", Label.COMPILE_ERROR)]
    for text, label in cases:
        outcome = classify_exception(RuntimeError(text), backend)
        assert label_of(Observation(outcome, Phase.COMPILE, text)) is label, text
    wrapped = RuntimeError("backend='neuron' raised:")
    wrapped.__cause__ = RuntimeError(cases[0][0])
    assert classify_exception(wrapped, backend) is Outcome.EXEC_ERROR


def test_the_runtimes_out_of_memory_is_out_of_memory():
    """[SRC] NeuronCachingAllocator.cpp adds "(OOM)" when the device has no memory left
    (NRT_RESOURCE), and ErrorHandler.cpp words NRT_FAIL_HOST_MEM_ALLOC; neither says "out of
    memory". Another allocation failure stays an error."""
    from conformance.child import classify_exception
    from conformance.protocol import Outcome

    backend = Neuron()
    for text in ("NRT allocation failed for size 8589934592 (OOM)",
                 'NRT Execution error occurred on Neuron for operation=aten::mm\nerror '
                 'message="NRT EXECUTION FAILED: Failed to allocate host memory"'):
        assert classify_exception(RuntimeError(text), backend) is Outcome.OOM, text
    assert classify_exception(RuntimeError("NRT allocation failed for size 64"),
                              backend) is Outcome.ERROR


def test_ops_that_setup_ran_on_the_host_are_not_the_compiled_graphs(monkeypatch):
    """[SRC] get_fallback_ops() lists every eager op that fell back to the CPU, setup's too
    (the inputs and the block mask are made eagerly on the device before prepare): the check
    after the first call judges the compiled graph, so the tracking starts at setup's end.
    (The package's two functions as [SRC] has them, on a list: the stand-in registers its
    compile backend once per process and cannot be imported again here.)"""
    from types import SimpleNamespace

    from conformance.backends import neuron as neuron_module

    tracked = ["aten::nonzero"]  # an eager op of setup fell back
    package = SimpleNamespace(clear_op_tracking=tracked.clear,
                              get_fallback_ops=lambda: list(tracked))
    monkeypatch.setattr(neuron_module, "_import_torch_neuronx", lambda: package)
    backend = Neuron()
    monkeypatch.setattr(backend, "_compile", lambda: None)
    backend._sync = lambda: None
    backend.prepare(CAUSAL)
    assert backend.fallback_ops() == []
    tracked.append("aten::_safe_softmax")  # one of the call's: seen
    assert backend.fallback_ops() == ["aten::_safe_softmax"]


def test_cache_hit_counts_the_cases_graph_not_setups_eager_kernels(monkeypatch):
    """[SRC] setup's eager device ops compile through the same CompilationCache, and its
    counters are the ones cache_hit reads: counted from begin_case, a setup kernel served
    from the cache made a cold compile of the case's graph read as a hit. Counted from the
    end of prepare (after waiting for setup's queued work), only the first call counts. And
    of the first call, its compiles only: every execution counts an in-memory hit [SRC]."""
    from types import SimpleNamespace

    from conformance.backends import neuron

    stats = {"in_memory_hits": 0, "persistent_hits": 0, "total_compilations": 0}
    events = []
    fake = SimpleNamespace(_C=SimpleNamespace(_get_compilation_cache_stats=lambda: dict(stats),
                                              _clear_compilation_memory_cache=lambda: None),
                           reset_dynamo_metrics=lambda: None, clear_op_tracking=lambda: None)
    monkeypatch.setattr(neuron, "_import_torch_neuronx", lambda: fake)
    backend = Neuron()
    monkeypatch.setattr(backend, "_compile", lambda: object())
    backend._sync = lambda: events.append("synchronized")
    backend.begin_case(None, cold=True)
    stats["persistent_hits"] += 1  # setup: an eager kernel, from the cache
    backend.prepare(Case(variants.causal(), Shape(1, 1, 1, 128, 128, 16)))
    assert events == ["synchronized"]  # setup's queued work finished inside setup
    stats["total_compilations"] += 1  # the first call: the case's graph compiled cold,
    stats["in_memory_hits"] += 1  # and its execution looked it up
    assert backend.cache_hit() is False
    stats["persistent_hits"] += 1
    assert backend.cache_hit() is True


def test_compiled_bytes_sums_the_cases_neffs_and_is_unknown_when_one_is_not_found(monkeypatch):
    """[SRC] each graph's metrics carry its cache key (graph_id), and the cache entries each
    key's neff_size_bytes: the case's size is the sum over its graphs, never a guess."""
    from types import SimpleNamespace

    from conformance.backends import neuron

    graphs = [SimpleNamespace(graph_id="aa11"), SimpleNamespace(graph_id="bb22")]
    entries = [{"cache_key": "aa11", "neff_size_bytes": 1000},
               {"cache_key": "bb22", "neff_size_bytes": 24},
               {"cache_key": "cc33", "neff_size_bytes": 7}]  # another case's, still cached
    fake = SimpleNamespace(get_dynamo_metrics=lambda: list(graphs),
                           _C=SimpleNamespace(_get_compilation_cache_entries=lambda: entries))
    monkeypatch.setattr(neuron, "_import_torch_neuronx", lambda: fake)
    assert Neuron().compiled_bytes() == 1024
    graphs.append(SimpleNamespace(graph_id="dd44"))  # evicted, or never cached
    assert Neuron().compiled_bytes() is None
    graphs.clear()  # nothing compiled in this case
    assert Neuron().compiled_bytes() is None
    fake._C = SimpleNamespace()  # a release without the private API
    assert Neuron().compiled_bytes() is None
