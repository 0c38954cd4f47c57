"""The Trainium backend: flex_attention compiled by the Neuron SDK's native PyTorch backend.

Written against the SDK as published (torch-neuronx 2.13/2.14, Neuron 2.33; the facts and
their sources are in conformance/backends/neuron_sdk.py and docs/backends.md): tensors on
device ``neuron``; ``torch.compile(fn, backend="neuron", fullgraph=True)``; Dynamo,
AOTAutograd, StableHLO, neuronx-cc, NEFF. Tested here with the stand-in package of
``tests/standin_neuron``, which models that published behaviour; no Trainium host has run it.

What the suite makes sure of:
- It runs at all: stock flex_attention rejects device ``neuron``; unless
  ``--neuron-device-check strict``, that one check is lifted for ``neuron`` in the child, as the
  SDK's own examples do, and the environment says so (conformance/backends/device_check.py).
- No failure passes as compiled: fallback execution is disabled (environment and compile
  option), Dynamo's ``suppress_errors`` is off, ``fullgraph=True``; CPU tensors are never
  copied to the device silently; any op the SDK reports as fallen back to the CPU fails the case.
- "Cold" means cold: the NEFF cache, read once per process, is disabled in the children of a
  cold run (each child with a directory of its own) and the in-memory cache is cleared before
  each case; a warm run shares one cache per compiler release under the suite's cache
  directory, never the host-wide /tmp/neff_cache. ``cache_hit`` comes from the case's graphs
  in the cache's entries, else its counters, never from the hits each execution counts
  (conformance/backends/neuron_cache.py).
- Times mean something: compilation and execution are asynchronous until
  ``torch.neuron.synchronize()``; a child that cannot synchronize refuses to run cases.
- Compile artefacts are preserved, one debug directory per child (read once per process),
  and filed under the report directory for failed cases; the compile phase is split into the
  SDK's own stages (``get_dynamo_metrics``).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from cases.model import Case
from conformance import compat
from conformance.backends import device_check
from conformance.backends import neuron_cache
from conformance.backends import neuron_sdk as sdk
from conformance.backends.base import (AttentionFn, Availability, Backend, FatalSetupError,
                                       WorkerSlot)

WARM_UP_SHAPE = (1, 1, 128, 16)  # B, H, S, D of the child's one warm-up compile
#: compile_breakdown stage -> field of torch_neuronx's NeuronCompilationMetrics (microseconds)
STAGES = {"fx_passes": "torch_neuronx_fx_passes_us", "stablehlo_lowering": "torch_neuronx_lower_us",
          "neuronx-cc": "torch_neuronx_compile_us"}


class Neuron(Backend):
    name = "neuron"
    description = ("torch.compile(flex_attention, backend='neuron', fullgraph=True) on Trainium "
                   "NeuronCores (torch-neuronx native backend, neuronx-cc)")
    device_type = "neuron"
    compiled = True
    #: the torch device module whose synchronize waits for queued compiles and executions
    sync_module = "neuron"

    def __init__(self, cores_per_worker: int | None = None, device_check_mode: str | None = None):
        """None: ``$FLEXCONF_NEURON_CORES_PER_WORKER`` (default 1) and
        ``$FLEXCONF_NEURON_DEVICE_CHECK`` (default bypass), as the plugin sets them."""
        self._cores_per_worker = cores_per_worker
        self._device_check_mode = device_check_mode
        self._sync: Callable[[], None] | None = None
        self._stats_before: dict | None = None
        self._keys_before: set[str] | None = None  # the NEFF cache's keys before a first call

    @property
    def cores_per_worker(self) -> int:
        if self._cores_per_worker is not None:
            return _positive(self._cores_per_worker, "cores_per_worker")
        return _positive(os.environ.get(sdk.CORES_PER_WORKER_ENV, "1"), sdk.CORES_PER_WORKER_ENV)

    @property
    def device_check_mode(self) -> str:
        return self._device_check_mode or os.environ.get(sdk.DEVICE_CHECK_ENV, "bypass")

    # -- parent ---------------------------------------------------------------------------
    def availability(self) -> Availability:
        import torch

        reason = sdk.unavailable_reason(sdk.probe_package(self.device_type), torch.__version__)
        return Availability(reason is None, reason or "")

    def check_worker_count(self, count: int) -> None:
        allowed = os.environ.get(sdk.VISIBLE_CORES_ENV)
        for index in range(count):
            sdk.cores_for_worker(index, count, self.cores_per_worker, allowed)
        sdk.check_core_budget(count, self.cores_per_worker,
                              sdk.probe_package(self.device_type).device_count, allowed)

    def environment(self) -> dict[str, Any]:
        import torch

        env = super().environment()
        found = sdk.probe_package(self.device_type)
        apis = found.apis
        usable = found.found and not found.error
        absent = "torch_neuronx is not installed" if not found.found else \
            "torch_neuronx cannot be imported"
        # what the child will meet: the check as it stands once torch_neuronx is imported
        seen = (device_check.Probe(*found.device_check) if found.device_check
                else device_check.probe(self.device_type))
        _, check = device_check.decision(self.device_type, self.device_check_mode, seen,
                                         torch.__version__)
        logical = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
        visible = os.environ.get(sdk.VISIBLE_CORES_ENV)
        env.update({
            "device": self.device_type, "device_name": sdk.instance_type(),
            "compiler": "neuronx-cc (torch-neuronx native backend)",
            **self._compiler_release(),
            "warm_neff_cache": (f"{self._warm_neff_dir()} under the warm compile cache: one "
                                "directory per torch-neuronx and neuronx-cc release (a NEFF's "
                                "key does not name them)"),
            "neuron_runtime": sdk.runtime_version(), "neuron_driver": sdk.driver_version(),
            "neuron_ls": sdk.tool_output(["neuron-ls"], lines=6),
            "device_check": check,
            "neuron_cores_per_worker": self.cores_per_worker,
            "neuron_device_count": (
                f"{found.device_count} (torch_neuronx.device_count(), logical NeuronCores)"
                if found.device_count is not None else
                f"unknown ({found.device_count_error or 'torch_neuronx has no device_count'})"
                if usable else f"unknown ({absent})"),
            "neuron_core_indices": ("logical NeuronCores (NEURON_LOGICAL_NC_CONFIG="
                                    f"{logical or 'default: 2 on Trn2'})"),
            "fallback_execution": f"disabled ({sdk.FALLBACK_ENV}=1, fallback_execution=False)",
            "cache_hit_source": _cache_hit_source(apis),
            "cold_memory_cache": (
                "cleared before each cold case (torch_neuronx._C._clear_compilation_memory_cache)"
                if apis.get("clear_memory_cache") else
                "not cleared: _clear_compilation_memory_cache is absent, so a graph compiled "
                "earlier in the same child could serve a cold case from memory"
                if usable else f"unknown ({absent})"),
            "compile_breakdown_source": ("torch_neuronx.get_dynamo_metrics()"
                                         if apis.get("get_dynamo_metrics") else
                                         "none: get_dynamo_metrics is absent"),
            "compiled_bytes_source": (
                "torch_neuronx._C._get_compilation_cache_entries (neff_size_bytes; a private "
                "API)" if apis.get("cache_entries") else
                "none: the cache entries API is absent, NEFF sizes are unknown"),
            "fallback_ops_check": ("torch_neuronx.get_fallback_ops()"
                                   if apis.get("get_fallback_ops") else
                                   "none: get_fallback_ops is absent, fallbacks cannot be seen"),
        })
        env.update({name: os.environ.get(name) or unset for name, unset in sdk.RECORDED_ENV.items()})
        env[sdk.VISIBLE_CORES_ENV] = (
            f"{visible or 'not set'} in the suite's environment; each worker's child is pinned "
            f"to its own {self.cores_per_worker} core(s) of "
            f"{'that range' if visible else 'the cores from 0 up'}, in worker order")
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        return {sdk.FALLBACK_ENV: "1", sdk.AUTOCOPY_ENV: "1", sdk.METRICS_ENV: "1",
                sdk.VISIBLE_CORES_ENV: sdk.cores_for_worker(
                    slot.index, slot.count, self.cores_per_worker,
                    os.environ.get(sdk.VISIBLE_CORES_ENV))}

    def process_cache_env(self, cache_dir: str, cold: bool) -> dict[str, str]:
        # the NEFF cache is configured once per process: a cold child may use none at all; a
        # warm run keeps one directory per compiler release, as NEFFs' keys do not say it
        env = {sdk.NEFF_CACHE_DIR_ENV: os.path.join(cache_dir, "neff" if cold
                                                    else self._warm_neff_dir()),
               sdk.NEFF_LOCAL_CACHE_DIR_ENV: os.path.join(cache_dir, "neff-local")}
        env.update({name: "1" if cold else "0" for name in sdk.NEFF_DISABLE_CACHE_ENVS})
        return env

    def _warm_neff_dir(self) -> str:
        """``neff/release-<digest>``: a warm run's NEFFs, relative to its cache directory."""
        return os.path.join("neff", neuron_cache.warm_neff_dir_name(self._compiler_release()))

    def _compiler_release(self) -> dict[str, str]:
        """The torch-neuronx and neuronx-cc releases, as environment() records them (and a
        warm run's NEFF directory is named after), each asked once per process."""
        found = sdk.probe_package(self.device_type)
        return {"torch_neuronx": found.version or ("not installed" if not found.found else
                                                   f"unknown ({found.error})"),
                "neuronx_cc": sdk.compiler_version()}

    def artifact_env(self, directory: str) -> dict[str, str]:
        return {sdk.DEBUG_DIR_ENV: directory, sdk.PRESERVE_ENV: "1"}

    # -- child ----------------------------------------------------------------------------
    def device(self) -> str:
        torch_neuronx = _import_torch_neuronx()
        device_check.apply(self.device_type, self.device_check_mode)
        set_metrics = getattr(getattr(torch_neuronx, "_C", None), "_neuron_set_metrics_enabled", None)
        if set_metrics is not None:  # [SRC] the cache counters count only while metrics are on
            set_metrics(True)  # (as child_env's METRICS_ENV does; either is enough)
        return self.device_type

    def warm_up(self) -> None:
        import torch

        try:
            self.device()
        except RuntimeError as exc:
            raise FatalSetupError(str(exc)) from None
        self._sync = _synchronizer(self.sync_module)
        # One tiny compile and run: the runtime on this child's cores and the compiler's
        # one-time start-up are paid here, not by the first case.
        q = torch.randn(*WARM_UP_SHAPE, device=self.device_type)
        compat.validate_device(q, q, q)
        self._compile()(q, q, q)
        self.synchronize()

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        # the child has reset Dynamo just before: every case compiles for its own static shape
        torch_neuronx = _import_torch_neuronx()
        _call_if_present(torch_neuronx, "reset_dynamo_metrics")
        if cold:  # the in-memory NEFF cache outlives dynamo.reset(); a cold case may not use it
            _call_if_present(getattr(torch_neuronx, "_C", None), "_clear_compilation_memory_cache")
        self._stats_before = self._keys_before = None  # taken at the end of setup (prepare)

    def prepare(self, case: Case) -> AttentionFn:
        compiled = self._compile()
        if self._sync is None:  # warm-up failed before it found one: refuse, never skip
            self._sync = _synchronizer(self.sync_module)
        gqa = case.shape.Hq != case.shape.Hkv
        lse = case.mode == "fwd+lse"
        # [SRC] get_fallback_ops() lists every eager op that fell back to the CPU
        # (NeuronBindings.cpp, neuron_cpu_fallback), setup's too: the inputs, mods and block
        # mask are made eagerly on the device before this. The check after the first call is
        # about the compiled graph and the calls, so the tracking starts here, at setup's end.
        _call_if_present(_import_torch_neuronx(), "clear_op_tracking")
        # [SRC] setup's eager device ops (the inputs, mods and block mask) compile their own
        # kernels through the same CompilationCache (OperationExecutionEngine ->
        # GetOrCompileNeff), asynchronously: wait for them, so that their compiles stay in
        # setup's time, then count the cache from here, so that cache_hit is the case's own
        # graph's (a setup kernel served from the cache made a cold compile read as a hit).
        self._sync()
        torch_neuronx = _import_torch_neuronx()
        self._stats_before = neuron_cache.cache_stats(torch_neuronx)
        entries = neuron_cache.cache_entries(torch_neuronx)
        self._keys_before = None if entries is None else {e.get("cache_key") for e in entries}

        def neuron(q, k, v, score_mod, block_mask):
            compat.validate_device(q, k, v)  # upstream's exact error, before any compile
            try:
                return compat.attention(compiled, q, k, v, score_mod, block_mask, enable_gqa=gqa,
                                        return_lse=lse)
            except Exception as exc:
                message = compat.unsupported_device_message(exc)
                if message is None:
                    raise
                raise ValueError(message) from exc

        return neuron

    def synchronize(self) -> None:
        if self._sync is None:
            raise RuntimeError("no synchronize function was found at warm-up; times would not "
                               "cover the queued device work")
        self._sync()

    def cache_hit(self) -> bool | None:
        # by the case's graphs, not the counters' hits: every execution counts one
        # (conformance/backends/neuron_cache.py)
        torch_neuronx = _import_torch_neuronx()
        return neuron_cache.served_from_cache(
            _graph_ids(torch_neuronx), neuron_cache.cache_entries(torch_neuronx),
            self._keys_before, self._stats_before, neuron_cache.cache_stats(torch_neuronx))

    def compile_breakdown(self) -> dict[str, float] | None:
        metrics = getattr(_import_torch_neuronx(), "get_dynamo_metrics", None)
        if metrics is None:
            return None
        graphs = list(metrics())  # it synchronizes, so the async neuronx-cc time is in
        if not graphs:
            return None
        # [SRC metrics.py] a graph's neuronx-cc time is its cache entry's: for a graph an
        # earlier case left in memory, that case's compile, which this one did not pay
        before = self._keys_before or set()
        return {stage: sum(float(getattr(g, field, 0) or 0) for g in graphs
                           if not (stage == "neuronx-cc"
                                   and getattr(g, "graph_id", None) in before)) / 1e6
                for stage, field in STAGES.items()}

    def compiled_bytes(self) -> int | None:
        """The NEFFs of the case's graphs: [SRC] a graph's metrics carry its cache key
        (``graph_id``, metrics.py) and ``_C._get_compilation_cache_entries()`` each cached
        graph's ``neff_size_bytes`` (NeuronBindings.cpp, a private API); None unless every
        graph of the case is found."""
        torch_neuronx = _import_torch_neuronx()
        keys, entries = set(_graph_ids(torch_neuronx)), neuron_cache.cache_entries(torch_neuronx)
        if entries is None:
            return None
        sizes = {entry.get("cache_key"): entry.get("neff_size_bytes") for entry in entries}
        if not keys or not keys <= sizes.keys():
            return None
        return sum(int(sizes[key]) for key in keys)

    def fallback_ops(self) -> list[str]:
        ops = getattr(_import_torch_neuronx(), "get_fallback_ops", None)
        return list(ops()) if ops is not None else []

    def is_execution_timeout(self, exc: BaseException) -> bool:
        return _says(sdk.EXEC_TIMEOUT_RE, exc)

    def is_execution_error(self, exc: BaseException) -> bool:
        return _says(sdk.EXEC_ERROR_RE, exc)

    def _compile(self):
        """flex_attention compiled by the neuron backend, with every fallback ruled out."""
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        if os.environ.get(sdk.FALLBACK_ENV) != "1":
            raise RuntimeError(f"{sdk.FALLBACK_ENV} is {os.environ.get(sdk.FALLBACK_ENV)!r} in "
                               "the child; it must be 1 so a failed compile cannot run eagerly "
                               "(the suite sets it: run through the suite's executor)")
        _import_torch_neuronx()
        torch._dynamo.config.suppress_errors = False
        return torch.compile(flex_attention, backend="neuron", fullgraph=True, dynamic=False,
                             options={"fallback_execution": False})


