"""Score mods that read the score's dtype, as third-party code writes them: flex_attention
traces a mod with the score in the query's dtype, so what such a mod computes depends on the
case's dtype (cases/score_dtype.py). For tests/test_score_dtype.py."""
from __future__ import annotations

import torch

from cases.catalog import check_profile
from cases.model import Case, Shape, Variant
from cases.variants import Mods, builder

#: Each reads ``score.dtype``. The first two return the score's dtype (16-bit in a 16-bit
#: case), the last two float32 or wider.
KINDS = ("softcap_to_dtype", "halved_to_dtype", "pad_add_dtypemin", "eps_slope")
RETURNS_SCORE_DTYPE = ("softcap_to_dtype", "halved_to_dtype")


def reads_score_dtype(kind: str) -> Variant:
    """softcap_to_dtype: ``(tanh(score.float() / 20) * 20).to(score.dtype)``;
    halved_to_dtype: ``(score * 0.5).to(score.dtype)``;
    pad_add_dtypemin: ``score + where(padded, finfo(score.dtype).min, 0)``, batch b holding
    ``3 S / 4`` then ``S / 2`` real tokens (HF's additive mask);
    eps_slope: ``score + finfo(score.dtype).eps * (kv_idx - q_idx)``."""
    return Variant("reads_score_dtype", (("kind", kind),))


@builder("reads_score_dtype")
def _build_reads_score_dtype(variant, shape, device) -> Mods:
    kind = variant.param("kind")
    lengths = torch.tensor([shape.Sq * 3 // 4, shape.Sq // 2] * shape.B, device=device)[:shape.B]

    def softcap_to_dtype(score, b, h, q_idx, kv_idx):
        return (torch.tanh(score.float() / 20.0) * 20.0).to(score.dtype)

    def halved_to_dtype(score, b, h, q_idx, kv_idx):
        return (score * 0.5).to(score.dtype)

    def pad_add_dtypemin(score, b, h, q_idx, kv_idx):
        padded = (q_idx >= lengths[b]) | (kv_idx >= lengths[b])
        return score + torch.where(padded, torch.finfo(score.dtype).min, 0.0)

    def eps_slope(score, b, h, q_idx, kv_idx):
        return score + torch.finfo(score.dtype).eps * (kv_idx - q_idx)

    mods = {"softcap_to_dtype": softcap_to_dtype, "halved_to_dtype": halved_to_dtype,
            "pad_add_dtypemin": pad_add_dtypemin, "eps_slope": eps_slope}
    return Mods(None, mods[kind])


def inplace_softcap_padded() -> Variant:
    """``(score / 20).tanh_().mul_(20) + where(q_idx >= 3 S / 4, -1e4, 0)``: in place, so
    autograd cannot run back through it (flex_attention runs it forward only), and rows whose
    every score is about -1e4. Not in ``cases``: tests/test_score_dtype.py builds its cases."""
    return Variant("inplace_softcap_padded", ())


@builder("inplace_softcap_padded")
def _build_inplace_softcap_padded(variant, shape, device) -> Mods:
    padded_from = shape.Sq * 3 // 4

    def inplace_softcap_padded(score, b, h, q_idx, kv_idx):
        capped = (score / 20.0).tanh_().mul_(20.0)
        return capped + torch.where(q_idx >= padded_from, -1e4, 0.0)
    return Mods(None, inplace_softcap_padded)


def doubled_in_place() -> Variant:
    """``score.mul_(2)``: the score changed in place (flex_attention runs it forward). Not in
    ``cases``: tests/test_score_dtype.py builds its case."""
    return Variant("doubled_in_place", ())


@builder("doubled_in_place")
def _build_doubled_in_place(variant, shape, device) -> Mods:
    def doubled_in_place(score, b, h, q_idx, kv_idx):
        return score.mul_(2.0)
    return Mods(None, doubled_in_place)


def cases(profile: str) -> list[Case]:
    """Forward, and forward with the lse, in each dtype (``full`` adds the backward)."""
    modes = ("fwd", "fwd+lse") if check_profile(profile) == "smoke" else ("fwd", "fwd+lse",
                                                                           "fwd+bwd")
    shape = Shape(B=2, Hq=4, Hkv=2, Sq=128, Skv=128, D=32)
    return [Case(reads_score_dtype(kind), shape, dtype, mode, tags=frozenset({"custom", profile}))
            for kind in KINDS for dtype in ("bf16", "fp16", "fp32") for mode in modes]
