"""Padding written as a score mod, the way Hugging Face models build an attention mask: the
padded positions of each sequence get a large negative constant instead of being masked, so a
padded query row sees every key hidden by the same constant. Four constants, as models write
them: float32's min (``torch.finfo(torch.float32).min``), the score's own dtype's min
(``torch.finfo(score.dtype).min``: the case dtype's, as flex_attention traces the mod and the
golden reads it, cases/score_dtype.py), -1e30, and -1e4.

For tests/test_overflow_rows.py: the first three hide rows beyond flex_attention's log2 units
in some dtype (reference/overflow_rows.py), the last hides rows within range. Each fill either
replaces the score (``torch.where``) or is added to it (HF's additive 4D mask)."""
from __future__ import annotations

import torch

from cases.catalog import check_profile
from cases.model import MODES, Case, Shape, Variant
from cases.variants import Mods, builder

FILLS = ("f32min", "dtypemin", "1e30", "1e4")
#: "where": the fill replaces the score; "add": it is added to it, as HF adds its 4D mask
FORMS = ("where", "add")
FORMS_AND_FILLS = tuple((form, fill) for form in FORMS for fill in FILLS)


def pad_by_score(fill: str, form: str = "where") -> Variant:
    """Batch b holds ``3 S / 4`` and then ``S / 2`` real tokens; a pair with a padded query or
    key gets ``fill`` instead of its score (``form`` "where") or added to it ("add")."""
    return Variant("pad_by_score", (("fill", fill), ("form", form)))


@builder("pad_by_score")
def _build_pad_by_score(variant, shape, device) -> Mods:
    fill, form = variant.param("fill"), variant.param("form")
    lengths = torch.tensor([shape.Sq * 3 // 4, shape.Sq // 2] * shape.B, device=device)[:shape.B]

    def fill_value(score):
        if fill == "f32min":
            return torch.finfo(torch.float32).min
        if fill == "dtypemin":
            return torch.finfo(score.dtype).min
        return -float(fill)

    def padded_score(score, b, h, q_idx, kv_idx):
        padded = (q_idx >= lengths[b]) | (kv_idx >= lengths[b])
        return torch.where(padded, fill_value(score), score)

    def padded_bias(score, b, h, q_idx, kv_idx):
        padded = (q_idx >= lengths[b]) | (kv_idx >= lengths[b])
        return score + torch.where(padded, fill_value(score), torch.zeros_like(score))

    return Mods(None, padded_score if form == "where" else padded_bias)


@builder("pad_twice")
def _build_pad_twice(variant, shape, device) -> Mods:
    """Left padding of S/4 tokens in batch 0 as two additive float32 mins, one for a padded
    query and one for a padded key, under a causal mask (an outside review): a padded query
    sees only padded keys, whose score plus twice the min is -inf in float32 and -6.8e38 in
    float64, a row hidden by overflow (reference/overflow_rows.py), lse -inf in the
    baseline."""
    pads = torch.tensor([shape.Sq // 4, 0] * shape.B, device=device)[:shape.B]
    least = torch.finfo(torch.float32).min

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def biased(score, b, h, q_idx, kv_idx):
        return (score + torch.where(q_idx < pads[b], least, 0.0)
                + torch.where(kv_idx < pads[b], least, 0.0))

    return Mods(causal, biased)


def padded_rows(case: Case) -> torch.Tensor:
    """[B, Hq, Sq] bool: the rows whose query is padding (every key hidden by the fill)."""
    s = case.shape
    lengths = torch.tensor([s.Sq * 3 // 4, s.Sq // 2] * s.B)[:s.B]
    rows = torch.arange(s.Sq).view(1, -1) >= lengths.view(-1, 1)
    return rows.view(s.B, 1, s.Sq).expand(s.B, s.Hq, s.Sq)


def cases(profile: str) -> list[Case]:
    """``smoke``: forward and lse (what the CPU backends run); ``full``: the backward too, for
    a GPU (docs/results/README.md: which answer the Triton template gives on these rows)."""
    modes = ("fwd", "fwd+lse") if check_profile(profile) == "smoke" else MODES
    tags = frozenset({"custom", profile})
    shape = Shape(B=2, Hq=4, Hkv=2, Sq=128, Skv=128, D=32)
    return [Case(pad_by_score(fill, form), shape, dtype, mode, tags=tags)
            for form, fill in FORMS_AND_FILLS for dtype in ("bf16", "fp16", "fp32")
            for mode in modes]
