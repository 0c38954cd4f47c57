"""A case module that sets one of torch's process-wide settings when it is imported (cuDNN's
TF32 switch, which nothing on a CPU reads). Its cases must run as any others: the setting is
the module's, the same for every case, not a backend's leak (tests/test_executor_faults.py;
an outside review found such a module failing every case as the backend's RUNTIME_ERROR)."""
from __future__ import annotations

import torch

from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder

torch.backends.cudnn.allow_tf32 = False


@builder("settings_causal")
def _settings_causal(variant, shape, device):
    return Mods(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx, None)


CASE = Case(Variant("settings_causal"), Shape(1, 2, 2, 64, 64, 16))


def cases(profile: str) -> list[Case]:
    return [CASE]


@builder("settings_leaking_builder")
def _settings_leaking_builder(variant, shape, device):
    """Makes its table in float64 by switching the default dtype, and forgets to switch back."""
    torch.set_default_dtype(torch.float64)
    table = torch.zeros(shape.Hq)
    return Mods(None, lambda score, b, h, q_idx, kv_idx: score + table[h])


LEAKING_CASE = Case(Variant("settings_leaking_builder"), Shape(1, 2, 2, 64, 64, 16))
