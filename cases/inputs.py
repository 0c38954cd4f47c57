"""Deterministic inputs of a case: derived from the case id and the run seed only.

Values are drawn in float32 from N(0, 1) with a generator seeded from sha256(id, seed), times
the case's input scale, then rounded to the case dtype. The golden reference consumes exactly
these rounded values. The output gradient of a backward case (dO) is drawn the same way from
its own seed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from cases.model import Case

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def input_seed(case_id: str, seed: int) -> int:
    """A 63-bit generator seed that depends on the case id and the run seed only."""
    digest = hashlib.sha256(f"{case_id}|seed={seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor  # [B, Hq, Sq, D]
    k: torch.Tensor  # [Bkv, Hkv, Skv, D]
    v: torch.Tensor  # [Bkv, Hkv, Skv, D]

    def to(self, device: torch.device | str) -> "Inputs":
        return Inputs(self.q.to(device), self.k.to(device), self.v.to(device))


def make_inputs(case: Case, seed: int = 0) -> Inputs:
    """The case's q, k, v on the CPU in the case dtype (bit-identical for the same id and seed)."""
    s = case.shape
    gen = torch.Generator().manual_seed(input_seed(case.id, seed))
    dtype = torch_dtype(case.dtype)

    def draw(*size: int) -> torch.Tensor:
        values = torch.randn(*size, generator=gen, dtype=torch.float32)
        return (values * case.input_scale if case.input_scale != 1 else values).to(dtype)

    q = draw(s.B, s.Hq, s.Sq, s.D)
    k = draw(s.Bkv, s.Hkv, s.Skv, s.D)
    v = draw(s.Bkv, s.Hkv, s.Skv, s.D)
    return Inputs(q, k, v)


def make_grad_output(case: Case, seed: int = 0) -> torch.Tensor:
    """dO of a backward case: [B, Hq, Sq, D] in the case dtype, deterministic like the inputs."""
    s = case.shape
    gen = torch.Generator().manual_seed(input_seed(case.id + "|grad_out", seed))
    return torch.randn(s.B, s.Hq, s.Sq, s.D, generator=gen).to(torch_dtype(case.dtype))
