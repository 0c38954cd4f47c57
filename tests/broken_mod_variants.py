"""Variants whose own mods are wrong at some points (not at b = h = q_idx = kv_idx = 0, where
the suite's first check evaluates them): a relative-position bias indexing its captured table
out of bounds, and a document mask whose captured document ids are too short. flex_attention
fails on them, compiled or eager, and so does the golden: the case is at fault, and its label
must say so, not blame the backend (tests/test_pointwise_execution.py). The third indexes
its table out of bounds only where its mask hides: the golden, which evaluates the score mod
only where the mask keeps, never meets the error, but eager flex_attention applies the score
mod at every point and a compiled one on every block not wholly masked."""
from __future__ import annotations

import torch

from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder

SHAPE = Shape(1, 2, 2, 64, 64, 16)


@builder("table_too_short")
def _build_table_too_short(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    table = torch.linspace(-1.0, 1.0, 10, device=device)  # needs Sq + Skv - 1 entries

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[q_idx - kv_idx + 5]

    return Mods(None, relative_bias)


@builder("documents_too_short")
def _build_documents_too_short(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    document = torch.arange(shape.Skv // 2, device=device) // 8  # half the keys have an id

    def same_document(b, h, q_idx, kv_idx):
        return document[q_idx] == document[kv_idx]

    return Mods(same_document, None)


@builder("table_short_where_masked")
def _build_table_short_where_masked(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    table = torch.linspace(-1.0, 1.0, 48, device=device)  # one entry per key the mask keeps

    def first_keys(b, h, q_idx, kv_idx):
        return kv_idx < 48

    def key_bias(score, b, h, q_idx, kv_idx):
        return score + table[kv_idx]

    return Mods(first_keys, key_bias)


NAMES = ("table_too_short", "documents_too_short", "table_short_where_masked")


def cases(profile: str) -> list[Case]:
    return [Case(Variant(name), SHAPE) for name in NAMES]
