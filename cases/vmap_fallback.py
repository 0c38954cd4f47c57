"""vmap's per-point fallback while the suite evaluates a mod (cases/pointwise.py): the switch
that turns it off, and how an operation it then refuses is run. An operation with no batching
rule runs once per point under the fallback, about 10^4 times slower (docs/oracle.md)."""
from __future__ import annotations

import threading

import torch

#: What vmap raises at an operation with no batching rule while its fallback is off.
FALLBACK_OFF = "hit the vmap fallback which is currently disabled"

#: vmap's fallback switch is process-wide: one evaluation at a time turns it off, and the
#: thread that computes a golden and the one that checks the next case's mods take turns. A
#: torch.vmap of another thread of this process, outside these evaluations, would meet it off
#: (the suite has none: backends, create_block_mask and eager flex_attention run in the child).
FALLBACK_SWITCH = threading.RLock()


#: In-place operations with no batching rule (torch 2.13) whose out-of-place twin, on a copy
#: written back with ``copy_``, gives the in-place values and dtypes bit for bit, checked one by
#: one on float64, float32, 16-bit, int and bool tensors (an outside review, 2026-12-06). Others
#: differ in what they refuse (``float_power_`` and ``heaviside_`` on float32, ``detach_`` of a
#: view) or are another function (``resize_as_``): they run per point.
_TWIN_WRITTEN_BACK = frozenset({
    "clamp_", "clip_", "fmod_", "remainder_", "floor_divide_", "hypot_", "xlogy_",
    "nextafter_", "ldexp_", "subtract_", "fix_", "square_", "negative_", "conj_physical_",
    "addcmul_", "addcdiv_", "masked_fill_", "tril_", "triu_", "eq_", "ne_", "not_equal_",
    "ge_", "greater_equal_", "gt_", "greater_", "le_", "less_equal_", "lt_", "less_"})


def without_batching_rule(func, args, kwargs):
    """``func(*args, **kwargs)``, an operation vmap has no batching rule for, as vmap gives it:
    an in-place one of ``_TWIN_WRITTEN_BACK`` as its out-of-place twin on a copy, written back
    with ``copy_`` (batched where the twin has a rule), refused as the in-place one is where its
    result's dtype cannot be written into the tensor (a float result into an int tensor); any
    other, and one whose twin has no rule either, with the fallback on for this call, per
    point. The refused call wrote nothing: vmap refuses before the operation runs."""
    from torch._C import _functorch

    name = getattr(func, "__name__", "")
    twin = getattr(torch.Tensor, name[:-1], None) if name in _TWIN_WRITTEN_BACK else None
    if twin is not None and args and isinstance(args[0], torch.Tensor):
        target = args[0]
        try:
            out = twin(target.clone(), *args[1:], **kwargs)
        except RuntimeError as exc:
            if FALLBACK_OFF not in str(exc):
                raise
            out = None  # masked_fill with a tensor value: no rule either
        if isinstance(out, torch.Tensor):
            if not torch.can_cast(out.dtype, target.dtype):
                raise RuntimeError(f"result type {_type_name(out.dtype)} can't be cast to the "
                                   f"desired output type {_type_name(target.dtype)}")
            return target.copy_(out)
    _functorch._set_vmap_fallback_enabled(True)
    try:
        return func(*args, **kwargs)
    finally:
        _functorch._set_vmap_fallback_enabled(False)


def _type_name(dtype: torch.dtype) -> str:
    """torch's own name for ``dtype`` in its messages (Float, Long, BFloat16)."""
    return torch.empty((), dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def fallback_refused_in(exc: BaseException) -> bool:
    """Whether vmap's refusal of its fallback is ``exc``, its cause or its context (what a
    ModRaised wraps)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if FALLBACK_OFF in str(exc):
            return True
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    return False
