"""The values the catalog's variants accept for their parameters, checked where a person gives
them (a case spec file): a window of -5 keys, a cap of 0 or a window of 1e30 builds mods that
mask every key, divide by zero or overflow int64 in the mask, and would run as a case."""
from __future__ import annotations

import math

from cases.model import Variant

#: The largest whole-number parameter: a position, length or count in a sequence.
_LARGEST_WHOLE = 2**31 - 1

#: variant -> parameter -> (whole number?, smallest value, what it is)
_LIMITS: dict[str, dict[str, tuple[bool, float, str]]] = {
    "sliding_window": {"w": (True, 1, "the window's length in keys")},
    "prefix_lm": {"p": (True, 0, "the prefix's length in keys")},
    "softcap": {"cap": (False, 0, "the cap of tanh(score / cap) * cap")},
    "rel_bias": {"nb": (True, 1, "the number of buckets")},
    "padded_causal": {"v": (True, 0, "the number of valid tokens")},
}


def param_problem(variant: Variant) -> str | None:
    """What is wrong with a parameter value of a catalog variant (its key, its value, what to
    give instead), or None: every value in range, or a variant the table does not know
    (a custom variant's builder judges its own)."""
    limits = _LIMITS.get(variant.name, {})
    for key, value in variant.params:
        if key not in limits:
            continue
        whole, smallest, meaning = limits[key]
        if whole:
            fine = (float(value).is_integer() and smallest <= value <= _LARGEST_WHOLE)
            wanted = f"a whole number from {smallest:g} to {_LARGEST_WHOLE}"
        else:
            fine = math.isfinite(value) and value > smallest
            wanted = f"a finite number above {smallest:g}"
        if not fine:
            return f"its {key} is {value!r}; give {wanted} ({meaning})"
    return None
