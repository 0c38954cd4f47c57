"""What the suite knows of the Neuron SDK's native PyTorch backend, and how it asks the host.

Every constant names its source (keys as in docs/backends.md, section Neuron):
[ENV] the torch-neuronx environment variable reference (2026-10-14); [RN] Neuron 2.33 release
notes; [SDK] the aws-neuron-sdk docs (runtime configuration guide, logical NeuronCore config);
[SRC] a public copy of the torch-neuronx source from before 2.33 (2026-04); [NRT] the runtime's
nrt_status.h reference. Nothing here imports torch_neuronx into the calling process: the
package is imported only in a subprocess (``probe_package``) or in the child that runs cases.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

# -- environment variables -----------------------------------------------------------------
#: [ENV] 1 (the 2.33 default): a failed compile raises instead of running eagerly.
FALLBACK_ENV = "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"
#: [ENV] 1: CPU tensors given to a compiled graph raise instead of being copied to the device.
AUTOCOPY_ENV = "TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY"
#: [ENV][SRC] compile artefacts (fx_graphs/, stablehlo/, raw/, neff/); read once per process
#: (lru_cache in neuron_dynamo_backend/config.py), deleted after each compile unless preserved.
DEBUG_DIR_ENV = "TORCH_NEURONX_DEBUG_DIR"
PRESERVE_ENV = "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS"
#: [SRC] the native NEFF cache (default /tmp/neff_cache, shared by every run on the host), its
#: lock files (/tmp/local_cache) and its switch; read once, when the C++ CompilationCache
#: singleton is built. The 2026-04 docs spell the switch TORCH_NEURONX_DISABLE_NEFF_CACHE while
#: the code reads TORCH_NEURONX_NEFF_DISABLE_CACHE: both are set.
NEFF_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_LOCAL_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
NEFF_DISABLE_CACHE_ENVS = ("TORCH_NEURONX_NEFF_DISABLE_CACHE", "TORCH_NEURONX_DISABLE_NEFF_CACHE")
HOST_NEFF_CACHE_DIR = "/tmp/neff_cache"
#: [SRC NeuronMetrics.h, NeuronMetrics.cpp] the compilation-cache counters (and every other
#: TORCH_NEURONX_COUNTER) count only while metrics are enabled: off by default, on with this
#: variable ("1", read once per process) or _C._neuron_set_metrics_enabled(True).
METRICS_ENV = "TORCH_NEURONX_METRICS_ENABLED"
#: [SDK] one index or an inclusive range ("1-3"); takes precedence over NEURON_RT_NUM_CORES.
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
CORES_PER_WORKER_ENV = "FLEXCONF_NEURON_CORES_PER_WORKER"
DEVICE_CHECK_ENV = "FLEXCONF_NEURON_DEVICE_CHECK"
#: Recorded beside the results, with what the SDK does when each is unset.
RECORDED_ENV = {
    "NEURON_CC_FLAGS": "not set (neuronx-cc defaults)",  # [SRC] read by the native compile path
    "NEURON_COMPILER_OPT_LEVEL": "not set (-O2 for torch.compile)",  # [SRC]
    "NEURON_LOGICAL_NC_CONFIG": "not set (Trn2 default: LNC=2, two physical cores per logical)",  # [SDK]
    "NEURON_RT_EXEC_TIMEOUT": "not set (runtime default 30 s)",  # [SDK] configuration guide
}
#: [NRT] status NRT_TIMEOUT = 5; [SRC] ErrorHandler::ClassifyNrtError words it "Operation timed
#: out" in the execution error it raises ("NRT Execution error occurred on Neuron for
#: operation=...", error message "NRT EXECUTION FAILED: Async execution error: seq_id=N,
#: Operation timed out"). Only a real Trainium run confirms 2.33's exact text.
EXEC_TIMEOUT_RE = re.compile(r"\bOperation timed out\b|\bNRT_TIMEOUT\b")
#: [SRC] ErrorHandler.cpp words every error of running a NEFF "NRT Execution error occurred on
#: Neuron for operation=..."; a compile's failure reads otherwise ("Compilation error occurred
#: on Neuron for operation=...", error message "COMPILATION FAILED: ..."; "Command failed
#: (neuronx-cc compilation)"; "Neuron backend NEFF execution setup failed"). Execution is
#: asynchronous, so the first call's surfaces at synchronize, inside the compile phase. 2.33's
#: text: hardware.
EXEC_ERROR_RE = re.compile(r"\bNRT Execution error occurred\b")

# -- the package -----------------------------------------------------------------------------
#: [RN] torch-neuronx 2.X.Y pairs with torch 2.X; 2.33 ships 2.13.3.0 and 2.14.3.0.
MIN_RELEASE = (2, 13)
SUPPORTED_PYTHON = "3.12-3.14"  # [RN]
INDEX_URL = "https://pip.repos.neuron.amazonaws.com"
#: PyPI's torch-neuronx 1.0 (2022) is a placeholder; importing it raises this.
PLACEHOLDER_TEXT = "WRONG PACKAGE"
PROBE_TIMEOUT = 180.0

_PROBE_SCRIPT = r"""
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out["torch"] = torch.__version__
    import torch_neuronx
    # the release is the installed wheel's ([RN]: 2.13.3.0, 2.14.3.0); [SRC] hard-codes
    # torch_neuronx.__version__ = "0.1.0", so the attribute is read only without metadata
    try:
        from importlib.metadata import version
        out["version"] = version("torch-neuronx")
    except Exception:
        out["version"] = str(getattr(torch_neuronx, "__version__", ""))
    out["apis"] = {
        "get_dynamo_metrics": hasattr(torch_neuronx, "get_dynamo_metrics"),
        "get_fallback_ops": hasattr(torch_neuronx, "get_fallback_ops"),
        "cache_stats": hasattr(getattr(torch_neuronx, "_C", None), "_get_compilation_cache_stats"),
        "clear_memory_cache": hasattr(getattr(torch_neuronx, "_C", None),
                                      "_clear_compilation_memory_cache"),
        "cache_entries": hasattr(getattr(torch_neuronx, "_C", None),
                                 "_get_compilation_cache_entries"),
        "torch.neuron.synchronize": hasattr(getattr(torch, "neuron", None), "synchronize"),
    }
    # [SRC] torch_neuronx.device_count(): "the number of Neuron devices (Virtual Neuron Cores)
    # available"; torch.neuron.is_available() is device_count() > 0, False when it raises. It
    # asks nrt_get_visible_vnc_count without starting the runtime, and gives 0 when the runtime
    # cannot be asked (NeuronDevice.cpp)
    count = getattr(torch_neuronx, "device_count", None)
    if callable(count):
        try:
            out["device_count"] = int(count())
        except Exception as exc:
            out["device_count_error"] = (type(exc).__name__ + ": " + str(exc)).strip()
    from conformance.backends.device_check import probe  # after torch_neuronx: it may patch
    found = probe(sys.argv[1])
    out["device_check"] = [found.verdict, found.message]
