"""Whether a case's compile on the Neuron SDK was served by a cache, and where a warm run's
NEFFs are kept: the SDK's compilation cache as the public source shows it ([SRC], keys as in
conformance/backends/neuron_sdk.py).

[SRC] A compiled graph's neuronx-cc is queued through the C++ CompilationCache
(CompileGraph.compile -> _C.compile_graph -> GetOrCompileNeff): an in-memory entry or a
pending compile of the same key serves it (an in-memory hit), else the persistent cache on
disk (a persistent hit: the entry's ``compilation_time_ms`` is 0), else neuronx-cc compiles it
(``total_compilations`` + 1, the entry keeps its time). Every execution of a compiled graph
looks its NEFF up again (execute_compiled_graph -> NeffDirectKernelExecution, whose
RequiresCompilation() is true, "Forces a cache-lookup"), and that lookup counts an in-memory
hit, a cold case's first call included. So the counters' hits say nothing of the compile; a
case's graphs (``get_dynamo_metrics()``: ``graph_id`` is the entry's key) and the cache's
entries do.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable


def served_from_cache(graph_ids: Iterable[str], entries: list[dict] | None,
                      keys_before: set[str] | None, stats_before: dict | None,
                      stats_after: dict | None) -> bool | None:
    """True when some cache served (part of) the case's compile, False when its graphs were
    all compiled, None when the SDK does not say.

    ``graph_ids``: the case's graphs; ``entries``: ``_C._get_compilation_cache_entries()`` after
    the first call; ``keys_before``: the entries' keys before it (a graph already there was
    served from memory); ``stats_before``, ``stats_after``: ``_C._get_compilation_cache_stats()``
    around it, for an SDK whose entries do not name every graph: a persistent hit is a hit,
    a compilation without one a miss (never the in-memory hits, see the module doc)."""
    graphs = list(graph_ids)
    if graphs and entries is not None and keys_before is not None:
        times = {entry.get("cache_key"): entry.get("compilation_time_ms") for entry in entries}
        if all(times.get(graph) is not None for graph in graphs):
            return any(graph in keys_before or times[graph] == 0 for graph in graphs)
    if stats_before is None or stats_after is None:
        return None
    if _grew(stats_before, stats_after, "persistent_hits"):
        return True
    return False if _grew(stats_before, stats_after, "total_compilations") else None


def _grew(before: dict, after: dict, counter: str) -> bool:
    return (after.get(counter) or 0) > (before.get(counter) or 0)


def cache_stats(torch_neuronx) -> dict | None:
    """The compilation-cache counters, or None where the (private) API is absent or fails."""
    return _private_call(torch_neuronx, "_get_compilation_cache_stats", dict)


def cache_entries(torch_neuronx) -> list[dict] | None:
    """The in-memory cache's entries (``cache_key``, ``neff_size_bytes``,
    ``compilation_time_ms``), or None where the (private) API is absent or fails."""
    return _private_call(torch_neuronx, "_get_compilation_cache_entries",
                         lambda found: [dict(entry) for entry in found])


def _private_call(torch_neuronx, name: str, convert) -> Any:
    fn = getattr(getattr(torch_neuronx, "_C", None), name, None)
    try:
        return convert(fn()) if fn is not None else None
    except Exception:  # noqa: BLE001 - a private API that moved leaves the answer unknown
        return None


def warm_neff_dir_name(environment: dict[str, Any]) -> str:
    """The directory, under a warm run's ``neff/``, of one compiler release's NEFFs:
    ``release-`` and a digest of the torch-neuronx and neuronx-cc releases. [SRC] a NEFF's
    cache key is the StableHLO text, the graph's inputs and outputs, the target, the
    logical-core setting, the optimisation level and NEURON_CC_FLAGS (stablehlo_utils.py,
    KernelExecution.cpp, CacheUtils.cpp), not the compiler's version: one directory for every
    release would serve a new neuronx-cc the old one's NEFFs."""
    release = repr([str(environment.get(key)) for key in ("torch_neuronx", "neuronx_cc")])
    return "release-" + hashlib.sha256(release.encode()).hexdigest()[:12]
