"""The CUDA backends: flex_attention run eagerly on a GPU, and compiled by Inductor (Triton).

``cuda-inductor`` compiles ``flex_attention`` with ``fullgraph=True`` and ``dynamic=False``
(every case compiles for its own static shape, as on the CPU) and with Dynamo's
``suppress_errors`` forced off, so a failed compile raises instead of running eagerly.

Each worker's child sees one GPU (``CUDA_VISIBLE_DEVICES``, taken round-robin from the GPUs
the run may use), so ``pytest -n <number of GPUs>`` gives every worker a GPU of its own; more
workers than GPUs share them (timings then disturb each other).

Two failures get a clear kind before the child classifies them:
- a CUDA out-of-memory error, however deeply the compiler wrapped it, becomes ``CudaOutOfMemory``
  (a MemoryError: the label is OUT_OF_MEMORY);
- Triton's "out of resource: shared memory" (the generated kernel needs more on-chip memory
  than the GPU has; Inductor rewraps it as "No valid triton configs") becomes
  ``TritonOutOfResources``, raised by the first call: a COMPILE_ERROR that says so.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Callable

from cases.model import Case
from conformance import compat
from conformance.backends.base import AttentionFn, Availability, Backend, WorkerSlot
from conformance.backends.cpu import begin_inductor_case, inductor_cache_hit

_CUDA_OOM_RE = re.compile(r"CUDA out of memory\.?[^\n]*")
_TRITON_OOR_RE = re.compile(r"out of resource: [^\n]*?Hardware limit: \d+")
_TRITON_PACKAGES = ("triton", "pytorch-triton", "pytorch-triton-rocm")


class CudaOutOfMemory(MemoryError):
    """The GPU ran out of memory (the label is OUT_OF_MEMORY)."""


class TritonOutOfResources(RuntimeError):
    """A generated Triton kernel needs more on-chip resources than the GPU has."""


def translate_cuda_error(exc: BaseException) -> BaseException | None:
    """The clear exception ``exc`` stands for (searching its wrapped causes), or None."""
    chain = list(_chain(exc))
    for err in chain:  # before out of memory: Inductor's "No valid triton configs. X: ..."
        text = str(err)  # names whichever its kernel's launcher raised, by type and text
        if type(err).__name__ == "OutOfResources" or "out of resource:" in text:
            m = _TRITON_OOR_RE.search(text)
            detail = m.group(0) if m else _first_line(err)
            return TritonOutOfResources(
                f"Triton kernel exceeds the GPU's on-chip resources ({detail}); the compiler "
                "generated a kernel that cannot run on this GPU (smaller BLOCK_M/BLOCK_N or "
                "num_stages in kernel_options may fit)")
    for err in chain:
        if type(err).__name__ == "OutOfMemoryError":
            line = _first_line(err)
            return CudaOutOfMemory(line if "out of memory" in line.lower()
                                   else f"CUDA out of memory: {line}")
    for err in chain:
        m = _CUDA_OOM_RE.search(str(err))
        if m:
            return CudaOutOfMemory(m.group(0))
    return None


def with_clear_errors(fn: AttentionFn) -> AttentionFn:
    """``fn``, raising CudaOutOfMemory / TritonOutOfResources for what they stand for."""

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            clear = translate_cuda_error(exc)
            if clear is None:
                raise
            raise clear from exc

    return call


class CudaEager(Backend):
    name = "cuda-eager"
    description = "flex_attention called eagerly on one CUDA GPU (unfused reference path of torch)"
    device_type = "cuda"
    compiled = False

    def availability(self) -> Availability:
        import torch

        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return Availability(False, f"this torch build ({torch.__version__}) has no CUDA "
                                "support; install a CUDA build of torch "
                                "(https://pytorch.org/get-started/locally/) on a machine with "
                                "an NVIDIA GPU")
        if not torch.cuda.is_available():
            return Availability(False, f"torch.cuda.is_available() is False (torch "
                                f"{torch.__version__}, CUDA {torch.version.cuda}): no usable GPU; "
                                "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        import torch

        env = super().environment()
        env.update(device="cuda", cuda=torch.version.cuda, triton=triton_version(),
                   driver=driver_version())
        if getattr(torch.version, "hip", None):
            env["hip"] = torch.version.hip
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env.update(device_name=props.name, device_count=torch.cuda.device_count(),
                       compute_capability=f"{props.major}.{props.minor}",
                       device_memory_bytes=int(props.total_memory))
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": gpu_for_worker(slot, visible_gpus())}

    def warm_up(self) -> None:
        from conformance.backends.cpu import _warm_up_inputs

        # bf16, a block mask and a score mod, as the CPU backends warm up: the paths cases take;
        # no cache of whole graphs may serve it (with --compile-cache warm a hit would leave
        # Inductor's lowering and code generation to the first case that misses, an outside
        # review), as on the CPU
        q, score_mod, block_mask = _warm_up_inputs()
        device = self.device()
        q, block_mask = q.to(device), block_mask.to(device)
        with compat.graph_caches_off():
            compat.attention(self._attention_fn(), q, q, q, score_mod, block_mask)
        self.synchronize()

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        import torch

        torch.cuda.empty_cache()  # nothing left over from the previous case counts against this one

    def prepare(self, case: Case) -> AttentionFn:
        fn = self._attention_fn()
        gqa = case.shape.Hq != case.shape.Hkv
        lse = case.mode == "fwd+lse"

        def run(q, k, v, score_mod, block_mask):
            return compat.attention(fn, q, k, v, score_mod, block_mask, enable_gqa=gqa,
                                     return_lse=lse)

        return with_clear_errors(run)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def is_execution_error(self, exc: BaseException) -> bool:
        """A CUDA error the device raised running kernels (an illegal memory access, a
        device-side assert, a launch failure): ``torch.AcceleratorError`` since torch 2.8, a
        RuntimeError "CUDA error: ..." before. It surfaces at the first call's synchronize,
        inside the compile phase, so without this it was a COMPILE_ERROR (an outside review);
        recognised, it is a RUNTIME_ERROR in any phase, and the child is replaced: a CUDA
        error leaves the context unusable for every later case."""
        return any(type(err).__name__ == "AcceleratorError" or "CUDA error:" in str(err)
                   for err in _chain(exc))

    def _attention_fn(self) -> Callable:
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention


class CudaInductor(CudaEager):
    name = "cuda-inductor"
    description = ("torch.compile(flex_attention, fullgraph=True, dynamic=False) on one CUDA GPU "
                   "(Inductor, Triton kernels)")
    compiled = True

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env["compiler"] = "inductor"
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        env = super().child_env(slot, cache_dir)
        # Triton compiles in the child itself: a pool of compile workers that kept the
        # environment it started with would, after begin_case moved TRITON_CACHE_DIR to a
        # case's fresh directory, still read and fill the first one (a cold case could then hit
        # an earlier case's kernels). torch 2.13's pool passes both cache directories with
        # every task; not every release the suite supports was checked, and one thread is
        # safe in all. flex_attention's forward is a few kernels: little is lost, and the
        # compiles are timed in process (compat.inductor_compile_stages: triton_compile).
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        if cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
            env["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
        return env

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        super().begin_case(cache_dir, cold)
        begin_inductor_case(cache_dir, cold)  # Inductor caches, counters
        if cache_dir:
            os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")

    def cache_hit(self) -> bool | None:
        return inductor_cache_hit()

    def compile_breakdown(self) -> dict[str, float] | None:
        return compat.inductor_compile_stages("triton_compile")

    def _attention_fn(self) -> Callable:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.suppress_errors = False  # never fall back to eager silently
        return torch.compile(flex_attention, fullgraph=True, dynamic=False)


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs this run may use: the entries of CUDA_VISIBLE_DEVICES when it is set (indices,
    UUIDs or MIG ids, kept as written), else every GPU torch counts."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [part.strip() for part in listed.split(",") if part.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_for_worker(slot: WorkerSlot, gpus: list[str]) -> str:
    """The one GPU of worker ``slot`` (round-robin when workers outnumber GPUs)."""
    if not gpus:
        raise ValueError("no GPU to give to worker children (CUDA_VISIBLE_DEVICES is empty or "
                         "torch counts 0 GPUs); check `nvidia-smi`, or use a cpu-* backend")
    return gpus[slot.index % len(gpus)]


def reference_device_for(device: str, slot: WorkerSlot) -> str:
    """Where worker ``slot`` computes its goldens (``--reference-device``): ``cpu``, or the
    GPU its child runs on (``cuda:i``: the parent sees the GPUs of CUDA_VISIBLE_DEVICES in
    order, as visible_gpus lists them for gpu_for_worker), so eight workers' goldens do not
    all land on GPU 0 beside worker 0's timed runs (an outside review)."""
    if device != "cuda":
        return device
    import torch

    return f"cuda:{slot.index % max(1, torch.cuda.device_count())}"


def reference_gpus_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why the goldens cannot go to each worker's own GPU, or None: the GPUs this process
    sees must be the list the children's GPUs are taken from, one for one (a process sees
    one MIG instance however many CUDA_VISIBLE_DEVICES names)."""
    import torch

    gpus, count = visible_gpus(environ), torch.cuda.device_count()
    if len(gpus) == count:
        return None
    return (f"--reference-device cuda: CUDA_VISIBLE_DEVICES lists {len(gpus)} GPUs "
            f"({', '.join(gpus)}) but this process sees {count} (MIG instances: one per "
            "process), so a worker's goldens could not go to its own GPU; use "
            "--reference-device cpu")


def triton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for package in _TRITON_PACKAGES:
        try:
            return version(package)
        except PackageNotFoundError:
            continue
    return "not installed"


def driver_version() -> str:
    """The NVIDIA driver version, from nvidia-smi (tolerant of its absence)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return "unknown (nvidia-smi not found)"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown (nvidia-smi failed: {exc})"
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else "unknown (nvidia-smi failed)"


def _chain(exc: BaseException):
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
