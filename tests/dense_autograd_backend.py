"""A backend that computes attention as plain dense float32 operations and differentiates it
with plain autograd, as a third-party backend without flex_attention might (its mods are
evaluated on broadcast index grids, which the tests' mods allow), and one that is wrong the
simplest way such a backend can be: its output does not depend on q."""
from __future__ import annotations

import math

import torch

from cases.model import Case
from conformance.backends.cpu import CpuEager


class DenseAutograd(CpuEager):
    name = "test-dense-autograd"

    def unsupported_reason(self, case: Case) -> str | None:
        return None  # plain autograd runs every mode, the backward on the CPU too

    def prepare(self, case: Case):
        group = case.shape.Hq // case.shape.Hkv

        def dense(q, k, v, score_mod, block_mask):
            batches, heads, rows, dim = q.shape
            k, v = (t.float().repeat_interleave(group, 1) for t in (k, v))
            b = torch.arange(batches).view(-1, 1, 1, 1)
            h = torch.arange(heads).view(1, -1, 1, 1)
            q_idx, kv_idx = torch.arange(rows).view(-1, 1), torch.arange(k.shape[2])
            scores = self.queries(q).float() @ k.transpose(-1, -2) / math.sqrt(dim)
            if score_mod is not None:
                scores = score_mod(scores, b, h, q_idx, kv_idx)
            if block_mask is not None:
                seen = block_mask.mask_mod(b, h, q_idx, kv_idx)
                scores = scores.masked_fill(~seen, -math.inf)
            return (scores.softmax(-1) @ v).to(q.dtype)

        return dense

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        return q


class IgnoresQueries(DenseAutograd):
    """Attends with the queries detached: the output does not depend on q, so autograd gives
    no dQ at all."""

    name = "test-ignores-queries"

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        return q.detach()
