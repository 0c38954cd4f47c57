"""The Trainium backend: flex_attention compiled by the Neuron SDK's native PyTorch backend.

Written against the vendor's documented API (torch-neuronx, "TorchNeuron"): tensors on device
``neuron``; ``torch.compile(fn, backend="neuron", fullgraph=True)``; Dynamo, AOTAutograd,
StableHLO, neuronx-cc, NEFF. Tested here only with the stand-in package in
``tests/standin_neuron`` (docs/backends.md says what has run on real hardware: nothing yet).

What the suite makes sure of:
- No failure can pass as compiled: ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1`` is forced in
  every child (whatever the caller's environment says), the child refuses to run without it,
  Dynamo's ``suppress_errors`` is forced off, and ``fullgraph=True`` makes a graph break raise.
- Each pytest worker's child owns its NeuronCores: ``NEURON_RT_VISIBLE_CORES`` is worker
  ``i``'s slice of ``FLEXCONF_NEURON_CORES_PER_WORKER`` cores (default 1), carved from the
  caller's own ``NEURON_RT_VISIBLE_CORES`` when that is set.
- Compile artefacts (``TORCH_NEURONX_DEBUG_DIR``) and the compile cache
  (``NEURON_COMPILE_CACHE_URL``) live in the case's own directory when the run is cold, in the
  run's shared directory when warm.
- Upstream flex_attention's rejection of a device type it does not list is raised as its own
  exact ValueError (the child labels it UNSUPPORTED), even when Dynamo wrapped it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from typing import Any

from cases.model import Case
from conformance import compat
from conformance.backends.base import AttentionFn, Availability, Backend, WorkerSlot

CORES_PER_WORKER_ENV = "FLEXCONF_NEURON_CORES_PER_WORKER"
FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
DEBUG_DIR_ENV = "TORCH_NEURONX_DEBUG_DIR"
CACHE_URL_ENV = "NEURON_COMPILE_CACHE_URL"
INSTALL_HINT = ("install the Neuron SDK's torch-neuronx on a Trainium host: pip install "
                "torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com "
                "(docs/backends.md, section Neuron)")
#: environment() key -> Python distribution whose version it records
PYTHON_PACKAGES = {"torch_neuronx": "torch-neuronx", "neuronx_cc": "neuronx-cc"}
RUNTIME_PACKAGE = "aws-neuronx-runtime-lib"  # the Neuron runtime (libnrt), an OS package
WARM_UP_SHAPE = (1, 1, 128, 16)  # B, H, S, D of the child's one warm-up compile


class Neuron(Backend):
    name = "neuron"
    description = ("torch.compile(flex_attention, backend='neuron', fullgraph=True) on Trainium "
                   "NeuronCores (torch-neuronx native backend, neuronx-cc)")
    device_type = "neuron"
    compiled = True

    def __init__(self, cores_per_worker: int | None = None):
        """``cores_per_worker`` None: ``$FLEXCONF_NEURON_CORES_PER_WORKER``, default 1."""
        self._cores_per_worker = cores_per_worker

    @property
    def cores_per_worker(self) -> int:
        if self._cores_per_worker is not None:
            return _positive(self._cores_per_worker, "cores_per_worker")
        return _positive(os.environ.get(CORES_PER_WORKER_ENV, "1"), CORES_PER_WORKER_ENV)

    def availability(self) -> Availability:
        if importlib.util.find_spec("torch_neuronx") is None:
            return Availability(False, "torch_neuronx is not installed; " + INSTALL_HINT)
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env.update({key: package_version(dist) for key, dist in PYTHON_PACKAGES.items()})
        env.update(device="neuron", compiler="neuronx-cc (torch-neuronx native backend)",
                   neuron_runtime=runtime_version(), device_name=instance_type(),
                   neuron_cores_per_worker=self.cores_per_worker,
                   fallback_execution=f"disabled ({FALLBACK_ENV}=1)")
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        env = {FALLBACK_ENV: "1",
               VISIBLE_CORES_ENV: cores_for_worker(slot, self.cores_per_worker,
                                                   os.environ.get(VISIBLE_CORES_ENV))}
        if cache_dir:
            env.update(compile_dirs(cache_dir))
        return env

    def device(self) -> str:
        import_torch_neuronx()
        return self.device_type

    def warm_up(self) -> None:
        import torch

        # One tiny compile and run: the runtime on this child's cores and the compiler's
        # one-time start-up are paid here, not by the first case.
        q = torch.randn(*WARM_UP_SHAPE, device=self.device())
        compat.validate_device(q, q, q)
        self._compile()(q, q, q)
        self.synchronize()

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        import torch

        torch._dynamo.reset()  # every case compiles for its own static shape
        if cache_dir:
            for name, path in compile_dirs(cache_dir).items():
                os.makedirs(path, exist_ok=True)
                os.environ[name] = path

    def prepare(self, case: Case) -> AttentionFn:
        compiled = self._compile()
        gqa = case.shape.Hq != case.shape.Hkv
        lse = case.mode == "fwd+lse"

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
        import torch

        sync = getattr(getattr(torch, "neuron", None), "synchronize", None)
        if sync is not None:
            sync()

    def _compile(self):
        """flex_attention compiled by the neuron backend, with every fallback ruled out."""
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        if os.environ.get(FALLBACK_ENV) != "1":
            raise RuntimeError(f"{FALLBACK_ENV} is {os.environ.get(FALLBACK_ENV)!r} in the child; "
                               "it must be 1 so a failed compile cannot run eagerly (the suite "
                               "sets it: run through the suite's executor)")
        import_torch_neuronx()
        torch._dynamo.config.suppress_errors = False
        return torch.compile(flex_attention, backend="neuron", fullgraph=True, dynamic=False)


def import_torch_neuronx():
    """Import torch_neuronx (registers the device and the ``neuron`` compile backend)."""
    try:
        import torch_neuronx
    except ImportError as exc:
        raise RuntimeError(f"cannot import torch_neuronx ({exc}); {INSTALL_HINT}") from None
    return torch_neuronx


def compile_dirs(cache_dir: str) -> dict[str, str]:
    """The Neuron compile-artefact and compile-cache directories under ``cache_dir``."""
    return {DEBUG_DIR_ENV: os.path.join(cache_dir, "neuron-debug"),
            CACHE_URL_ENV: os.path.join(cache_dir, "neuron-cache")}


def cores_for_worker(slot: WorkerSlot, per_worker: int, allowed: str | None = None) -> str:
    """NEURON_RT_VISIBLE_CORES for worker ``slot``: its ``per_worker`` cores, taken in order
    from ``allowed`` (the caller's NEURON_RT_VISIBLE_CORES) or from core 0 up."""
    first = slot.index * per_worker
    if allowed is None or not allowed.strip():
        cores = list(range(first, first + per_worker))
    else:
        pool = parse_cores(allowed)
        cores = pool[first:first + per_worker]
        if len(cores) < per_worker:
            raise ValueError(
                f"worker {slot.index} of {slot.count} needs NeuronCores {first}..{first + per_worker - 1}"
                f" of {VISIBLE_CORES_ENV}={allowed!r}, which has {len(pool)}; use fewer workers "
                f"(-n) or fewer cores per worker ({CORES_PER_WORKER_ENV})")
    return format_cores(cores)


def parse_cores(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]."""
    cores: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, sep, high = part.partition("-")
        try:
            cores.extend(range(int(low), int(high) + 1) if sep else [int(low)])
        except ValueError:
            raise ValueError(f"{VISIBLE_CORES_ENV}={text!r} is not a core list; write e.g. "
                             "0-3 or 0,1,2,3") from None
    return cores


def format_cores(cores: list[int]) -> str:
    """[4, 5, 6, 7] -> '4-7'; [3] -> '3'; anything else as a comma list."""
    if len(cores) > 1 and cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)


def package_version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def runtime_version() -> str:
    """The Neuron runtime's version from the OS package manager (tolerant of absence)."""
    queries = (("dpkg-query", "-W", "-f=${Version}", RUNTIME_PACKAGE),
               ("rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", RUNTIME_PACKAGE))
    for query in queries:
        tool = shutil.which(query[0])
        if not tool:
            continue
        try:
            out = subprocess.run([tool, *query[1:]], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return f"unknown ({RUNTIME_PACKAGE} not found by dpkg or rpm)"


def instance_type() -> str:
    """The EC2 instance type (e.g. trn2.48xlarge) from DMI, or 'unknown'."""
    try:
        with open("/sys/devices/virtual/dmi/id/product_name") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def _positive(value, what: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{what}={value!r} is not a positive whole number of NeuronCores per "
                         f"worker; write e.g. {CORES_PER_WORKER_ENV}=1")
    return number
