"""The golden output and the dtype baseline of a case, computed once and kept on disk.

Computed in the parent (never in the child), on ``device`` (cpu, or cuda for float64 on a GPU),
and returned on the CPU. The cache key covers everything the numbers depend on: the case id,
the seed, the torch version, the reference version and the source of the modules that define
the inputs, the variants and the reference itself (an edit to any of them is a new key). The
cache directory is bounded: after each write the least recently used entries are removed
until it fits ``max_bytes``. Entries are written atomically, so workers can share it.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Modules whose source defines the reference numbers (part of the cache key).
_KEY_MODULES = ("cases.inputs", "cases.variants", "cases.model", "reference.golden")


def compute_reference(case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
    """(golden Reference, baseline tensor) of ``case``, on the CPU, without any cache."""
    from cases.inputs import make_inputs
    from reference.golden import Reference, baseline_attention, golden_attention

    inputs = make_inputs(case, seed)
    if device != "cpu":
        inputs = inputs.to(device)
    golden = golden_attention(case, inputs)
    baseline = baseline_attention(case, inputs)
    if device != "cpu":
        golden = Reference(golden.out.cpu(), golden.lse.cpu())
        baseline = baseline.cpu()
    return golden, baseline


class ReferenceCache:
    def __init__(self, directory: str | Path | None, max_bytes: int):
        self.directory = Path(directory) if directory else None
        self.max_bytes = int(max_bytes)

    def get(self, case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
        """The reference of ``case``: from the cache when present, else computed and stored."""
        if self.directory is None:
            return compute_reference(case, seed, device)
        import torch

        from reference.golden import Reference

        path = self.directory / f"{cache_key(case.id, seed, device)}.pt"
        try:
            data = torch.load(path, weights_only=True)
            os.utime(path)  # recently used
            return Reference(data["out"], data["lse"]), data["baseline"]
        except (FileNotFoundError, RuntimeError, KeyError, EOFError):
            pass  # absent, or torn by a crash: compute again
        golden, baseline = compute_reference(case, seed, device)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save({"out": golden.out, "lse": golden.lse, "baseline": baseline}, tmp)
        tmp.replace(path)
        self._evict()
        return golden, baseline

    def _evict(self) -> None:
        entries = []
        for path in self.directory.glob("*.pt"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            total -= size


def cache_key(case_id: str, seed: int, device: str) -> str:
    import torch

    from reference.golden import REFERENCE_VERSION

    text = "|".join([case_id, f"seed={seed}", f"device={device}", f"torch={torch.__version__}",
                     f"reference={REFERENCE_VERSION}", _source_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@lru_cache(maxsize=1)
def _source_digest() -> str:
    import importlib

    digest = hashlib.sha256()
    for name in _KEY_MODULES:
        module = importlib.import_module(name)
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()
