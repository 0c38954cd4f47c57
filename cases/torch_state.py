"""torch's process-wide settings that a backend could leave changed after a case: the default
dtype and device, grad and anomaly modes, deterministic algorithms, float32 matmul precision
(the legacy switches and the fp32_precision ones of newer torch), the thread count and the
CUDA reduced-precision switches. The child takes them before each case and compares after it
(conformance/child.py): a change is the backend's breach of "stateless between cases"
(docs/backends.md), labelled on the case that made it, and undone, so the next case runs as
it would alone (a default dtype left at float64 made a later case's captured bias table
float64 in the child and float32 in the reference: a false MISMATCH on an innocent case, an
outside trial). A variant's builder is checked the same way around each build
(cases/variants.build_mods), so what a case module changes there is the case's fault, named
as such, never the backend's.

Every read and write is guarded: a setting this torch lacks is left out, and one whose read
raises (torch refuses the legacy TF32 switches once the fp32_precision API was used) is left
out of that snapshot, so it is compared only where both snapshots have it."""
from __future__ import annotations

from typing import Any, Callable

import torch

Reader = Callable[[], Any]
Writer = Callable[[Any], None]


def _attribute(owner: Callable[[], Any], name: str) -> tuple[Reader, Writer]:
    """Read and write ``owner().name`` (the owner looked up at each use: a module torch may
    lack, such as torch.backends.mkldnn.matmul)."""
    return (lambda: getattr(owner(), name),
            lambda value: setattr(owner(), name, value))


def _settings() -> dict[str, tuple[Reader, Writer | None]]:
    """name -> (read it, set it back; None where it cannot be set back from outside)."""
    backends = torch.backends
    settings: dict[str, tuple[Reader, Writer | None]] = {
        "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
        "inference mode": (torch.is_inference_mode_enabled, None),
        "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled,
                                     torch.use_deterministic_algorithms),
        "float32 matmul precision": (torch.get_float32_matmul_precision,
                                     torch.set_float32_matmul_precision),
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "default device": (lambda: torch.get_default_device(),  # torch 2.3 and later
                           lambda value: torch.set_default_device(value)),
        "cudnn allow_tf32": _attribute(lambda: backends.cudnn, "allow_tf32"),
    }
    # the legacy switches before the fp32_precision ones: restore writes in this order, and
    # writing a legacy switch moves the new settings, so these are set back last
    for flag in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction"):
        settings[f"cuda matmul {flag}"] = _attribute(lambda: backends.cuda.matmul, flag)
    settings |= {
        "fp32_precision": _attribute(lambda: backends, "fp32_precision"),
        "cuda matmul fp32_precision": _attribute(lambda: backends.cuda.matmul, "fp32_precision"),
        "cudnn fp32_precision": _attribute(lambda: backends.cudnn, "fp32_precision"),
        "mkldnn matmul fp32_precision": _attribute(lambda: backends.mkldnn.matmul,
                                                   "fp32_precision"),
    }
    return settings


#: fp32_precision values that compute alike: "none" defers to the legacy switches, whose
#: default is full float32 precision, "ieee"; writing any legacy switch, even to the value it
#: had (as torch's own code saves and restores them), turns "none" into "ieee".
_SAME_PRECISION = {"none": "ieee"}


def _compared(name: str, value: Any) -> Any:
    if name.endswith("fp32_precision") and isinstance(value, str):
        return _SAME_PRECISION.get(value, value)
    return value


def snapshot() -> dict[str, Any]:
    """The settings now (one that cannot be read here is left out)."""
    values = {}
    for name, (read, _) in _settings().items():
        try:
            values[name] = read()
        except Exception:  # noqa: BLE001 - a torch without it, or one that refuses the read
            continue
    return values


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``default dtype torch.float32 -> torch.float64`` for each setting that differs."""
    return [f"{name} {before[name]} -> {after[name]}" for name in before
            if name in after and _compared(name, after[name]) != _compared(name, before[name])]


def restore(before: dict[str, Any]) -> list[str]:
    """Set back every setting that differs from ``before`` and can be set back; returns the
    names of those still different afterwards."""
    now = snapshot()
    for name, (_, write) in _settings().items():
        # only what reads differently now: writing a legacy switch that torch refuses to read
        # (the fp32_precision API was used) would move the new settings as well
        if write is not None and name in before and name in now \
                and _compared(name, now[name]) != _compared(name, before[name]):
            try:
                write(before[name])
            except Exception:  # noqa: BLE001 - reported below as not set back
                continue
    after = snapshot()
    return [name for name in before
            if name in after and _compared(name, after[name]) != _compared(name, before[name])]