except BaseException as exc:
    out["error"] = (type(exc).__name__ + ": " + str(exc)).strip()
print("FLEXCONF-PROBE " + json.dumps(out))
"""


@dataclass(frozen=True)
class PackageProbe:
    """What importing torch_neuronx in a fresh interpreter showed."""

    found: bool  # an importable torch_neuronx exists on the path
    version: str = ""
    torch: str = ""
    python: str = ""
    error: str = ""  # why the import (or the probe) failed
    apis: dict = field(default_factory=dict)
    #: torch_neuronx.device_count(): the logical NeuronCores this process sees; None when the
    #: package has no such function
    device_count: int | None = None
    device_count_error: str = ""  # why device_count() raised
    #: what flex_attention's device check says of the device, with torch_neuronx imported:
    #: (verdict, message) as conformance.backends.device_check.Probe
    device_check: tuple[str, str] | None = None


def probe_package(device_type: str = "neuron") -> PackageProbe:
    """Import torch_neuronx in a subprocess (a broken import cannot hurt this process) and
    probe flex_attention's device check for ``device_type`` there; once per process, search
    path and device type."""
    return _probe(tuple(sys.path), device_type)


@lru_cache(maxsize=8)
def _probe(path: tuple[str, ...], device_type: str) -> PackageProbe:
    import importlib.util

    if importlib.util.find_spec("torch_neuronx") is None:
        return PackageProbe(found=False)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE_SCRIPT, device_type],
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return PackageProbe(found=True, error=f"the import probe failed: {exc}")
    for line in done.stdout.splitlines():
        if line.startswith("FLEXCONF-PROBE "):
            data = json.loads(line[len("FLEXCONF-PROBE "):])
            check = data.get("device_check")
            return PackageProbe(found=True, version=data.get("version", ""),
                                torch=data.get("torch", ""), python=data.get("python", ""),
                                error=data.get("error", ""), apis=data.get("apis", {}),
                                device_count=data.get("device_count"),
                                device_count_error=data.get("device_count_error", ""),
                                device_check=tuple(check) if check else None)
    tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return PackageProbe(found=True, error=f"the import probe died: {tail}")


def install_hint(torch_version: str) -> str:
    """The install command that matches ``torch_version`` (torch-neuronx 2.X for torch 2.X)."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    pin = f"torch-neuronx=={m.group(1)}.{m.group(2)}.*" if m else "torch-neuronx"
    return (f"on a Trainium host (Trn2/Trn3, Python {SUPPORTED_PYTHON}): pip install "
            f"'{pin}' --extra-index-url {INDEX_URL} (docs/backends.md, section Neuron)")


