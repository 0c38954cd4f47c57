"""flex_attention's device check, for devices outside upstream's fixed list.

Upstream ``flex_attention`` starts with ``_validate_device(query, key, value)``, which raises
``ValueError("FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices. Found input
tensors on <type> device.")`` for any device type outside {cuda, cpu, xpu, hpu, mps}; there is
no hook for out-of-tree devices (torch 2.13.0, torch/nn/attention/flex_attention.py; the
request for PrivateUse1 support in pytorch/pytorch#148656 added only HPU). The Neuron SDK's own
FlexAttention example (torch-neuronx examples/torch_compile/models/gpt_oss/attention.py)
replaces that one function so that it returns early for device ``neuron``; this module does
the same, opt-out, and says so:

- ``probe(device_type)`` asks the installed check, without touching any device, whether it
  accepts the type (a query stand-in that has only ``device.type`` and ``requires_grad``,
  the two things upstream's check reads);
- ``apply(device_type, mode)`` in the child: with ``bypass``, lifts the check for that one
  device type only (every other device, and every other validation of flex_attention, is
  untouched) where the probe says it rejects; with ``strict``, changes nothing, and the
  cases are UNSUPPORTED with upstream's sentence.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

MODES = ("bypass", "strict")
_MARK = "_flexconf_bypassed_device"


@dataclass(frozen=True)
class Probe:
    verdict: str  # accepted | rejected | absent (no check in this torch) | inconclusive
    message: str = ""  # upstream's sentence (rejected) or what went wrong (inconclusive)


def probe(device_type: str) -> Probe:
    """What the installed flex_attention check says of ``device_type``."""
    from torch.nn.attention import flex_attention as module

    check = getattr(module, "_validate_device", None)
    if check is None:
        return Probe("absent")
    original = getattr(check, "__wrapped__", check) if getattr(check, _MARK, None) else check
    tensor = SimpleNamespace(device=SimpleNamespace(type=device_type), requires_grad=False)
    try:
        original(tensor, tensor, tensor)
    except ValueError as exc:
        from conformance.compat import unsupported_device_message

        sentence = unsupported_device_message(exc)
        return Probe("rejected", sentence) if sentence else Probe("inconclusive", str(exc))
    except Exception as exc:  # noqa: BLE001 - a check that reads more than we offer
        return Probe("inconclusive", f"{type(exc).__name__}: {exc}")
    return Probe("accepted")


def decision(device_type: str, mode: str, found: Probe, torch_version: str) -> tuple[bool, str]:
    """(whether to patch, the sentence the environment records)."""
    if mode not in MODES:
        raise ValueError(f"--neuron-device-check {mode!r} is unknown; use one of: "
                         f"{', '.join(MODES)}")
    if found.verdict in ("accepted", "absent"):
        why = "accepts" if found.verdict == "accepted" else "has no device check and accepts"
        return False, (f"not patched: flex_attention of torch {torch_version} {why} device "
                       f"'{device_type}'")
    if mode == "strict":
        return False, (f"kept (--neuron-device-check strict): torch {torch_version} rejects "
                       f"device '{device_type}', so every case is UNSUPPORTED: {found.message}")
    note = "" if found.verdict == "rejected" else f"; the probe was inconclusive: {found.message}"
    return True, (f"device check bypassed for {device_type} (torch {torch_version}: "
                  f"flex_attention rejects it: {found.message}; only this device skips "
                  f"_validate_device, as the Neuron SDK's examples do){note}")


def apply(device_type: str, mode: str) -> str:
    """In the child, before any flex_attention call: patch or not (see ``decision``);
    idempotent. Returns the sentence of ``decision``."""
    import torch
    from torch.nn.attention import flex_attention as module

    patch, sentence = decision(device_type, mode, probe(device_type), torch.__version__)
    current = getattr(module, "_validate_device", None)
    if patch and getattr(current, _MARK, None) != device_type:
        module._validate_device = _bypassing(current, device_type)
    return sentence


def _bypassing(original, device_type: str):
    def _validate_device(query, key, value):
        if query.device.type == device_type:
            return None  # upstream's fixed list does not name this device; nothing else skipped
        return original(query, key, value)

    setattr(_validate_device, _MARK, device_type)
    _validate_device.__wrapped__ = original
    return _validate_device
