"""The neuron backend, proven with the stand-in torch_neuronx of tests/standin_neuron.

Unit tests check availability, version capture, core pinning and the child environment. The
end-to-end tests run real supervised children through the Executor (as pytest workers do) with
the real Neuron backend code, its tensors on the CPU (or on ``meta``, a device type upstream
flex_attention rejects); the stand-in compile backend records what each compile saw.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import pytest
import torch

from cases import variants
from cases.model import Case, Shape
from conformance.backends.base import WorkerSlot
from conformance.backends.neuron import (CORES_PER_WORKER_ENV, FALLBACK_ENV, Neuron,
                                         cores_for_worker, parse_cores)
from conformance.backends.registry import BackendError, resolve_backend
from conformance.executor import Executor, Settings
from conformance.reference_cache import ReferenceCache
from reports.results import Label
from tests.standin_neuron import STANDIN_BIN, STANDIN_DIR

TINY = Shape(1, 2, 2, 64, 64, 16)
CAUSAL = Case(variants.causal(), TINY, "fp32")
ALIBI = Case(variants.alibi(), TINY, "fp32")


@pytest.fixture
def no_standin(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(STANDIN_DIR)])


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """The stand-in importable here and in children; its compile record at the returned path."""
    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("STANDIN_NEURON_RECORD", str(record))
    for name in (CORES_PER_WORKER_ENV, "NEURON_RT_VISIBLE_CORES", "STANDIN_NEURON_FAIL_COMPILE"):
        monkeypatch.delenv(name, raising=False)
    return record


def _compiles(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def _run(spec: str, cases, slot=WorkerSlot(0, 1), **settings):
    from conformance.backends.registry import load_backend

    executor = Executor(load_backend(spec), spec, slot,
                        Settings(compile_timeout=120.0, run_timeout=60.0, **settings),
                        ReferenceCache(None, 0), worker="test")
    try:
        return [executor.execute(case) for case in cases]
    finally:
        executor.close()


# -- availability, versions, environment ----------------------------------------------------
def test_unavailable_without_torch_neuronx_says_how_to_install(no_standin):
    availability = Neuron().availability()
    assert not availability.available
    assert availability.reason.startswith("torch_neuronx is not installed; install the Neuron SDK")
    assert "pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com" \
        in availability.reason
    with pytest.raises(BackendError, match="'neuron' is not available here: torch_neuronx is not"):
        resolve_backend("neuron")
    assert resolve_backend("auto").name != "neuron"  # auto skips it


def test_versions_captured_from_the_installed_packages(standin):
    assert Neuron().availability().available
    env = Neuron().environment()
    assert env["torch_neuronx"] == "2.13.0+standin"
    assert env["neuronx_cc"] == "2.21.0+standin"
    assert env["neuron_runtime"] == "2.27.23.0-standin"
    assert env["device"] == "neuron" and env["neuron_cores_per_worker"] == 1
    assert env["fallback_execution"] == f"disabled ({FALLBACK_ENV}=1)"


def test_versions_tolerate_absence(no_standin, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dpkg-query, no rpm
    env = Neuron().environment()
    assert env["torch_neuronx"] == "not installed" and env["neuronx_cc"] == "not installed"
    assert env["neuron_runtime"].startswith("unknown (aws-neuronx-runtime-lib not found")


def test_core_pinning_per_worker(monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    assert [cores_for_worker(WorkerSlot(i, 8), 1) for i in (0, 3, 7)] == ["0", "3", "7"]
    assert cores_for_worker(WorkerSlot(1, 4), 4) == "4-7"
    assert cores_for_worker(WorkerSlot(1, 2), 4, "8-15") == "12-15"  # from the caller's cores
    assert cores_for_worker(WorkerSlot(1, 2), 2, "0,2,4,6") == "4,6"
    assert parse_cores("0-3,8") == [0, 1, 2, 3, 8]
    with pytest.raises(ValueError, match=r"worker 2 of 3 needs NeuronCores 8\.\.11 of "
                                         r"NEURON_RT_VISIBLE_CORES='8-15'.*use fewer workers"):
        cores_for_worker(WorkerSlot(2, 3), 4, "8-15")
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES='0-x' is not a core list"):
        parse_cores("0-x")


def test_child_env_forces_the_fallback_guard_and_pins_cores(monkeypatch, tmp_path):
    monkeypatch.setenv(FALLBACK_ENV, "0")  # a caller who allows fallbacks does not get them
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    monkeypatch.setenv(CORES_PER_WORKER_ENV, "4")
    cold = Neuron().child_env(WorkerSlot(1, 2), None)
    assert cold == {FALLBACK_ENV: "1", "NEURON_RT_VISIBLE_CORES": "4-7"}
    warm = Neuron(cores_per_worker=2).child_env(WorkerSlot(1, 2), str(tmp_path))
    assert warm["NEURON_RT_VISIBLE_CORES"] == "2-3"
    assert warm["TORCH_NEURONX_DEBUG_DIR"] == str(tmp_path / "neuron-debug")
    assert warm["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "neuron-cache")
    monkeypatch.setenv(CORES_PER_WORKER_ENV, "two")
    with pytest.raises(ValueError, match="FLEXCONF_NEURON_CORES_PER_WORKER='two' is not a "
                                         "positive whole number"):
        Neuron().child_env(WorkerSlot(0, 1), None)


def test_prepare_refuses_to_run_with_fallback_allowed(standin, monkeypatch):
    from tests.standin_neuron import NeuronOnCpu

    monkeypatch.setenv(FALLBACK_ENV, "0")
    with pytest.raises(RuntimeError, match="TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION is '0' in "
                                           "the child; it must be 1"):
        NeuronOnCpu().prepare(CAUSAL)


def test_without_the_guard_a_failed_compile_passes_silently(standin, monkeypatch):
    """The trap the guard closes: the stand-in, like older SDKs, falls back to eager."""
    import torch_neuronx
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setenv("STANDIN_NEURON_FAIL_COMPILE", "1")
    monkeypatch.delenv(FALLBACK_ENV, raising=False)
    q = torch.randn(1, 2, 64, 16)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(flex_attention, backend="neuron", fullgraph=True)(q, q, q)
    torch._dynamo.reset()
    torch.testing.assert_close(out, flex_attention(q, q, q))  # right numbers, nothing compiled
    assert any("falling back to eager" in str(w.message) for w in caught)
    assert torch_neuronx.STANDIN and _compiles(standin)[0]["failing"]


# -- end to end: supervised children ----------------------------------------------------------
def test_cold_run_pins_cores_forces_the_guard_and_gives_each_case_its_dirs(standin, monkeypatch):
    monkeypatch.setenv(FALLBACK_ENV, "0")
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", "/var/tmp/neuron-compile-cache")  # caller's
    monkeypatch.setenv(CORES_PER_WORKER_ENV, "2")
    records = _run("tests.standin_neuron:NeuronOnCpu", [CAUSAL, ALIBI], slot=WorkerSlot(1, 2))
    assert [r.label for r in records] == [Label.PASS, Label.PASS], [r.message for r in records]
    assert all(r.compile_seconds is not None and r.run_seconds is not None for r in records)
    warm_up, *compiles = _compiles(standin)  # the child's warm-up compile, then the cases'
    assert "compile-cache-warm-up" in warm_up["env"]["TORCH_NEURONX_DEBUG_DIR"]
    assert len(compiles) == 2 and len({c["pid"] for c in [warm_up, *compiles]}) == 1  # one child
    for seen in [warm_up, *compiles]:
        assert seen["env"]["NEURON_RT_VISIBLE_CORES"] == "2-3"
        assert seen["env"][FALLBACK_ENV] == "1" and seen["fallback_disabled"]
        assert seen["env"]["NEURON_COMPILE_CACHE_URL"] != "/var/tmp/neuron-compile-cache"
        assert len(seen["artefacts"]) == 2  # one in the debug dir, one in the cache
    debug_dirs = [c["env"]["TORCH_NEURONX_DEBUG_DIR"] for c in compiles]
    cache_dirs = [c["env"]["NEURON_COMPILE_CACHE_URL"] for c in compiles]
    assert len(set(debug_dirs)) == 2 and len(set(cache_dirs)) == 2  # per case when cold
    assert not any(os.path.exists(d) for d in debug_dirs)  # and removed after the case


def test_warm_run_shares_the_dirs(standin, tmp_path):
    warm = tmp_path / "warm"
    records = _run("tests.standin_neuron:NeuronOnCpu", [CAUSAL, ALIBI],
                   compile_cache="warm", warm_cache_dir=str(warm))
    assert [r.label for r in records] == [Label.PASS, Label.PASS], [r.message for r in records]
    compiles = _compiles(standin)
    assert {c["env"]["TORCH_NEURONX_DEBUG_DIR"] for c in compiles} == {str(warm / "neuron-debug")}
    assert {c["env"]["NEURON_COMPILE_CACHE_URL"] for c in compiles} == {str(warm / "neuron-cache")}
    assert len(compiles) == 3  # warm-up and two cases
    assert len(list((warm / "neuron-cache").iterdir())) == 3  # every compile kept


def test_failed_compile_is_a_compile_error_even_if_the_caller_allows_fallback(standin, monkeypatch):
    monkeypatch.setenv(FALLBACK_ENV, "0")
    monkeypatch.setenv("STANDIN_NEURON_FAIL_COMPILE", "1")
    (record,) = _run("tests.standin_neuron:NeuronOnCpu", [CAUSAL])
    assert record.label is Label.COMPILE_ERROR, record.message
    assert "neuronx-cc (stand-in) failed to compile the graph: injected failure" in record.message


def test_rejected_device_is_unsupported_with_the_exact_message(standin):
    q = torch.randn(1, 1, 16, 16, device="meta")
    with pytest.raises(ValueError) as upstream:
        from torch.nn.attention.flex_attention import flex_attention

        flex_attention(q, q, q)
    (record,) = _run("tests.standin_neuron:NeuronOnRejectedDevice", [CAUSAL])
    assert record.label is Label.UNSUPPORTED
    assert record.message == f"ValueError: {upstream.value}"
    assert _compiles(standin) == []  # rejected before any compile
