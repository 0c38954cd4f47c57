"""The built-in CPU backends: flex_attention run eagerly, and compiled by Inductor.

``cpu-inductor`` compiles ``flex_attention`` with ``fullgraph=True`` (a graph break raises
instead of silently running part of the call eagerly) and ``dynamic=False`` (every case
compiles for its own static shape). The child resets Dynamo before each case, whatever the
backend (conformance/child.py; eager flex_attention traces its calls with Dynamo too), so a
reused child never turns a later case into a recompile of an earlier case's graph, and
cpu-inductor's ``begin_case`` in cold mode also clears Inductor's in-memory code caches (a new
cache directory alone is not enough: a kernel compiled earlier in the process would be loaded
from memory).
Inductor's CPU lowering of flex_attention raises rather than falling back to eager.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from cases.model import Case
from conformance import compat
from conformance.backends.base import AttentionFn, Backend, WorkerSlot, threads_per_worker
from conformance.backends.kept_builds import kept_warm_up_builds

#: A tiny case compiled once when a child starts: it pays the process's one-time compiler
#: start-up so that no case's compile seconds include it (CpuInductor.warm_up).
WARM_UP_SHAPE = (1, 1, 128, 16)  # B, H, S, D


class CpuEager(Backend):
    name = "cpu-eager"
    description = "flex_attention called eagerly on the CPU (unfused reference path of torch)"
    device_type = "cpu"
    compiled = False

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env.update(device="cpu", device_name=_cpu_name(), cpu_count=os.cpu_count())
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ""}  # never touch a GPU by accident

    def unsupported_reason(self, case: Case) -> str | None:
        # torch's own refusal, said before a child spends a compile on it (conformance/compat.py)
        return compat.known_cpu_refusal(case.mode, self.compiled)

    def warm_up(self) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        q, score_mod, block_mask = _warm_up_inputs()
        flex_attention(q, q, q, score_mod=score_mod, block_mask=block_mask)

    def prepare(self, case: Case) -> AttentionFn:
        from torch.nn.attention.flex_attention import flex_attention

        return case_call(flex_attention, case)


class CpuInductor(CpuEager):
    name = "cpu-inductor"
    description = "torch.compile(flex_attention, fullgraph=True, dynamic=False) on the CPU (Inductor)"
    compiled = True

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        env = super().child_env(slot, cache_dir)
        # Inductor's parallel compile pool would otherwise start one process per core in
        # every worker's child and oversubscribe the machine.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads_per_worker(slot))
        if cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        return env

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env["compiler"] = "inductor"
        env["cxx"] = _cxx_version()
        return env

    def warm_up(self) -> None:
        """Compiles a tiny case (bf16, a block mask and a score mod: the code paths the
        matrix's cases take) with every stage run in this process (no cache of whole graphs
        may serve it), so the process's one-time costs are paid here. Its C++ builds are
        kept between runs (conformance/backends/kept_builds.py): a child after the first on
        a machine starts in 5.7 s instead of 15.7 s (docs/performance.md). No case reads
        them: begin_case points each case at its own directory, and cold cases start from
        cleared in-memory caches."""
        q, score_mod, block_mask = _warm_up_inputs()
        with compat.graph_caches_off() as every_stage_runs, \
                kept_warm_up_builds(self.name, usable=every_stage_runs):
            torch_compile_flex()(q, q, q, score_mod=score_mod, block_mask=block_mask)

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        begin_inductor_case(cache_dir, cold)

    def prepare(self, case: Case) -> AttentionFn:
        return case_call(torch_compile_flex(), case)

    def cache_hit(self) -> bool | None:
        return inductor_cache_hit()

    def compile_breakdown(self) -> dict[str, float] | None:
        return compat.inductor_compile_stages("cxx_compile")


def begin_inductor_case(cache_dir: str | None, cold: bool) -> None:
    """An Inductor backend's begin_case (CPU and CUDA), after the child reset Dynamo: in cold
    mode Inductor's in-memory code caches cleared, its cache directory set to the case's, and
    the counters that cache_hit and compile_breakdown read started from zero."""
    from torch._dynamo.utils import counters

    if cold:
        compat.clear_inductor_caches()
    if cache_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    counters.clear()
    compat.clear_compile_metrics()


def case_call(flex: Callable, case: Case) -> AttentionFn:
    """``flex`` (flex_attention, eager or compiled) called as ``case`` needs: GQA enabled when
    Hq != Hkv, and the log-sum-exp asked for in ``fwd+lse`` mode (compat picks the API)."""
    gqa = case.shape.Hq != case.shape.Hkv
    lse = case.mode == "fwd+lse"

    def call(q, k, v, score_mod, block_mask):
        return compat.attention(flex, q, k, v, score_mod, block_mask, enable_gqa=gqa,
                                return_lse=lse)

    return call


def torch_compile_flex():
    """flex_attention compiled by Inductor for one static shape, graph breaks forbidden."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True, dynamic=False)


def _warm_up_inputs():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    b, h, s, d = WARM_UP_SHAPE
    q = torch.randn(b, h, s, d, dtype=torch.bfloat16)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def halve(score, b, h, q_idx, kv_idx):
        return score * 0.5

    return q, halve, create_block_mask(causal, None, None, s, s, device="cpu")


def inductor_cache_hit() -> bool | None:
    """Whether the last compile was served by Inductor's FX graph cache (None: no lookup)."""
    from torch._dynamo.utils import counters

    stats = counters["inductor"]
    if stats.get("fxgraph_cache_hit", 0):
        return True
    if stats.get("fxgraph_cache_miss", 0) or stats.get("fxgraph_cache_bypass", 0):
        return False
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cxx_version() -> str:
    import shutil
    import subprocess

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or ""
    if not cxx:
        return "none found"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0] if out.stdout else cxx
    except (OSError, subprocess.SubprocessError):
        return cxx
