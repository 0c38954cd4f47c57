"""Two variants added to the conformance suite without editing it (docs/cases.md).

    PYTHONPATH=examples/custom_variants pytest conformance/ --cases-module my_variants

Each variant is attention-gym style: a constructor returning the variant as data (a name and
its parameters, which make the case id), and a builder registered with ``@builder`` that turns
the data into a mask mod for one shape. ``cases(profile)`` lists the cases the suite runs.
"""
from __future__ import annotations

import torch

from cases.catalog import check_profile
from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder


# --- dilated sliding window --------------------------------------------------------------------
def dilated_sliding_window(window: int, dilation: int) -> Variant:
    """Causal look-back window in which only every ``dilation``-th key is seen:
    query i sees key j iff 0 <= i - j < window and (i - j) % dilation == 0.
    (window 8, dilation 2: keys i, i-2, i-4, i-6.)"""
    return Variant("dilated_sliding_window", (("w", window), ("dil", dilation)))


@builder("dilated_sliding_window")
def _build_dilated_sliding_window(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    window, dilation = int(variant.param("w")), int(variant.param("dil"))

    def dilated_sliding_window_mask(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        return (distance >= 0) & (distance < window) & (distance % dilation == 0)

    return Mods(dilated_sliding_window_mask, None)


# --- global tokens plus a sliding window (Longformer) -----------------------------------------
def global_window(window: int, num_global: int) -> Variant:
    """Longformer: a symmetric local window plus global tokens. Query i sees key j iff
    |i - j| <= window, or j < num_global (every query sees the global tokens), or
    i < num_global (the global tokens see everything)."""
    return Variant("global_window", (("w", window), ("g", num_global)))


@builder("global_window")
def _build_global_window(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    window, num_global = int(variant.param("w")), int(variant.param("g"))

    def global_window_mask(b, h, q_idx, kv_idx):
        local = (q_idx - kv_idx).abs() <= window
        return local | (kv_idx < num_global) | (q_idx < num_global)

    return Mods(global_window_mask, None)


# --- the cases the suite runs --------------------------------------------------------------------
#: Parameters that are lengths: `flexconf shrink` scales them with the sequence length.
LENGTH_PARAMS = {"dilated_sliding_window": ("w",), "global_window": ("w", "g")}
_LENGTH_DIVISOR = {"full": 1, "smoke": 8}  # the smoke profile divides lengths by 8, like the core


def cases(profile: str) -> list[Case]:
    """Both variants at two lengths, B1 H8 D128 bf16 forward; window sizes scale with the profile."""
    div = _LENGTH_DIVISOR[check_profile(profile)]
    found = []
    for seq in (2048 // div, 4096 // div):
        shape = Shape(B=1, Hq=8, Hkv=8, Sq=seq, Skv=seq, D=128)
        for variant in (dilated_sliding_window(512 // div, 4), global_window(256 // div, 16 // div)):
            found.append(Case(variant, shape, "bf16", "fwd", tags=frozenset({"custom", profile})))
    return found


def fuzz_variants(shape: Shape) -> list[Variant]:
    """The variants the fuzzer may draw for a case of ``shape`` (docs/cases.md, "Fuzzing your
    variants"): windows from one key to the whole key length, the simplest first (a failure
    shrinks towards the first)."""
    windows = sorted({1, 4, max(1, shape.Skv // 3), shape.Skv})
    return ([dilated_sliding_window(w, d) for w in windows for d in (1, 2, 3)]
            + [global_window(w, g) for w in windows for g in (0, 1, 5)])
