"""A stand-in for the Neuron SDK's ``torch_neuronx``, used ONLY by the suite's tests.

It is never installed: tests put ``tests/standin_neuron`` on ``sys.path`` (and so on the
``PYTHONPATH`` of the children they start). It models the SDK as published, over the CPU;
each behaviour names its source (keys as in conformance/backends/neuron_sdk.py):

- importing it names PrivateUse1 ``neuron`` and registers ``torch.neuron`` with
  ``synchronize`` [SRC torch._register_device_module; SDK profiling guide], and a
  ``torch.compile`` backend named ``neuron`` [SRC entry point]. ``STANDIN_NEURON_NO_SYNC=1``
  registers neither (a build the suite cannot synchronize with);
- settings are read once per process, at the first compile: the debug directory (lru_cache
  in config.py) and the NEFF cache directories and switch (the C++ CompilationCache
  singleton) [SRC]; later changes to ``os.environ`` are not seen;
- artefacts go to ``$TORCH_NEURONX_DEBUG_DIR`` (default ``/tmp/neuron_backend`` [ENV]; the
  pre-2.33 [SRC] made ``/tmp/neuron_backend_<random>``, the documented default wins) in
  the published layout ``fx_graphs/``, ``stablehlo/``, ``raw/``, ``neff/`` (``proc_0/...``),
  and the directory is deleted after every compile unless
  ``TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1`` [ENV; SRC managed_artifacts_directory];
- NEFFs are cached in memory and in ``$TORCH_NEURONX_NEFF_CACHE_DIR``, whose default is the
  host-wide ``/tmp/neff_cache``, so a later run is served from it, each NEFF at
  ``<dir>/<key[:2]>/<key[2:4]>/<key>.neff`` [SRC PersistentCacheBackend::GetShardedPath];
  ``TORCH_NEURONX_NEFF_DISABLE_CACHE=1`` turns the persistent cache off [SRC code spelling].
  Tests move the host-wide default with ``STANDIN_NEURON_HOST_TMP`` (a stand-in-only knob, so
  they never write to the real /tmp/neff_cache);
- ``_C._get_compilation_cache_stats()`` counts in-memory and persistent hits and misses
  [SRC NeuronBindings.cpp], but only while metrics are enabled: off by default, on with
  ``TORCH_NEURONX_METRICS_ENABLED=1`` or ``_C._neuron_set_metrics_enabled(True)``
  [SRC NeuronMetrics.h TORCH_NEURONX_COUNTER, NeuronMetrics.cpp]. Every execution of a
  compiled graph counts an in-memory hit, a cold one's first too: it looks its NEFF up again
  [SRC execute_compiled_graph -> NeffDirectKernelExecution, "Forces a cache-lookup"
  (KernelExecution.h) -> GetOrCompileNeff; CompilationCache::CheckInMemoryCacheAndPending
  counts a pending compile as a hit]. ``_C._get_compilation_cache_entries()`` lists each
  cached NEFF's ``neff_size_bytes`` and ``compilation_time_ms``, 0 for one read from the
  persistent cache [SRC CheckCacheAndCoordinateWork: CacheEntry(..., milliseconds(0))];
  ``_C._clear_compilation_memory_cache()`` empties the in-memory one and zeroes its two
  counters [SRC CompilationCache::ClearInMemoryCache];
- ``device_count()``: the logical NeuronCores the process sees [SRC torch_neuronx/__init__.py];
  ``$STANDIN_NEURON_CORES`` (default 4, as the stand-in ``neuron-ls``: one Trainium2 chip at
  the default LNC=2 [SDK logical-neuroncore-config]);
- compilation is asynchronous: the first call queues neuronx-cc on a worker thread and returns;
  only ``synchronize`` waits for it [SRC _C.compile_graph on the CompilationWorker].
  ``STANDIN_NEURON_COMPILE_SECONDS`` is how long that stand-in neuronx-cc takes (from the
  process's ``STANDIN_NEURON_SLOW_FROM``-th real compile on, default the first);
- ``get_dynamo_metrics()`` lists per-graph fx-pass, lowering and neuronx-cc microseconds and
  synchronizes first; ``reset_dynamo_metrics()`` [SRC metrics.py]. The fx passes and the
  lowering are timed inside AOTAutograd's forward compiler, as [SRC backend.py] times them, so
  Dynamo's and AOTAutograd's own time is in no stage. [SRC backend.py] gives AOTAutograd no
  ``bw_compiler`` ("TODO (NF-24)"), so torch uses the forward compiler for the backward graph
  too (torch/_dynamo/backends/common.py): a backward is a second graph, with its own NEFF,
  metrics and cache lookups; each graph's neuronx-cc is queued when the graph is compiled
  (CompileGraph.compile -> _C.compile_graph);
- ``get_fallback_ops()`` / ``clear_op_tracking()`` [SRC __init__.py]; the ops named in
  ``STANDIN_NEURON_FALLBACK_OPS`` are reported as fallen back each time a graph runs;
- a compile failure (``STANDIN_NEURON_FAIL_COMPILE=1``) raises, in the words of [SRC]
  ErrorHandler.cpp's compilation error, when fallback execution is disabled
  (``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1``, or the ``fallback_execution`` compile
  option False, which overrides it [ENV]), and otherwise falls back to eager with a warning,
  as SDKs before 2.33 did by default: the trap the suite's guard closes. A simplification:
  the stand-in raises from the graph's compiler, before it runs; [SRC] queues neuronx-cc
  and falls back in the graph's execution wrapper, so the real failure surfaces at the first
  call or at synchronize. Either way it is inside the suite's compile phase;
- ``STANDIN_NEURON_EXEC_TIMEOUT_AT=N``: the N-th execution raises the runtime's timeout
  (NRT_TIMEOUT, status 5 [NRT]) in the words of [SRC] ErrorHandler.cpp's execution error;
- ``STANDIN_NEURON_REJECT_DEVICE=1`` makes flex_attention's device check treat the CPU (where
  the stand-in's tensors live) the way stock torch treats ``neuron`` [PT]: same function, same
  sentence. It lets the tests prove the bypass on real computation.

Every compile appends one JSON line to ``$STANDIN_NEURON_RECORD`` (when set) with what it saw.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
import types
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

#: [SRC] hard-codes this; the release is the wheel's metadata (here
#: tests/standin_neuron/torch_neuronx-2.13.3.0+standin.dist-info: torch-neuronx 2.13.3.0 of
#: Neuron 2.33 [RN], which pairs with torch 2.13).
__version__ = "0.1.0"
STANDIN = True

FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"


class NeuronCompileError(RuntimeError):
    """What the stand-in raises for a failed compile (fallback disabled)."""


# -- settings read once per process ---------------------------------------------------------
def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true")


def _host_tmp() -> str:
    return os.environ.get("STANDIN_NEURON_HOST_TMP") or "/tmp"


@lru_cache(maxsize=1)
def artifacts_directory() -> Path:
    configured = os.environ.get("TORCH_NEURONX_DEBUG_DIR")
    return Path(configured) if configured else Path(_host_tmp()) / "neuron_backend"


@dataclass(frozen=True)
class _CacheConfig:
    directory: Path
    local_directory: Path
    disabled: bool


@lru_cache(maxsize=1)
def _cache_config() -> _CacheConfig:
    return _CacheConfig(
        Path(os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR") or f"{_host_tmp()}/neff_cache"),
        Path(os.environ.get("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR") or f"{_host_tmp()}/local_cache"),
        _flag("TORCH_NEURONX_NEFF_DISABLE_CACHE"))


# -- the compilation cache and its counters --------------------------------------------------
_memory_cache: dict[str, bytes] = {}
_compile_ms: dict[str, int] = {}  # an in-memory entry's compilation_time_ms (0: read from disk)
_counters = {"in_memory_hits": 0, "in_memory_misses": 0, "persistent_hits": 0,
             "persistent_misses": 0, "total_compilations": 0}
_lock = threading.Lock()
#: [SRC NeuronMetrics.cpp InitMetricsEnabledFromEnv] reads it once, at the first count; here at
#: import, which is the same for a process that sets it before it starts
_metrics_enabled = os.environ.get("TORCH_NEURONX_METRICS_ENABLED", "") in (
    "1", "true", "TRUE", "yes", "YES")


def _count(name: str) -> None:
    """TORCH_NEURONX_COUNTER: counts only while metrics are enabled [SRC NeuronMetrics.h]."""
    if _metrics_enabled:
        _counters[name] += 1


def _get_compilation_cache_stats() -> dict:
    with _lock:
        stats = dict(_counters)
        stats["cache_hits"] = stats["in_memory_hits"] + stats["persistent_hits"]
        stats["cache_misses"] = stats["in_memory_misses"] + stats["persistent_misses"]
        stats["total_entries"] = len(_memory_cache)
    return stats


def _clear_compilation_memory_cache() -> None:
    """Not modelled: [SRC] ClearInMemoryCache also cancels pending compiles; here one still
    running puts its entry back. The suite synchronizes before it clears, so it never meets
    one."""
    with _lock:
        _memory_cache.clear()
        _compile_ms.clear()
        _counters["in_memory_hits"] = _counters["in_memory_misses"] = 0


def _get_compilation_cache_entries() -> list[dict]:
    with _lock:
        return [{"cache_key": key, "neff_size_bytes": len(blob),
                 "compilation_time_ms": _compile_ms.get(key, 0)}
                for key, blob in _memory_cache.items()]


def _neuron_set_metrics_enabled(enabled: bool) -> None:
    global _metrics_enabled
    _metrics_enabled = bool(enabled)


def device_count() -> int:
    return int(os.environ.get("STANDIN_NEURON_CORES", "4"))


_fallback_ops: list[str] = []


def _get_fallback_ops() -> list[str]:
    return list(_fallback_ops)


def get_fallback_ops() -> list:
    return _C._get_fallback_ops()


def clear_op_tracking() -> None:
    _fallback_ops.clear()


_C = types.SimpleNamespace(
    _get_compilation_cache_stats=_get_compilation_cache_stats,
    _clear_compilation_memory_cache=_clear_compilation_memory_cache,
    _get_compilation_cache_entries=_get_compilation_cache_entries,
    _neuron_set_metrics_enabled=_neuron_set_metrics_enabled,
    _get_fallback_ops=_get_fallback_ops,
)


# -- asynchronous compilation ----------------------------------------------------------------
_work: "queue.Queue[tuple]" = queue.Queue()


def _worker() -> None:
    while True:
        job, done = _work.get()
        try:
            job()
        finally:
            done.set()


threading.Thread(target=_worker, name="standin-compilation-worker", daemon=True).start()
_pending: list[threading.Event] = []


def synchronize(device=None) -> None:
    """Wait until every queued compilation (and execution) has finished."""
    while _pending:
        _pending.pop(0).wait()


def _submit(job) -> None:
    done = threading.Event()
    _pending.append(done)
    _work.put((job, done))


# -- metrics -------------------------------------------------------------------------------
@dataclass
class NeuronCompilationMetrics:
    graph_id: str
    graph_name: str = ""
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0


_metrics: list[NeuronCompilationMetrics] = []


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """[SRC metrics.py] a graph's neuronx-cc time is its cache entry's compilation_time_ms,
    filled in here, after synchronizing, while it is 0: the compile's own time, 0 for a NEFF
    read from disk, and for a graph an earlier compile left in memory, that compile's time."""
    synchronize()
    with _lock:
        for metrics in _metrics:
            if metrics.torch_neuronx_compile_us == 0:
                metrics.torch_neuronx_compile_us = _compile_ms.get(metrics.graph_id, 0) * 1000
    return list(_metrics)


