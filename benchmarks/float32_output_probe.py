"""The float32 output verdict with and without the output rows' rounding magnitudes
(reference/row_noise.py), for docs/oracle.md ("Float32 output rows").

Correct float32 forwards whose roundings differ from the baseline's (tests/float32_forward.py:
reverse-order dot products, scores or the score mod rounded once from float64, the Triton
template's order of operations, eager flex_attention), and broken ones (TF32 operands, bfloat16 P, an exp accurate to 16, 18 or 20
bits, one output row 1e-4 or 1e-5 off), on edge shapes x full, causal, ALiBi, softcap 5 and 50,
inputs x1 and x4. For each: runs, how many fail (correct) or are caught (broken) with the
magnitudes and without them (the golden's row_noise dropped), and the worst row margin with
them (correct) or the weakest, over the runs caught without them (broken: runs the change does
not move, such as rows that one key decides, would show 0).

    python benchmarks/float32_output_probe.py --seeds 2
"""
from __future__ import annotations

import argparse
import itertools
import sys
import warnings
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from cases import variants as v  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from cases.variants import build_mods  # noqa: E402
from conformance import compat  # noqa: E402
from reference.golden import reference_pair  # noqa: E402
from reference.verdict import judge  # noqa: E402
from tests.float32_forward import float32_forward  # noqa: E402

#: Decoding, few keys, GQA, odd lengths, head dims 8 to 256.
SHAPES = [Shape(1, 2, 2, 1, 67, 16), Shape(2, 4, 4, 7, 300, 64), Shape(1, 4, 2, 33, 129, 256),
          Shape(2, 4, 2, 129, 200, 16), Shape(1, 2, 1, 17, 17, 8), Shape(3, 2, 2, 1, 1, 8),
          Shape(1, 4, 1, 5, 64, 128), Shape(2, 2, 2, 64, 64, 32), Shape(1, 8, 2, 2, 513, 64),
          Shape(1, 1, 1, 127, 127, 24), Shape(1, 4, 4, 256, 256, 64)]
VARIANTS = [v.full(), v.causal(), v.alibi(), v.softcap(5.0), v.softcap(50.0)]
CORRECT = ("eager", "reversed_sums", "rounded_scores", "rounded_mod", "online")
BROKEN = ("scores_tf32", "pv_tf32", "p_bf16", "exp_16_bits", "exp_18_bits", "exp_20_bits",
          "row_1e-4", "row_1e-5")


def observed(case: Case, inputs, kind: str) -> torch.Tensor:
    if kind == "eager":
        s, mods = case.shape, build_mods(case.variant, case.shape)
        block_mask = None if mods.mask_mod is None else \
            create_block_mask(mods.mask_mod, None, None, s.Sq, s.Skv, "cpu")
        return compat.attention(flex_attention, inputs.q, inputs.k, inputs.v, mods.score_mod,
                                block_mask, enable_gqa=s.Hq != s.Hkv)
    if kind.startswith("row_"):  # one row of the baseline's own operations, scaled
        out = float32_forward(case, inputs, "plain")
        out[0, 0, case.shape.Sq // 2] *= 1 + float(kind[4:])
        return out
    return float32_forward(case, inputs, kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    # (scale, kind) -> [runs, failed with, failed without, extreme margin with]
    table: dict = defaultdict(lambda: [0, 0, 0, None])
    for shape, variant, scale in itertools.product(SHAPES, VARIANTS, (1, 4)):
        case = Case(variant, shape, "fp32", "fwd", scale)
        for seed in range(args.seeds):
            inputs = make_inputs(case, seed)
            golden, baseline = reference_pair(case, inputs)
            without = replace(golden, row_noise=None)
            for kind in CORRECT + BROKEN:
                out = observed(case, inputs, kind)
                verdict = judge(case, golden, baseline, out)
                row = table[(scale, kind)]
                margin = verdict.metrics["worst_row_margin"]
                failed_without = not judge(case, without, baseline, out).passed
                row[0] += 1
                row[1] += not verdict.passed
                row[2] += failed_without
                if kind in CORRECT:
                    row[3] = max(row[3] or 0.0, margin)
                elif failed_without:
                    row[3] = margin if row[3] is None else min(row[3], margin)
    print("| inputs | kernel | runs | failed (correct) or caught (broken): with / without the "
          "magnitudes | row margin with them: worst (correct) or weakest caught before (broken) |")
    print("|---|---|---|---|---|")
    for (scale, kind), (runs, with_, without_, margin) in sorted(table.items()):
        shown = "-" if margin is None else f"{margin:.3g}"
        print(f"| x{scale} | {kind} | {runs} | {with_} / {without_} | {shown} |")


if __name__ == "__main__":
    main()
