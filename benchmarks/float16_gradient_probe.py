"""The 16-bit gradient verdict with and without the float16 underflow sizes
(reference/underflow_noise.py, underflow_magnitudes), for docs/oracle.md ("Float16 gradient rows").

Correct backwards: eager flex_attention's own (``eager``: torch refuses a CPU backward, so
this probe lifts its device check for the call, and resets Dynamo before it: eager's backward
traces the mods, and state left by one variant made the next raise; where eager raises, the
run is counted as skipped), and the FlashAttention-style backward of
tests/fa_style_backward.py rounding dS as fused kernels do (``fused``) and as eager does,
times the softmax scale (``eager_rounding``). Broken ones, from the fused backward: P or dS
rounded to bfloat16 in a float16 case, the busiest dQ row 1% off, dK or dV row 1% or 3% off,
all of dQ 1% off. Edge shapes x full, causal, ALiBi, soft-capping and two ALiBi-like composed
mods (VARIANTS), bf16 and fp16, inputs x1 and x4. For each: runs, how many fail (correct) or
are caught (broken) with the sizes and without them, and the largest margin of any rule with
them (correct: the worst; broken: the weakest over the runs caught).

    python benchmarks/float16_gradient_probe.py --seeds 5
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

from cases import variants as v  # noqa: E402
from cases.composed import Atom, composed  # noqa: E402
from cases.inputs import make_grad_output, make_inputs  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from cases.variants import build_mods  # noqa: E402
from reference.golden import Reference  # noqa: E402
from reference.underflow_noise import underflow_magnitudes  # noqa: E402
from reference.verdict import judge  # noqa: E402
from tests.fa_style_backward import eager_backward  # noqa: E402
from tests.test_gradient_verdict import correct_backward  # noqa: E402

#: Decoding, few keys, GQA, odd lengths, head dims 8 to 256 (the eager probes' shapes).
SHAPES = [Shape(1, 2, 2, 1, 67, 16), Shape(2, 4, 4, 7, 300, 64), Shape(1, 4, 2, 33, 129, 256),
          Shape(2, 4, 2, 129, 200, 16), Shape(1, 2, 1, 17, 17, 8), Shape(3, 2, 2, 1, 1, 8),
          Shape(1, 4, 1, 5, 64, 128), Shape(2, 2, 2, 64, 64, 32), Shape(1, 8, 2, 2, 513, 64)]
#: ALiBi with slopes 2^-8h/H on k - q both ways (keys past a row weigh most: a key that few rows
#: attend has a dV row made of P below float16's normal range), and the same nearly ignoring
#: the score (scaled by 0.01 first).
VARIANTS = [v.full(), v.causal(), v.alibi(), v.softcap(5.0), composed(None, [Atom("alibi", 8)]),
            composed(None, [Atom("scale", 0.01), Atom("alibi", 8)])]
CORRECT = ("eager", "fused", "eager_rounding")
#: The verdict's margins (error over limit) on each of dQ, dK and dV: a run fails on any.
MARGINS = ("global_margin", "worst_head_margin", "worst_row_margin")
BROKEN = ("p_bf16", "ds_bf16", "dq_row_1pct", "dk_row_1pct", "dk_row_3pct", "dq_all_1pct",
          "dv_row_1pct", "dv_row_3pct")


def busiest_row_off(grads: dict, name: str, factor: float) -> dict:
    """``grads`` with the row of ``name`` (dq, dk or dv) of the largest RMS times ``factor``."""
    grad = grads[name].float().clone()
    rows = grad.pow(2).mean(-1)
    grad[torch.unravel_index(rows.argmax(), rows.shape)] *= factor
    return dict(grads, **{name: grad.to(grads[name].dtype)})


def observed(case: Case, seed: int, kind: str, fused: Reference) -> Reference | None:
    if kind == "eager":
        return eager_backward(case, seed)
    if kind == "fused":
        return fused
    if kind == "eager_rounding":
        return correct_backward(case, seed, ds_scaled=True)[2]
    if kind in ("p_bf16", "ds_bf16"):  # a loss only where the case dtype is finer than bf16
        return correct_backward(case, seed, kind)[2] if case.dtype == "fp16" else None
    grads = fused.grads
    if kind == "dq_all_1pct":
        return replace(fused, grads=dict(grads, dq=(grads["dq"].float() * 1.01)
                                         .to(grads["dq"].dtype)))
    name, percent = kind[:2], float(kind.split("_")[2].rstrip("pct"))
    return replace(fused, grads=busiest_row_off(grads, name, 1 + percent / 100))


def without_sizes(case: Case, seed: int, golden: Reference) -> Reference:
    """The golden with the underflow sizes taken out of its row noise, and their share out
    of the noise the global and head rules add (one RMS, a quarter of the size; bf16: nothing
    to take)."""
    if case.dtype != "fp16":
        return golden
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    lost = underflow_magnitudes(case, inputs, build_mods(case.variant, case.shape), golden.out,
                                golden.lse, grad_out)
    unshared = {name: (golden.unshared_noise[name].square() - (size / 4).square())
                .clamp_min(0.0).sqrt() for name, size in lost.items()}
    return replace(golden, unshared_noise=unshared, row_noise=dict(
        golden.row_noise, **{name: golden.row_noise[name] - lost[name] for name in lost}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", metavar="TOKEN",
                        help="only these of VARIANTS (their tokens, e.g. composed-alibi8)")
    args = parser.parse_args()
    variants = [var for var in VARIANTS if not args.variants or var.token in args.variants]
    if not variants:
        parser.error(f"--variants: none of {args.variants} is one of "
                     f"{', '.join(var.token for var in VARIANTS)}")
    print_table(probe(SHAPES, variants, args.seeds, CORRECT, BROKEN, observed, without_sizes))


def probe(shapes, variants, seeds: int, correct: tuple, broken: tuple, observed, without,
          dtypes: tuple = ("bf16", "fp16")):
    """Every shape x variant x dtype (bf16/fp16) x inputs x1/x4 x seed, judged with the golden and
    with ``without(case, seed, golden)``: ``{(dtype, scale, kind): [runs, failed with,
    failed without, extreme margin, skipped, worst margin without (correct kinds)]}``
    (``observed(case, seed, kind, fused)`` gives each kind's answer, None to skip it)."""
    table: dict = defaultdict(lambda: [0, 0, 0, None, 0, None])
    for shape, variant, dtype, scale in itertools.product(shapes, variants, dtypes, (1, 4)):
        case = Case(variant, shape, dtype, "fwd+bwd", scale)
        for seed in range(seeds):
            golden, baseline, fused = correct_backward(case, seed)
            golden_without = without(case, seed, golden)
            for kind in correct + broken:
                row = table[(dtype, scale, kind)]
                answer = observed(case, seed, kind, fused)
                if answer is None:
                    row[4] += kind == "eager"
                    continue
                verdict = judge(case, golden, baseline, answer)
                verdict_without = judge(case, golden_without, baseline, answer)
                row[0] += 1
                row[1] += not verdict.passed
                row[2] += not verdict_without.passed
                margin = _largest_margin(verdict)
                if kind in correct:
                    row[3] = max(row[3] or 0.0, margin)
                    row[5] = max(row[5] or 0.0, _largest_margin(verdict_without))
                elif not verdict.passed:
                    row[3] = margin if row[3] is None else min(row[3], margin)
    return table


def _largest_margin(verdict) -> float:
    return max(verdict.metrics[name][rule] for name in ("dq", "dk", "dv") for rule in MARGINS)


def print_table(table: dict) -> None:
    print("| dtype | inputs | backward | runs (skipped) | failed (correct) or caught (broken): "
          "with / without the sizes | margin with them, any rule: worst (correct; without "
          "them in brackets) or weakest caught (broken) |")
    print("|---|---|---|---|---|---|")
    for (dtype, scale, kind), (runs, with_, without_, margin, skipped, margin_without) \
            in table.items():
        if not runs + skipped:  # a loss that does not apply to the dtype
            continue
        shown = "-" if margin is None else f"{margin:.3g}"
        if margin_without is not None:
            shown += f" ({margin_without:.3g})"
        runs_shown = f"{runs} ({skipped})" if skipped else str(runs)
        print(f"| {dtype} | x{scale} | {kind} | {runs_shown} | {with_} / {without_} | {shown} |")


if __name__ == "__main__":
    main()