def unavailable_reason(found: PackageProbe, torch_version: str) -> str | None:
    """Why this torch_neuronx cannot run the suite; None when it is a real, matching release."""
    hint = install_hint(torch_version)
    if not found.found:
        return f"torch_neuronx is not installed; install it {hint}"
    if PLACEHOLDER_TEXT in found.error:
        return ("the installed torch-neuronx is PyPI's placeholder (its import says "
                f"{found.error.splitlines()[0]!r}), not the Neuron SDK; pip uninstall "
                f"torch-neuronx, then install the real one {hint}")
    if found.error:
        return f"torch_neuronx cannot be imported ({found.error.splitlines()[0]}); reinstall it {hint}"
    release = re.match(r"(\d+)\.(\d+)", found.version)
    torch_release = re.match(r"(\d+)\.(\d+)", torch_version)
    if release is None or (int(release.group(1)), int(release.group(2))) < MIN_RELEASE:
        return (f"torch-neuronx {found.version or '(no version)'} is older than the native "
                f"backend the suite drives (2.13 or later); install {hint}")
    if torch_release is None or release.groups() != torch_release.groups():
        return (f"torch-neuronx {found.version} does not match torch {torch_version} "
                f"(torch-neuronx {release.group(1)}.{release.group(2)} needs torch "
                f"{release.group(1)}.{release.group(2)}); install {hint}")
    return no_cores_reason(found)


def no_cores_reason(found: PackageProbe) -> str | None:
    """Why torch_neuronx, installed and importable, has no NeuronCore to run on; None when it
    sees one, or cannot say. [SDK pytorch-native-overview.rst]: compiling needs a Trn2/Trn3
    instance; [REF]: backend 'neuron' is "auto-selected when running on a Neuron device"."""
    visible = os.environ.get(VISIBLE_CORES_ENV)
    scope = f" with {VISIBLE_CORES_ENV}={visible!r}" if visible else ""
    if found.device_count_error:
        return (f"torch_neuronx.device_count() failed{scope} "
                f"({found.device_count_error.splitlines()[0]}), so torch.neuron.is_available() "
                "is False; check the Neuron driver and runtime with neuron-ls")
    if found.device_count == 0:  # [SRC] also what a runtime that cannot be asked gives
        return (f"torch_neuronx sees no NeuronCore here{scope} (torch_neuronx.device_count() is "
                "0); the native backend compiles and runs on a Trn2 or Trn3 instance, with the "
                "Neuron driver loaded (neuron-ls lists its devices)")
    return None