def _says(pattern, exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, matches ``pattern``."""
    current: BaseException | None = exc
    while current is not None:
        if pattern.search(str(current)):
            return True
        current = current.__cause__
    return False


def _import_torch_neuronx():
    """torch_neuronx (importing it registers the device and the ``neuron`` backend)."""
    try:
        import torch_neuronx
    except Exception as exc:  # noqa: BLE001 - PyPI's placeholder raises ImportError on import
        found = sdk.PackageProbe(True, error=f"{type(exc).__name__}: {exc}")
        raise RuntimeError("the child cannot import torch_neuronx: "
                           f"{sdk.unavailable_reason(found, _torch_version())}") from None
    return torch_neuronx


def _synchronizer(device_type: str) -> Callable[[], None]:
    """``torch.neuron.synchronize`` ([SDK] profiling guide: the forward call only queues work),
    else ``torch.accelerator.synchronize`` when the accelerator is this device; else the
    suite refuses to time anything (FatalSetupError)."""
    import torch

    sync = getattr(getattr(torch, device_type, None), "synchronize", None)
    if callable(sync):
        return sync
    accelerator = getattr(torch, "accelerator", None)
    current = getattr(accelerator, "current_accelerator", lambda: None)() if accelerator else None
    if current is not None and getattr(current, "type", None) == device_type \
            and callable(getattr(accelerator, "synchronize", None)):
        return accelerator.synchronize
    raise FatalSetupError(f"neither torch.{device_type}.synchronize nor torch.accelerator."
                          f"synchronize (for {device_type}) exists, so compile and run times "
                          "would not include the queued device work; install a torch-neuronx "
                          "that registers torch.neuron")


def _graph_ids(torch_neuronx) -> list[str]:
    """The case's compiled graphs' cache keys ([SRC] metrics.py: ``graph_id``; the metrics
    are reset per case, and reading them synchronizes)."""
    metrics = getattr(torch_neuronx, "get_dynamo_metrics", None)
    return [] if metrics is None else [getattr(g, "graph_id", None) for g in metrics()]


def _cache_hit_source(apis: dict[str, bool]) -> str:
    if apis.get("cache_entries") and apis.get("get_dynamo_metrics"):
        return ("the case's graphs (torch_neuronx.get_dynamo_metrics) in "
                "torch_neuronx._C._get_compilation_cache_entries: a hit when one was cached "
                "before the first call or read from disk (compilation_time_ms 0); private API")
    if apis.get("cache_stats"):
        return ("torch_neuronx._C._get_compilation_cache_stats: a hit when persistent_hits grew, "
                "a miss when only total_compilations did (a private API; counting with "
                f"{sdk.METRICS_ENV}=1)")
    return "none: the cache statistics API is absent, cache_hit is unknown"


def _call_if_present(owner, name: str) -> None:
    fn = getattr(owner, name, None)
    if fn is not None:
        fn()


def _torch_version() -> str:
    import torch

    return torch.__version__


def _positive(value, what: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{what}={value!r} is not a positive whole number of NeuronCores per "
                         f"worker; write e.g. --neuron-cores-per-worker 1")
    return number
