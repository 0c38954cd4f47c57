"""Margins of the verdict on both sides, for docs/oracle.md.

Correct side: eager and compiled (cpu-inductor) flex_attention on every core variant, several
seeds; the largest margin of each rule (a margin is error / limit: above 1 fails).
Broken side: every fault of reference/faults.py on every variant it applies to; the smallest
margin of the strongest rule (how far past the limit the weakest catch is).

    python benchmarks/oracle_margins.py --profile smoke --seq 1024 --seeds 5
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from cases.catalog import core_matrix  # noqa: E402
from cases.inputs import make_inputs  # noqa: E402
from cases.variants import build_mods  # noqa: E402
from reference.faults import FAULTS  # noqa: E402
from reference.golden import baseline_attention, golden_attention  # noqa: E402
from reference.verdict import judge  # noqa: E402

RULES = ("global_margin", "worst_head_margin", "worst_row_margin")


def correct_side(cases, seeds: int) -> list[str]:
    lines = ["| path | variant | seeds | error ratio (max) | global | head | row | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for compiled in (False, True):
        for case in cases:
            mods = build_mods(case.variant, case.shape)
            s = case.shape
            bm = (create_block_mask(mods.mask_mod, None, None, s.Sq, s.Skv, "cpu")
                  if mods.mask_mod else None)
            torch._dynamo.reset()
            fn = (torch.compile(flex_attention, fullgraph=True, dynamic=False)
                  if compiled else flex_attention)
            worst = dict.fromkeys(RULES, 0.0)
            ratio, passed = 0.0, True
            for seed in range(seeds):
                inputs = make_inputs(case, seed)
                out = fn(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod, block_mask=bm)
                verdict = judge(case, golden_attention(case, inputs),
                                baseline_attention(case, inputs), out)
                passed &= verdict.passed
                ratio = max(ratio, verdict.metrics["error_ratio"])
                for rule in RULES:
                    worst[rule] = max(worst[rule], verdict.metrics[rule])
            lines.append(f"| {'inductor' if compiled else 'eager'} | {case.variant.token} | "
                         f"{seeds} | {ratio:.3f} | " +
                         " | ".join(f"{worst[r]:.2f}" for r in RULES) +
                         f" | {'all PASS' if passed else 'MISMATCH'} |")
            print(lines[-1], flush=True)
    return lines


def broken_side(cases) -> list[str]:
    lines = ["| fault | variants | caught | weakest catch (largest margin of that case) | rules that fired |",
             "|---|---|---|---|---|"]
    for name, (fault, applies) in FAULTS.items():
        applicable = [c for c in cases if applies(c)]
        caught, weakest, rules = 0, float("inf"), set()
        for case in applicable:
            inputs = make_inputs(case, 11)
            base = baseline_attention(case, inputs)
            verdict = judge(case, golden_attention(case, inputs), base, fault(case, inputs, base))
            caught += not verdict.passed
            weakest = min(weakest, max(verdict.metrics.get(r, 0.0) for r in RULES))
            rules |= set(verdict.metrics.get("failed_rules", []))
        lines.append(f"| {name} | {len(applicable)} | {caught}/{len(applicable)} | "
                     f"{weakest:.2f} | {', '.join(sorted(rules))} |")
        print(lines[-1], flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="smoke")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    cases = [c for c in core_matrix(args.profile)
             if c.shape.Sq == args.seq and c.shape.B == args.batch]
    print(f"cases: {len(cases)} ({cases[0].shape.token})")
    correct_side(cases, args.seeds)
    broken_side(cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
