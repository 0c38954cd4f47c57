"""The float32 gradient verdict with and without the sizes of a float32 kernel's own
arithmetic in delta (reference/row_noise.py, _float32_delta_variance), for docs/oracle.md
("Float32 delta").

Correct backwards: the FlashAttention-style backward of tests/fa_style_backward.py taking
delta from eager flex_attention's output (``fused``) and from a forward in the order of
flex_attention's Triton template (``online``: tests/float32_forward.py, online_forward), and
eager flex_attention's own backward (``eager``, its device check lifted, as in
benchmarks/float16_gradient_probe.py). Broken ones, from ``fused``: delta from O rounded to
bfloat16 or to TF32's 10-bit mantissa (a backward that keeps a coarser copy of O), dP from
TF32 operands, the busiest dQ or dK row 1e-4 or 1e-5 off, all of dQ 1e-5 off. The gradient
probes' edge shapes x full, causal, ALiBi, soft-capping and two ALiBi-like composed mods,
inputs x1 and x4. For each: runs, how many fail (correct) or are caught (broken) with the
sizes and without them, and the largest margin of any rule with them (correct: the worst;
broken: the weakest over the runs caught).

    python benchmarks/float32_gradient_probe.py --seeds 3
    python benchmarks/float32_gradient_probe.py --seeds 2 --shapes many-rows
"""
from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from cases.inputs import make_grad_output, make_inputs  # noqa: E402
from cases.model import Case, Shape  # noqa: E402
from cases.variants import build_mods  # noqa: E402
from float16_gradient_probe import SHAPES, VARIANTS, busiest_row_off, print_table, probe  # noqa: E402
from reference import row_noise  # noqa: E402
from reference.golden import Reference  # noqa: E402
from tests.fa_style_backward import eager_backward, fa_style_gradients, tf32  # noqa: E402
from tests.float32_forward import online_forward  # noqa: E402
from tests.test_gradient_verdict import correct_backward  # noqa: E402

#: Beside the edge shapes, shapes of many rows, where a row's rare large draw shows.
MANY_ROWS = [Shape(2, 4, 4, 1024, 1024, 64), Shape(1, 8, 4, 1024, 1024, 128)]
CORRECT = ("eager", "fused", "online")
BROKEN = ("delta_o_bf16", "delta_o_tf32", "dp_tf32", "dq_row_1e-4", "dq_row_1e-5",
          "dk_row_1e-4", "dq_all_1e-5")


def observed(case: Case, seed: int, kind: str, fused: Reference) -> Reference | None:
    if kind == "eager":
        return eager_backward(case, seed)
    if kind == "fused":
        return fused
    if kind == "dp_tf32":
        return correct_backward(case, seed, kind)[2]
    if kind in ("online", "delta_o_bf16", "delta_o_tf32"):
        inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
        out = online_forward(case, inputs) if kind == "online" else fused.out
        stored = {"online": out, "delta_o_bf16": out.bfloat16().float(),
                  "delta_o_tf32": tf32(out)}[kind]
        return Reference(out, None, fa_style_gradients(case, inputs, grad_out, stored))
    grads = fused.grads
    if kind == "dq_all_1e-5":
        return replace(fused, grads=dict(grads, dq=grads["dq"] * (1 + 1e-5)))
    name, off = kind[:2], float(kind.split("_")[2])
    return replace(fused, grads=busiest_row_off(grads, name, 1 + off))


def without_sizes(case: Case, seed: int, golden: Reference) -> Reference:
    """The golden with the float32 delta sizes taken out of its dQ and dK row noise (what
    cancels is sized again with O's last rounding alone; they are not in its unshared
    noise)."""
    inputs, grad_out = make_inputs(case, seed), make_grad_output(case, seed)
    mods = build_mods(case.variant, case.shape)
    sized = row_noise.cancelling_magnitudes(case, inputs, mods, golden.out, golden.lse,
                                            grad_out)
    with mock.patch.object(row_noise, "_float32_delta_variance",
                           lambda t: torch.zeros_like(t.lse)):
        unsized = row_noise.cancelling_magnitudes(case, inputs, mods, golden.out, golden.lse,
                                                  grad_out)
    return replace(golden, row_noise=dict(golden.row_noise, **{
        name: golden.row_noise[name] - sized[name] + unsized[name] for name in sized}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--shapes", choices=("edge", "many-rows"), default="edge",
                        help="the gradient probes' edge shapes, or MANY_ROWS")
    args = parser.parse_args()
    shapes = SHAPES if args.shapes == "edge" else MANY_ROWS
    print_table(probe(shapes, VARIANTS, args.seeds, CORRECT, BROKEN, observed, without_sizes,
                      dtypes=("fp32",)))


if __name__ == "__main__":
    main()
