"""The matrices: which cases a profile holds, and lookup of a case by id.

The core gating matrix is 8 variants x batch {1, 2, 4} x sequence {1024, 2048, 4096, 8192},
Hq = Hkv = 8, D = 128, bfloat16, forward: 96 cases. The ``smoke`` profile keeps that structure
with every length and length-like parameter divided by 8.
"""
from __future__ import annotations

from typing import Callable, Iterable

from cases import variants as v
from cases.model import Case, Shape, Variant

PROFILES = ("full", "smoke")
_LENGTH_DIVISOR = {"full": 1, "smoke": 8}

CORE_BATCHES = (1, 2, 4)
CORE_SEQ_LENS = (1024, 2048, 4096, 8192)
CORE_HEADS = 8
CORE_HEAD_DIM = 128
SLIDING_WINDOW = 1024
SOFTCAP = 50.0
REL_BIAS_BUCKETS = 32

#: The eight core variants, each as a function of the sequence length and the profile's
#: length divisor (lengths and length-like parameters scale with the profile).
CORE_VARIANTS: tuple[tuple[str, Callable[[int, int], Variant]], ...] = (
    ("full", lambda seq, div: v.full()),
    ("causal", lambda seq, div: v.causal()),
    ("sliding_window", lambda seq, div: v.sliding_window(SLIDING_WINDOW // div)),
    ("prefix_lm", lambda seq, div: v.prefix_lm(seq // 4)),
    ("document", lambda seq, div: v.document()),
    ("alibi", lambda seq, div: v.alibi()),
    ("softcap", lambda seq, div: v.softcap(SOFTCAP)),
    ("rel_bias", lambda seq, div: v.rel_bias(REL_BIAS_BUCKETS)),
)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of: {', '.join(PROFILES)}")
    return profile


def core_matrix(profile: str = "full") -> list[Case]:
    """The 96 gating cases of ``profile``, in a fixed order (variant, batch, sequence)."""
    div = _LENGTH_DIVISOR[check_profile(profile)]
    cases = []
    for _, make_variant in CORE_VARIANTS:
        for batch in CORE_BATCHES:
            for full_seq in CORE_SEQ_LENS:
                seq = full_seq // div
                shape = Shape(batch, CORE_HEADS, CORE_HEADS, seq, seq, CORE_HEAD_DIM)
                cases.append(Case(make_variant(seq, div), shape, "bf16", "fwd",
                                  tags=frozenset({"core", profile})))
    return cases


def matrix(profile: str = "full", name: str = "core") -> list[Case]:
    """All cases of matrix ``name`` in ``profile``."""
    if name == "core":
        return core_matrix(profile)
    raise ValueError(f"unknown matrix {name!r}; available: core")


def find_case(case_id: str, candidates: Iterable[Case] | None = None) -> Case:
    """The case with id ``case_id`` among ``candidates`` (default: every profile's core)."""
    pool = candidates if candidates is not None else [
        c for p in PROFILES for c in core_matrix(p)]
    for case in pool:
        if case.id == case_id:
            return case
    raise KeyError(f"no case with id {case_id!r}; `flexconf list` prints the ids")
