"""torch's process-wide settings that a backend could leave changed after a case: the default
dtype and device, grad and anomaly modes, deterministic algorithms, float32 matmul precision,
the thread count and the CUDA reduced-precision switches. The child takes them before each
case and compares after it (conformance/child.py): a change is the backend's breach of
"stateless between cases" (docs/backends.md), labelled on the case that made it, and undone,
so the next case runs as it would alone (a default dtype left at float64 made a later case's
captured bias table float64 in the child and float32 in the reference: a false MISMATCH on an
innocent case, an outside trial)."""
from __future__ import annotations

from typing import Any, Callable

import torch

_CUDA_MATMUL = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                "allow_bf16_reduced_precision_reduction")


def _getters() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]]:
    """name -> (read it, set it back; None where it cannot be set back from outside)."""
    matmul = torch.backends.cuda.matmul
    settings: dict[str, tuple[Callable[[], Any], Callable[[Any], None] | None]] = {
        "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
        "inference mode": (torch.is_inference_mode_enabled, None),
        "anomaly detection": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled,
                                     torch.use_deterministic_algorithms),
        "float32 matmul precision": (torch.get_float32_matmul_precision,
                                     torch.set_float32_matmul_precision),
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "cudnn allow_tf32": (lambda: torch.backends.cudnn.allow_tf32,
                             lambda value: setattr(torch.backends.cudnn, "allow_tf32", value)),
    }
    if hasattr(torch, "get_default_device"):  # torch 2.3 and later
        settings["default device"] = (torch.get_default_device, torch.set_default_device)
    for flag in _CUDA_MATMUL:
        if hasattr(matmul, flag):
            settings[f"cuda matmul {flag}"] = (
                lambda flag=flag: getattr(matmul, flag),
                lambda value, flag=flag: setattr(matmul, flag, value))
    return settings


def snapshot() -> dict[str, Any]:
    """The settings now (one that cannot be read here is left out)."""
    values = {}
    for name, (read, _) in _getters().items():
        try:
            values[name] = read()
        except Exception:  # noqa: BLE001 - a build without it: nothing to compare
            continue
    return values


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``default dtype torch.float32 -> torch.float64`` for each setting that differs."""
    return [f"{name} {before[name]} -> {after[name]}" for name in before
            if name in after and after[name] != before[name]]


def restore(before: dict[str, Any]) -> None:
    """Set back every setting that differs from ``before`` and can be set back."""
    now = snapshot()
    for name, (_, write) in _getters().items():
        if write is not None and name in before and now.get(name) != before[name]:
            try:
                write(before[name])
            except Exception:  # noqa: BLE001 - the next case's check will say it again
                continue
