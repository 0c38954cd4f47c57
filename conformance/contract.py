"""What a backend's ``fn(q, k, v, score_mod, block_mask)`` must return in each mode, checked.

The child checks every call's result against this contract before anything is saved or judged
(conformance/child.py). A result of the wrong structure is the backend's error, raised as a
``ContractError`` inside the call's phase (COMPILE_ERROR on the first call, RUNTIME_ERROR on a
later one), with a message that quotes the contract. Without the check a backend returning the
output alone in ``fwd+lse`` mode would be unpacked along its batch dimension into a wrong
"output" and "lse" and judged a MISMATCH (or fail with a bare unpacking error).
docs/backends.md states the same contract.
"""
from __future__ import annotations

from typing import Any

#: The contract of each mode, as quoted in errors and in docs/backends.md.
CONTRACT: dict[str, str] = {
    "fwd": "fn returns the output: a tensor [B, Hq, Sq, D] in the inputs' dtype, on the "
           "backend's device",
    "fwd+lse": "fn returns a tuple (out, lse): out a tensor [B, Hq, Sq, D] in the inputs' dtype, "
               "lse a floating-point tensor [B, Hq, Sq] (natural log; flex_attention gives "
               "float32), both on the backend's device",
    "fwd+bwd": "fn returns the output: a tensor [B, Hq, Sq, D] in the inputs' dtype, on the "
               "backend's device, differentiable with respect to q, k and v (autograd computes "
               "dQ, dK, dV from it)",
}


class ContractError(TypeError):
    """The backend's fn returned something outside the contract of the case's mode."""


def check_result(case, result: Any, dtype, device: str) -> Any:
    """``result`` when it keeps ``CONTRACT[case.mode]`` for ``case`` on inputs of ``dtype`` on
    ``device``; raises ContractError (one line: what is wrong, then the contract) otherwise."""
    shape = case.shape
    out_shape = (shape.B, shape.Hq, shape.Sq, shape.D)
    if case.mode == "fwd+lse":
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            got = (f"a {type(result).__name__} of {len(result)} items"
                   if isinstance(result, (tuple, list)) else _kind(result, "a single tensor"))
            _fail(case, f"fn returned {got}")
        out, lse = result
        _check_tensor(case, "out", out, out_shape, device, dtype)
        _check_tensor(case, "lse", lse, out_shape[:3], device, None)
        if not lse.is_floating_point():
            _fail(case, f"lse has dtype {lse.dtype}, not a floating-point dtype")
        return out, lse
    _check_tensor(case, "the output", result, out_shape, device, dtype)
    if case.mode == "fwd+bwd" and not result.requires_grad:
        _fail(case, "the output does not require grad (it is not connected to q, k, v)")
    return result


def gradients_or_zeros(grads: tuple, inputs: tuple) -> tuple:
    """dQ, dK, dV as autograd gives them, with zeros for the ones it gives as None: autograd's
    None means the output does not depend on that input, a gradient of zero. That is the right
    answer of a score mod that ignores the score (dQ = dK = 0), and the verdict judges it
    against the golden's as any other gradient; where the golden's is not zero, it is wrong."""
    import torch

    return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs))


def _check_tensor(case, what: str, value: Any, expected_shape: tuple, device: str, dtype) -> None:
    import torch

    if not isinstance(value, torch.Tensor):
        _fail(case, f"{what} is {_kind(value)}")
    if tuple(value.shape) != tuple(expected_shape):
        _fail(case, f"{what} has shape {list(value.shape)}, expected {list(expected_shape)}")
    if dtype is not None and value.dtype != dtype:
        _fail(case, f"{what} has dtype {value.dtype}, expected {dtype} (the inputs')")
    if value.device.type != torch.device(device).type:
        _fail(case, f"{what} is on device {value.device}, expected {device}")
    if value.layout != torch.strided:
        _fail(case, f"{what} has layout {value.layout}, expected a dense tensor (torch.strided)")


def _kind(value: Any, tensor: str = "a tensor") -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return tensor
    return "None" if value is None else f"a {type(value).__name__}, not a tensor"


def _fail(case, problem: str) -> None:
    raise ContractError(f"{case.mode}: {problem}; the backend contract (docs/backends.md): "
                        f"{CONTRACT[case.mode]}")
