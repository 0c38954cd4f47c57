"""The golden output and the dtype baseline of a case, computed once and kept on disk.

Computed in the parent (never in the child), on ``device`` (cpu, or cuda for float64 on a GPU),
and returned on the CPU. The cache key covers everything the numbers depend on: the case id,
the seed, the torch version, the reference version and the source of the modules that define
the inputs, the variants and the reference itself, and of the module that defines the case's
variant with every module of the user's own that it imports, directly or not (an edit to any of
them is a new key; conformance/source_closure.py follows the imports). Data a case module reads
from a file or the environment is not in the key: after changing it, run with
``--reference-cache none`` or clear the cache directory. The
cache directory is bounded: after each write the least recently used entries are removed
until it fits ``max_bytes``. Entries are written atomically, so workers can share it.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Where the modules whose source defines the reference numbers start (the cache key covers
#: them and every local module they import, directly or not: conformance/source_closure.py).
#: The module that defines the case's variant (a custom case module, say) is added per case.
_KEY_ROOTS = ("reference.golden", "cases.inputs", "cases.variants", "cases.composed")


def compute_reference(case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
    """(golden, baseline) References of ``case`` (output, lse, and gradients for backward
    cases), on the CPU, without any cache."""
    import torch

    from cases.inputs import make_grad_output, make_inputs
    from conformance.compat import ieee_float32_matmul
    from reference.golden import reference_pair

    inputs = make_inputs(case, seed)
    grad_out = make_grad_output(case, seed) if case.mode == "fwd+bwd" else None
    if device == "cpu":
        golden, baseline = reference_pair(case, inputs, grad_out)
        return _on_cpu(golden), _on_cpu(baseline)
    inputs = inputs.to(device)
    grad_out = grad_out.to(device) if grad_out is not None else None
    with ieee_float32_matmul():  # the float32 baseline: never TF32
        golden, baseline = reference_pair(case, inputs, grad_out)
    on_cpu = _on_cpu(golden), _on_cpu(baseline)
    del inputs, grad_out, golden, baseline
    torch.cuda.empty_cache()  # the golden's float64 working memory, on the case's own GPU
    return on_cpu


def _on_cpu(ref):
    from reference.outputs import reference_from_dict, reference_to_dict

    return reference_from_dict(reference_to_dict(ref))


class ReferenceCache:
    def __init__(self, directory: str | Path | None, max_bytes: int):
        self.directory = Path(directory) if directory else None
        self.max_bytes = int(max_bytes)

    def get(self, case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
        """The reference of ``case``: from the cache when present, else computed and stored."""
        if self.directory is None:
            return compute_reference(case, seed, device)
        import torch

        from reference.outputs import reference_from_dict, reference_to_dict, save_whole

        key = cache_key(case.id, seed, device.split(":")[0], _variant_module(case))  # any GPU
        path = self.directory / f"{key}.pt"
        try:
            data = torch.load(path, weights_only=True)
            os.utime(path)  # recently used
            return reference_from_dict(data["golden"]), reference_from_dict(data["baseline"])
        except (FileNotFoundError, RuntimeError, KeyError, EOFError):
            pass  # absent, or torn by a crash: compute again
        golden, baseline = compute_reference(case, seed, device)
        try:  # a cache only saves time: one that cannot be written (a full disk) is passed by,
            # never the case's label (an outside audit: every case was HARNESS_ERROR)
            self.directory.mkdir(parents=True, exist_ok=True)
            save_whole({"golden": reference_to_dict(golden),
                        "baseline": reference_to_dict(baseline)}, path)
            self._evict()
        except OSError:
            pass
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


def cache_key(case_id: str, seed: int, device: str, variant_module: str | None = None) -> str:
    import torch

    from reference.golden import REFERENCE_VERSION

    modules = keyed_sources(variant_module)
    text = "|".join([case_id, f"seed={seed}", f"device={device}", f"torch={torch.__version__}",
                     f"reference={REFERENCE_VERSION}", _source_digest(modules)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def keyed_modules(variant_module: str | None = None) -> tuple[str, ...]:
    """The modules whose source is part of a case's cache key (see _KEY_ROOTS)."""
    return tuple(name for name, _ in keyed_sources(variant_module))


def keyed_sources(variant_module: str | None = None) -> tuple[tuple[str, str], ...]:
    """(module, its source file) of each module of a case's cache key, in name order."""
    from conformance.source_closure import local_closure

    closure = local_closure(_KEY_ROOTS + ((variant_module,) if variant_module else ()))
    return tuple((name, str(path)) for name, path in closure.items())


def _variant_module(case) -> str | None:
    from cases.custom import defining_module

    try:
        return defining_module(case.variant.name)
    except ValueError:
        return None  # the reference computation will say which variant is unknown


@lru_cache(maxsize=8)
def _source_digest(sources: tuple[tuple[str, str], ...]) -> str:
    digest = hashlib.sha256()
    for name, path in sources:
        digest.update(name.encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()