def reset_dynamo_metrics() -> None:
    _metrics.clear()


# -- the compile backend -------------------------------------------------------------------
_executions = 0
_compilations = 0


@register_backend(name="neuron")
def neuron_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None):
    options = dict(options or {})
    fallback_disabled = (not options["fallback_execution"]) if "fallback_execution" in options \
        else _flag(FALLBACK_ENV)

    def graph_compiler(graph: torch.fx.GraphModule, inputs):
        """[SRC make_fw_compiler] one AOT graph, forward or backward: the fx passes and the
        lowering, timed here (the graph's text stands for both), then neuronx-cc, queued."""
        failing = os.environ.get("STANDIN_NEURON_FAIL_COMPILE") == "1"
        graph_text = graph.print_readable(print_output=False)
        shapes = repr([(tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", "")))
                       for x in inputs])
        key = hashlib.sha256((graph.code + shapes).encode()).hexdigest()[:20]
        artefacts = _write_artefacts(key, graph_text)
        _record(failing=failing, fallback_disabled=fallback_disabled, pid=os.getpid(), key=key,
                artefacts=artefacts, env={k: v for k, v in os.environ.items()
                                          if k.startswith(("NEURON_", "TORCH_NEURONX_"))})
        if failing:
            _cleanup_artefacts()
            # [SRC ErrorHandler::HandleCompilationError] names the op: compile_graph's is
            # CompileOnlyKernelExecution, "torch_compile" (KernelExecution.cpp)
            error = NeuronCompileError(
                "Compilation error occurred on Neuron for operation=torch_compile;\nerror "
                'message="COMPILATION FAILED: neuronx-cc (stand-in): injected failure"\n'
                "python stack trace=\n")
            if fallback_disabled:
                raise error
            warnings.warn(f"{error}; falling back to eager execution")
            return make_boxed_func(graph.forward)  # runs eagerly, as if nothing had failed
        metrics = NeuronCompilationMetrics(key, f"flex_{len(_metrics)}")
        start = time.perf_counter()
        graph.print_readable(print_output=False)
        metrics.torch_neuronx_fx_passes_us = int((time.perf_counter() - start) * 1e6)
        start = time.perf_counter()
        graph.recompile()
        metrics.torch_neuronx_lower_us = int((time.perf_counter() - start) * 1e6)
        _metrics.append(metrics)
        _submit(lambda: _neuronx_cc(key))
        _cleanup_artefacts()
        return make_boxed_func(_executor(key, graph.forward))

    # [SRC] no bw_compiler: AOTAutograd compiles the backward with the forward's compiler
    return aot_autograd(fw_compiler=graph_compiler)(gm, example_inputs)


def _executor(key: str, run):
    """A compiled graph's execution: its NEFF looked up again (queued behind its compile; an
    in-memory hit [SRC, see the module doc]), then run (here, eagerly on the CPU)."""
    def execute(*args):
        global _executions
        _submit(lambda: _lookup_for_execution(key))
        _executions += 1
        timeout_at = int(os.environ.get("STANDIN_NEURON_EXEC_TIMEOUT_AT", "0") or 0)
        if timeout_at and _executions >= timeout_at:
            raise RuntimeError(
                "NRT Execution error occurred on Neuron for operation=neuron_graph\nerror "
                f'message="NRT EXECUTION FAILED: Async execution error: seq_id={_executions}, '
                'Operation timed out"\npython stack trace=\n')
        _fallback_ops.extend(op for op in os.environ.get("STANDIN_NEURON_FALLBACK_OPS", "")
                             .split(",") if op)
        return run(*args)

    return execute


def _lookup_for_execution(key: str) -> None:
    with _lock:
        if key in _memory_cache:
            _count("in_memory_hits")


def _neuronx_cc(key: str) -> None:
    """The queued compile: served by the in-memory cache, then the persistent one, else it
    'compiles' (sleeps) and fills both."""
    config = _cache_config()
    neff = config.directory / key[:2] / key[2:4] / f"{key}.neff"
    with _lock:
        if key in _memory_cache:
            _count("in_memory_hits")
            return
        _count("in_memory_misses")
        if not config.disabled and neff.exists():
            _count("persistent_hits")
            _memory_cache[key] = neff.read_bytes()
            _compile_ms[key] = 0
            return
        if not config.disabled:  # [SRC CheckCacheAndCoordinateWork]: only a cache it has
            _count("persistent_misses")
    start = time.perf_counter()
    global _compilations
    _compilations += 1
    if _compilations >= int(os.environ.get("STANDIN_NEURON_SLOW_FROM", "1") or 1):
        time.sleep(float(os.environ.get("STANDIN_NEURON_COMPILE_SECONDS", "0") or 0))
    blob = f"NEFF stand-in {key}".encode()
    elapsed_ms = int((time.perf_counter() - start) * 1000)
    with _lock:
        _count("total_compilations")
        _memory_cache[key] = blob
        # a real neuronx-cc is a process of seconds; the stand-in's may take under a
        # millisecond, counted as 1 so that 0 keeps its meaning: read from the disk cache
        _compile_ms[key] = max(1, elapsed_ms)
    if not config.disabled:
        neff.parent.mkdir(parents=True, exist_ok=True)
        config.local_directory.mkdir(parents=True, exist_ok=True)
        neff.write_bytes(blob)


def _write_artefacts(key: str, graph_text: str) -> list[str]:
    root = artifacts_directory()
    stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{key[:8]}"
    files = {f"fx_graphs/proc_0/flex_{stamp}.fx.txt": graph_text,
             f"raw/proc_0/flex_{stamp}.torch_raw.mlir": f"// stand-in torch-mlir of {key}\n",
             f"stablehlo/proc_0/flex_{stamp}.stablehlo.mlir": f"// stand-in StableHLO of {key}\n",
             f"neff/proc_0/flex_{stamp}.neff": f"NEFF stand-in {key}\n"}
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(str(path))
    return written


def _cleanup_artefacts() -> None:
    if not _flag("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"):
        import shutil

        shutil.rmtree(artifacts_directory(), ignore_errors=True)


def _record(**entry) -> None:
    path = os.environ.get("STANDIN_NEURON_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


# -- the device ----------------------------------------------------------------------------
def _register_device() -> None:
    if os.environ.get("STANDIN_NEURON_NO_SYNC") == "1":
        return  # a build that registers neither torch.neuron nor an accelerator to sync
    if torch._C._get_privateuse1_backend_name() == "privateuseone":
        torch.utils.rename_privateuse1_backend("neuron")
    if not hasattr(torch, "neuron"):
        # no tensor can live on the stand-in's "neuron": it reports no device, so torch's
        # own machinery (Dynamo's device queries) leaves it alone; synchronize is what it
        # models. Not the SDK's: [SRC] neuron.py's is_available() is device_count() > 0, and
        # the suite asks torch_neuronx.device_count(), never these two
        torch._register_device_module("neuron", types.SimpleNamespace(
            synchronize=synchronize, is_available=lambda: False, device_count=lambda: 0,
            current_device=lambda: 0))


def _model_stock_device_check() -> None:
    """Stock torch's rejection of 'neuron' [PT], applied to the CPU the stand-in runs on."""
    from torch.nn.attention import flex_attention as module

    stock = module._validate_device

    def _validate_device(query, key, value):
        if query.device.type == "cpu":  # stock's own words for "neuron", which differ by release
            on_neuron = types.SimpleNamespace(device=types.SimpleNamespace(type="neuron"),
                                              requires_grad=False)
            try:
                stock(on_neuron, on_neuron, on_neuron)
            except ValueError as exc:
                raise ValueError(str(exc).replace("on neuron device", "on cpu device")) from None
        return stock(query, key, value)

    module._validate_device = _validate_device


_register_device()
if os.environ.get("STANDIN_NEURON_REJECT_DEVICE") == "1":
    _model_stock_device_check()