# -- NeuronCores -----------------------------------------------------------------------------
def parse_cores(text: str) -> list[int]:
    """NEURON_RT_VISIBLE_CORES in its documented forms: '3' -> [3], '0-3' -> [0, 1, 2, 3]."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
        raise ValueError(f"{VISIBLE_CORES_ENV}={text!r} is not one of its documented forms, one "
                         "index or an inclusive range; write e.g. 0-7")
    low = int(m.group(1))
    return list(range(low, int(m.group(2) or low) + 1))


def format_cores(cores: list[int]) -> str:
    """[4, 5, 6, 7] -> '4-7'; [3] -> '3'. Anything else has no documented form."""
    if not cores or cores != list(range(cores[0], cores[-1] + 1)):
        raise ValueError(f"NeuronCores {cores} are not one index or one range, the only forms "
                         f"{VISIBLE_CORES_ENV} documents; choose a contiguous slice")
    return str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"


def cores_for_worker(index: int, count: int, per_worker: int, allowed: str | None = None) -> str:
    """NEURON_RT_VISIBLE_CORES for worker ``index`` of ``count``: its ``per_worker`` cores,
    taken in order from ``allowed`` (the caller's NEURON_RT_VISIBLE_CORES) or from core 0."""
    first = index * per_worker
    if allowed is None or not allowed.strip():
        return format_cores(list(range(first, first + per_worker)))
    pool = parse_cores(allowed)
    cores = pool[first:first + per_worker]
    if len(cores) < per_worker:
        raise ValueError(
            f"worker {index} of {count} needs NeuronCores {first}..{first + per_worker - 1} of "
            f"{VISIBLE_CORES_ENV}={allowed!r}, which has {len(pool)}; use fewer workers (-n) "
            f"or fewer cores per worker (--neuron-cores-per-worker)")
    return format_cores(cores)


def check_core_budget(count: int, per_worker: int, visible: int | None,
                      allowed: str | None) -> None:
    """Without a NEURON_RT_VISIBLE_CORES of the caller's, worker slices are taken from core 0
    up: ``count`` workers of ``per_worker`` cores must fit the ``visible`` logical cores that
    torch_neuronx.device_count() reports [SRC] (unknown: not checked)."""
    if (allowed and allowed.strip()) or visible is None or count * per_worker <= visible:
        return
    raise ValueError(
        f"{count} worker(s) of {per_worker} NeuronCore(s) each need {count * per_worker}, and "
        f"torch_neuronx.device_count() sees {visible} here (logical cores, "
        "NEURON_LOGICAL_NC_CONFIG); use fewer workers (-n) or fewer cores per worker "
        "(--neuron-cores-per-worker)")


# -- tools on the host -------------------------------------------------------------------------
def tool_output(argv: list[str], lines: int = 1) -> str:
    """The first ``lines`` non-empty lines a host tool prints, or 'not installed' /
    'unknown (why)'."""
    path = shutil.which(argv[0])
    if path is None:
        return f"not installed ({argv[0]} not on PATH)"
    try:
        done = subprocess.run([path, *argv[1:]], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({argv[0]} failed: {exc})"
    text = [" ".join(line.split()) for line in (done.stdout or done.stderr).splitlines()
            if line.strip(" +-|=\t")]  # table borders say nothing
    if done.returncode != 0 or not text:
        return f"unknown ({' '.join(argv)} exited {done.returncode})"
    return " | ".join(text[:lines])


def compiler_version() -> str:
    """``neuronx-cc --version``'s first line, asked once per process and PATH: the environment
    records it and a warm run's NEFF directory is named after it, so both must read the
    same. A failure to tell (``unknown (...)``: a timeout, say) is asked again next time, not
    kept: one worker's passing failure would name another directory than its peers'."""
    path = os.environ.get("PATH", "")
    if path not in _COMPILER_VERSIONS:
        found = tool_output(["neuronx-cc", "--version"])
        if found.startswith("unknown ("):
            return found
        _COMPILER_VERSIONS[path] = found
    return _COMPILER_VERSIONS[path]


_COMPILER_VERSIONS: dict[str, str] = {}  # PATH -> what neuronx-cc --version said there


def driver_version() -> str:
    """The Neuron kernel driver (aws-neuronx-dkms): the loaded module's version, else the
    package's."""
    try:
        with open("/sys/module/neuron/version") as f:
            return f.read().strip() or "unknown (empty /sys/module/neuron/version)"
    except OSError:
        pass
    package = tool_output(["dpkg-query", "-W", "-f=${Version}", "aws-neuronx-dkms"])
    if package.startswith(("not installed", "unknown")):
        return "unknown (no neuron kernel module loaded, aws-neuronx-dkms not found by dpkg)"
    return package


def runtime_version() -> str:
    """The Neuron runtime (libnrt, package aws-neuronx-runtime-lib), from dpkg or rpm."""
    for argv in (["dpkg-query", "-W", "-f=${Version}", "aws-neuronx-runtime-lib"],
                 ["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "aws-neuronx-runtime-lib"]):
        found = tool_output(argv)
        if not found.startswith(("not installed", "unknown")):
            return found
    return "unknown (aws-neuronx-runtime-lib not found by dpkg or rpm)"


def instance_type() -> str:
    """The EC2 instance type (e.g. trn2.48xlarge) from DMI, or 'unknown'."""
    try:
        with open("/sys/devices/virtual/dmi/id/product_name") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown (no DMI product name)"
