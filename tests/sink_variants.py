"""An attention sink written as a score mod, as a third party writes one: key 0 gets a bias
``c`` added to its score, ``score + where(kv_idx == 0, c, 0)``, no mask. With a large ``c``
the sink holds nearly all of every row's weight, and every row's log-sum-exp is about ``c``:
a fused backward that recomputes P from a float32 lse (eager flex_attention's, FlashAttention's)
then draws a rounding of about u c in each P, which the baseline's backward does not
(reference/row_noise.py, _StoredLseRounding; tests/test_stored_lse.py)."""
from __future__ import annotations

import torch

from cases.model import Variant
from cases.variants import Mods, builder


def sink(bias: float) -> Variant:
    return Variant("sink_bias", (("c", bias),))


@builder("sink_bias")
def _build_sink(variant, shape, device) -> Mods:
    bias = float(variant.param("c"))

    def sink_bias(score, b, h, q_idx, kv_idx):
        return score + torch.where(kv_idx == 0, bias, 0.0)

    return Mods(None, sink_bias)
