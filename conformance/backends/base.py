"""The backend interface: what the suite needs to know about a place flex_attention runs.

A backend is a small object (docs/backends.md). The parent process (pytest) asks it whether
it is available, what environment to record, which cases it supports and what environment
variables each worker's child needs. The child process asks it for the device and for the
callable to run; the first call of that callable is timed as the compile phase.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from cases.model import Case, Shape, Variant

#: The case the default ``Backend.warm_up`` compiles (its own score mod: a halving).
WARM_UP_CASE = Case(Variant("causal"), Shape(1, 1, 1, 128, 128, 16), "bf16", "fwd")


class FatalSetupError(RuntimeError):
    """Raised by ``warm_up`` when no case can be run or timed honestly in this child (the
    backend's package cannot be imported, it offers no way to wait for the device). Every
    case of the child is then HARNESS_ERROR with this message, never a backend label."""


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""  # why not (and how to fix it) when unavailable


@dataclass(frozen=True)
class WorkerSlot:
    """Which slice of the machine one pytest worker's child may use."""

    index: int  # 0-based worker index (gw3 -> 3)
    count: int  # number of workers


def omp_thread_cap() -> int | None:
    """The user's own cap on threads: ``OMP_NUM_THREADS`` when it is a positive whole number
    (surrounding blanks allowed), else None. Other values are ignored: ``0``, text (OpenMP
    runtimes ignore those too) and lists such as ``4,2`` (which this does not read)."""
    import os

    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not (text.isascii() and text.isdecimal()):
        return None
    return int(text) or None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset)
    where the platform says, else the machine's."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads_per_worker(slot: WorkerSlot) -> int:
    """A fair share of the usable cores for one worker, at least 1, and never more than the
    user's own cap (omp_thread_cap): a cap the user set is kept, not raised."""
    share = max(1, usable_cores() // max(1, slot.count))
    cap = omp_thread_cap()
    return share if cap is None else min(share, cap)


def backend_code(cls: type) -> str | None:
    """Which plugin code a backend is: the first 16 hex digits of the sha256 over every
    ``.py`` file (path and content) of the top-level package, or module, of each backend class
    ``cls`` is or derives from that is not this suite's (``conformance``): a plugin's helpers
    count, not only the file of its class. None for a built-in backend (its code is this
    suite's, which the gate's reruns take from the gate's checkout for both releases), and
    when a file cannot be read. Recorded as a release key (records/release.py): ``flexconf
    gate --confirm`` measures a run again only under a python that loads the same plugin code.
    Code outside those packages, and environment variables, are not covered."""
    import hashlib
    import sys
    from pathlib import Path

    tops = dict.fromkeys(c.__module__.split(".")[0] for c in cls.__mro__
                         if isinstance(c, type) and issubclass(c, Backend))
    tops.pop("conformance", None)
    digest = hashlib.sha256()
    for top in tops:
        module = sys.modules.get(top)
        roots = [Path(p) for p in getattr(module, "__path__", [])]
        files = ([(f.relative_to(root), f) for root in roots for f in sorted(root.rglob("*.py"))]
                 if roots else [(Path(top + ".py"), Path(getattr(module, "__file__", "") or ""))])
        for name, path in files:
            try:
                digest.update(f"{top}/{name.as_posix()}\n".encode() + path.read_bytes())
            except OSError:
                return None
    return digest.hexdigest()[:16] if tops else None


#: fn(q, k, v, score_mod, block_mask) -> output tensor
AttentionFn = Callable[..., Any]


class Backend:
    """Base class of all backends; subclasses override what differs."""

    name: str = ""
    description: str = ""
    device_type: str = "cpu"
    compiled: bool = False  # True when the first call compiles (the compile phase means something)

    def availability(self) -> Availability:
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        """Versions and device description to print beside the results (parent process)."""
        import platform

        import torch

        code = backend_code(type(self))
        return {
            "backend": self.name,
            "compiled": self.compiled,  # whether the compile phase compiles (the gate reads it)
            **({"backend_code": code} if code else {}),  # a plugin's (None: built-in)
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "platform": platform.platform(),
        }

    def check_worker_count(self, count: int) -> None:
        """In the controller, before anything runs: raise ValueError (one line) when
        ``count`` workers cannot each get their slice of the device."""

    def unsupported_reason(self, case: Case) -> str | None:
        """None when the backend runs ``case``; otherwise why not (becomes UNSUPPORTED)."""
        return None

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        """Environment variables for the child process of worker ``slot`` (device slice,
        thread count, compiler cache directory; ``cache_dir`` None means the default)."""
        return {}

    def process_cache_env(self, cache_dir: str, cold: bool) -> dict[str, str]:
        """Environment variables for a compiler that reads its cache settings once per
        process: with ``cold``, no cache may serve any case of the child (called for each
        child, with a new directory); otherwise the shared cache ``cache_dir`` (never a
        host-wide default). {}: nothing of the kind."""
        return {}

    def device(self) -> str:
        """The torch device string the child runs on (after child_env took effect)."""
        return self.device_type

    def artifact_env(self, directory: str) -> dict[str, str]:
        """Environment variables that make a child keep its compile artefacts in
        ``directory`` (one per child process; {}: this backend keeps none). The executor files
        each case's new artefacts under the report directory when the case fails."""
        return {}

    def warm_up(self) -> None:
        """In the child, once at start: pay one-time start-up costs (compiler initialisation)
        so that no case's compile seconds include them. Errors here are logged, not fatal,
        except FatalSetupError (every case of the child becomes HARNESS_ERROR).

        The default runs the backend's own ``prepare`` of a tiny case (``WARM_UP_CASE``: bf16,
        a causal block mask, a score mod) once on its device and synchronizes, unless
        ``unsupported_reason`` declines that case; override it where that is not the path the
        cases take."""
        import torch
        from torch.nn.attention.flex_attention import create_block_mask

        if self.unsupported_reason(WARM_UP_CASE):  # falsy: supported (backends/registry.py)
            return
        attention = self.prepare(WARM_UP_CASE)
        s, device = WARM_UP_CASE.shape, self.device()
        q = torch.randn(s.B, s.Hq, s.Sq, s.D, dtype=torch.bfloat16, device=device)
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None, None,
                                       s.Sq, s.Skv, device=device)
        attention(q, q, q, lambda score, b, h, q_idx, kv_idx: score * 0.5, block_mask)
        self.synchronize()

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        """In the child, before each case: forget everything compiled for earlier cases (each
        case compiles afresh for its static shape), clear compile counters, and point the
        compiler cache at ``cache_dir`` (None: leave it). ``cold`` asks for empty in-memory
        caches too (the run uses ``--compile-cache cold``). Dynamo's graphs are forgotten by
        the child itself just before (conformance/child.py), for every backend; what a
        backend's own compiler keeps in memory is the backend's to clear here."""

    def prepare(self, case: Case) -> AttentionFn:
        """In the child: the callable that computes the case (compiled lazily on first call)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (timing); nothing to do on the CPU."""

    def cache_hit(self) -> bool | None:
        """In the child, after the first call: whether the compile hit a cache (None: unknown)."""
        return None

    def compile_breakdown(self) -> dict[str, float] | None:
        """In the child, after the first call: its compile stages (name to seconds) as the
        compiler itself measured them; None when it does not say. The child adds the
        remainder of the compile phase as ``other``."""
        return None

    def compiled_bytes(self) -> int | None:
        """In the child, after the first call: the size in bytes of what the compiler made for
        the case (the NEFF on Neuron), as the backend's own compiler reports it; None when it
        does not say."""
        return None

    def fallback_ops(self) -> list[str]:
        """In the child, after the timed runs: operations of the case that ran on the host
        instead of the device. Any makes the case COMPILE_ERROR: a computation that fell
        back is not the backend's."""
        return []

    def is_execution_timeout(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the device runtime's own execution timeout (then RUN_TIMEOUT,
        not RUNTIME_ERROR)."""
        return False

    def is_execution_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the device runtime failing to run compiled code: RUNTIME_ERROR
        even in the first call (whose execution, where asynchronous, surfaces inside the
        compile phase), not COMPILE_ERROR."""
        return False
