"""The Neuron backend's caches and compile stages against the stand-in of the Neuron SDK
(tests/standin_neuron): "cold" is served by no cache of any layer (a host-wide NEFF cache
filled by another job included), "warm" by its own; the cache counters count only once
metrics are enabled, as in [SRC]; the compile phase waits for the asynchronous neuronx-cc and
is split into the SDK's own stages, with the NEFF's size. The rest of the backend's tests are
in tests/test_backends_accel_neuron.py, whose fixtures and helpers these use.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.backends import neuron_sdk as sdk
from conformance.backends.base import WorkerSlot
from records.results import Label
from tests.standin_neuron import STANDIN_DIR
from tests.test_backends_accel_neuron import (ALIBI, CAUSAL, REPO, _compiles, _labels, _run,
                                              standin)

__all__ = ["standin"]  # the fixture, used by name below


def _fill_host_cache(cases, tmp_path) -> None:
    """Compile ``cases`` the way another job on the host would: the stand-in with the SDK's
    defaults (its NEFF cache is the host-wide one)."""
    script = (
        "import sys, json, torch, torch_neuronx\n"
        "from cases.model import Case\nfrom cases.inputs import make_inputs\n"
        "from cases.variants import build_mods\nfrom conformance import compat\n"
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "for spec in json.loads(sys.argv[1]):\n"
        "    case = Case.from_json(spec); torch._dynamo.reset()\n"
        "    x = make_inputs(case, 0); mods = build_mods(case.variant, case.shape, 'cpu')\n"
        "    mask = compat.block_mask(mods.mask_mod, None, None, case.shape.Sq, case.shape.Skv, 'cpu') if mods.mask_mod else None\n"
        "    compat.attention(torch.compile(flex_attention, backend='neuron', fullgraph=True, dynamic=False, options={'fallback_execution': False}), x.q, x.k, x.v, mods.score_mod, mask)\n"
        "    torch.neuron.synchronize()\n"
        "print(json.dumps(torch_neuronx._C._get_compilation_cache_stats()))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN_DIR), str(REPO)]),
               TORCH_NEURONX_METRICS_ENABLED="1")  # counted only when asked for [SRC]
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_DISABLE_CACHE"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps([c.to_json() for c in cases])],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["persistent_misses"] == len(cases)
    assert len(_neffs(tmp_path / "host" / "neff_cache")) == len(cases)


def _neffs(cache_dir: Path) -> list[Path]:
    """The NEFFs of a persistent cache, at <dir>/ab/cd/<key>.neff [SRC GetShardedPath]."""
    return [p for p in cache_dir.glob("*/*/*.neff")
            if p.parent.name == p.name[2:4] and p.parent.parent.name == p.name[:2]]


def _stand_in_script(script: str, tmp_path) -> list[str]:
    """The lines ``script`` prints in a fresh interpreter with the stand-in, its NEFF cache in
    ``tmp_path/neff`` and metrics as the script enables them."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN_DIR), str(REPO)]),
               TORCH_NEURONX_NEFF_CACHE_DIR=str(tmp_path / "neff"))
    env.pop("TORCH_NEURONX_METRICS_ENABLED", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_the_cache_counters_count_only_once_metrics_are_enabled(standin, tmp_path):
    """[SRC] the counters are TORCH_NEURONX_COUNTERs, off by default: a backend that did not
    enable them would read every case's cache as unknown, never as cold."""
    script = (
        "import json, torch, torch_neuronx\n"
        "f = lambda x: x.sin() + 1\n"
        "for turn in range(2):\n"
        "    torch._dynamo.reset(); torch_neuronx._C._clear_compilation_memory_cache()\n"
        "    torch.compile(f, backend='neuron', options={'fallback_execution': False})("
        "torch.ones(4))\n"
        "    torch.neuron.synchronize()\n"
        "    print(json.dumps(torch_neuronx._C._get_compilation_cache_stats()))\n"
        "    torch_neuronx._C._neuron_set_metrics_enabled(True)\n")
    off, on = (json.loads(line) for line in _stand_in_script(script, tmp_path)[-2:])
    assert off["cache_hits"] == off["cache_misses"] == 0  # compiled, and nothing counted
    assert (on["persistent_hits"], on["in_memory_misses"]) == (1, 1)  # served by the first
    assert len(_neffs(tmp_path / "neff")) == 1


@pytest.mark.slow
def test_cold_never_hits_a_cache_and_warm_uses_its_own(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_COMPILE_SECONDS", "0.3")
    _fill_host_cache([CAUSAL, ALIBI], tmp_path)  # what the old NEURON_COMPILE_CACHE_URL missed
    standin.unlink()
    monkeypatch.setenv(sdk.CORES_PER_WORKER_ENV, "2")
    monkeypatch.setenv(sdk.FALLBACK_ENV, "0")  # the caller's; the children never see it
    cold = _run([CAUSAL, ALIBI], tmp_path, slot=WorkerSlot(1, 2))
    assert _labels(cold) == [Label.PASS, Label.PASS], [r.message for r in cold]
    assert [r.cache_hit for r in cold] == [False, False]
    assert all(r.compile_breakdown["neuronx-cc"] >= 0.3 for r in cold)  # really compiled
    seen = [c["env"] for c in _compiles(standin)]
    assert len(seen) == 3 and len({c["pid"] for c in _compiles(standin)}) == 1  # one child
    for env in seen:  # warm-up and both cases: one child, its settings fixed at its start
        assert env["TORCH_NEURONX_NEFF_DISABLE_CACHE"] == "1"
        assert env[sdk.VISIBLE_CORES_ENV] == "2-3" and env[sdk.FALLBACK_ENV] == "1"
        assert env[sdk.AUTOCOPY_ENV] == "1" and "NEURON_COMPILE_CACHE_URL" not in env
    first_warm = _run([CAUSAL, ALIBI], tmp_path, compile_cache="warm")
    second_warm = _run([CAUSAL, ALIBI], tmp_path, compile_cache="warm")
    assert [r.cache_hit for r in first_warm] == [False, False]  # the host cache is not ours
    assert [r.cache_hit for r in second_warm] == [True, True]  # ours serves the next run
    assert all(r.compile_breakdown["neuronx-cc"] == 0 for r in second_warm)
    (release,) = (tmp_path / "warm" / "neff").iterdir()  # one compiler release, one directory
    assert len(_neffs(release)) == 3  # warm-up and two cases


def test_the_compile_phase_waits_for_the_async_compile_and_is_split_by_stage(standin, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_COMPILE_SECONDS", "0.4")
    records = _run([CAUSAL], tmp_path)
    (record,) = records
    assert record.label is Label.PASS, record.message
    stages = record.compile_breakdown
    assert set(stages) == {"fx_passes", "stablehlo_lowering", "neuronx-cc", "other"}
    # the stand-in's NEFF is "NEFF stand-in <20-digit key>": its size, from the cache entry
    assert record.compiled_bytes == len("NEFF stand-in ") + 20
    assert stages["neuronx-cc"] >= 0.4
    assert record.compile_seconds >= stages["neuronx-cc"]  # synchronize ran inside the phase
    assert sum(stages.values()) == pytest.approx(record.compile_seconds, abs=1e-5)


def test_a_backward_is_a_second_graph_compiled_by_neuronx_cc(standin, tmp_path):
    """[SRC] backend.py gives AOTAutograd no bw_compiler, so torch compiles the backward with
    the forward's compiler: a second NEFF, with its own metrics and cache entry; and each
    execution looks its NEFF up again, an in-memory hit (so the counters' hits are no
    cache_hit: conformance/backends/neuron_cache.py)."""
    script = (
        "import json, torch, torch_neuronx\n"
        "torch_neuronx._C._neuron_set_metrics_enabled(True)\n"
        "f = torch.compile(lambda a, b: (a.sin() * b).cos(), backend='neuron', fullgraph=True,"
        " options={'fallback_execution': False})\n"
        "x = torch.randn(8, requires_grad=True)\n"
        "f(x, x).sum().backward()\n"
        "graphs = [m.graph_id for m in torch_neuronx.get_dynamo_metrics()]\n"
        "entries = torch_neuronx._C._get_compilation_cache_entries()\n"
        "print(json.dumps([graphs, entries, torch_neuronx._C._get_compilation_cache_stats()]))\n")
    graphs, entries, stats = json.loads(_stand_in_script(script, tmp_path)[-1])
    assert len(set(graphs)) == 2 and {e["cache_key"] for e in entries} == set(graphs)
    assert all(e["compilation_time_ms"] > 0 for e in entries)  # both compiled, none from disk
    assert stats["total_compilations"] == 2 and stats["in_memory_hits"] == 2  # one per run
    assert len(_neffs(tmp_path / "neff")) == 2


def test_a_graph_an_earlier_case_left_in_memory_is_a_hit_that_compiled_nothing(standin, tmp_path,
                                                                               monkeypatch):
    """A warm child keeps its in-memory cache: a case whose graph an earlier case compiled is
    served from memory. [SRC metrics.py] still reports that graph's neuronx-cc time, the
    earlier compile's (its cache entry's); this case paid none of it (an outside review)."""
    monkeypatch.setenv("STANDIN_NEURON_COMPILE_SECONDS", "0.3")
    first, again = _run([CAUSAL, CAUSAL], tmp_path, compile_cache="warm")
    assert _labels([first, again]) == [Label.PASS, Label.PASS], [first.message, again.message]
    assert (first.cache_hit, again.cache_hit) == (False, True)
    assert first.compile_breakdown["neuronx-cc"] >= 0.3
    assert again.compile_breakdown["neuronx-cc"] == 0
