"""The 16-bit gradient verdict where key/value heads are shared (GQA groups, one key/value
batch for every batch), with and without the partial sums' sizes (reference/row_noise.py,
partial_sum_magnitudes), for docs/oracle.md ("Shared key/value heads").

Correct backwards: eager flex_attention's own (``eager``, as benchmarks/float16_gradient_probe.py
runs it: device check lifted, Dynamo reset), the FlashAttention-style backward of
tests/fa_style_backward.py summing shared heads in float32 and rounding once (``fused``, as
flex_attention's Triton template does), and the same rounding each query head's and batch's
dK and dV, then each group's sum, as eager does (``eager_partials``). Broken ones, from the
fused backward: the busiest dK or dV row 1% or 3% off, all of dK or dV 1% off, each query
head's dK and dV rounded to bfloat16 before the sums (float16 cases). For each: runs, how many
fail (correct) or are caught (broken) with the sizes and without them, and the largest margin
of any rule with them (correct: the worst; broken: the weakest over the runs caught).

    python benchmarks/shared_heads_probe.py --seeds 4
"""
from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")


from cases import variants as v  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from float16_gradient_probe import busiest_row_off, print_table, probe  # noqa: E402
from reference.golden import Reference  # noqa: E402
from tests.fa_style_backward import PARTIALS_BF16, eager_backward  # noqa: E402
from tests.test_gradient_verdict import correct_backward  # noqa: E402
from tests.test_shared_heads import without_sizes  # noqa: E402

#: GQA groups of 2 to 16, one key/value batch for 2 to 8 batches, both; decoding to S1000.
SHAPES = [Shape(2, 4, 2, 129, 200, 16), Shape(1, 8, 1, 64, 300, 32),
          Shape(4, 4, 4, 33, 129, 64, Bkv=1), Shape(4, 16, 1, 16, 1000, 8, Bkv=1),
          Shape(8, 8, 2, 1, 513, 64, Bkv=1), Shape(2, 16, 2, 40, 40, 128, Bkv=1)]
VARIANTS = [v.full(), v.causal(), v.alibi(), v.softcap(5.0)]
CORRECT = ("eager", "fused", "eager_partials")
BROKEN = ("dk_row_1pct", "dk_row_3pct", "dv_row_1pct", "dv_row_3pct", "dk_all_1pct",
          "dv_all_1pct", "partials_bf16")


def observed(case: Case, seed: int, kind: str, fused: Reference) -> Reference | None:
    if kind == "eager":
        return eager_backward(case, seed)
    if kind == "fused":
        return fused
    if kind == "eager_partials":
        return correct_backward(case, seed, ds_scaled=True, partials_rounded=True)[2]
    if kind == "partials_bf16":  # a loss only where the case dtype is finer than bf16
        return correct_backward(case, seed, PARTIALS_BF16, ds_scaled=True,
                                partials_rounded=True)[2] if case.dtype == "fp16" else None
    name, where, percent = kind.split("_")
    factor = 1 + float(percent.rstrip("pct")) / 100
    if where == "all":
        return replace(fused, grads=dict(fused.grads, **{
            name: (fused.grads[name].float() * factor).to(fused.grads[name].dtype)}))
    return replace(fused, grads=busiest_row_off(fused.grads, name, factor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    print_table(probe(SHAPES, VARIANTS, args.seeds, CORRECT, BROKEN, observed, without_sizes))


if __name__ == "__main__":
    main()
