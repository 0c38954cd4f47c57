"""Rows a score mod hides whole with a finite constant so large that flex_attention's kernels
overflow it: there, correct implementations give two different answers, and the verdict
accepts either (reference/verdict.py).

flex_attention's kernels work in log2 units: the Triton template multiplies each score by
log2(e) after the mod (``post_mod_scores *= RCP_LN2``), and the eager path divides its
log-sum-exp by ln(2) before the top-level op multiplies it back. A row whose scores are all
below -max * ln(2) (max: the largest finite value of the dtype the kernel holds them in) is
a row of -inf in log2 units. HF-style padding written as a
score mod does this: ``torch.where(pad, torch.finfo(torch.float32).min, score)``, or -1e30
in a float16 case. Measured on torch 2.13.0 (docs/oracle.md, "Rows hidden by overflow"):
- eager flex_attention keeps the exact softmax in the output (the mean of V over the row's
  keys) and returns lse = -inf (its ln(2) round trip overflows float32);
- the Triton template treats the row as fully masked (output 0, lse -inf): read from its
  source (torch/_inductor/kernel/flex/templates/common.py.jinja), not run here;
- the CPU Inductor template, in bfloat16 and float16 cases, rounds the mod's constant to the
  query's dtype (the score's dtype, as flex_attention's docstring says), where -1e30 and
  float32's min are -inf: output 0.
The golden computes the exact softmax (float64, natural units). The verdict accepts, in these
rows only, either the golden's row or the fully masked row's (output exactly 0, lse -inf), and
for the gradients of a backward case either the golden's or those of the case with these rows
masked (``masking_hidden_rows``; the golden's ``masked_overflow``).
The limit is the case dtype's largest value (float32's for a float32 case): the smallest that
any of the kernels above holds scores in, so the widest set of rows where one of them may
overflow."""
from __future__ import annotations

import math

import torch

from cases.inputs import torch_dtype
from cases.variants import Mods


def overflow_limit(case_dtype: str) -> float:
    """The natural-log value below which a row's log-sum-exp (and so its largest score) is
    beyond the case dtype's range in log2 units."""
    return torch.finfo(torch_dtype(case_dtype)).max * math.log(2.0)


def rows_hidden_by_overflow(golden_lse: torch.Tensor | None, case_dtype: str
                            ) -> torch.Tensor | None:
    """[B, Hq, Sq] bool: rows whose golden log-sum-exp is finite and below -overflow_limit
    (every score of such a row is at most its lse); None when there are none."""
    if golden_lse is None:
        return None
    rows = torch.isfinite(golden_lse) & (golden_lse < -overflow_limit(case_dtype))
    return rows if bool(rows.any()) else None


#: Beyond this magnitude float32's spacing is 2 or more, so a log-sum-exp stored in float32
#: cannot hold the log(n) that tells P = 1/n from P = 1 in a row a huge constant pads
#: (docs/findings.md, finding 4; reference/row_noise.py sizes P's rounding accordingly).
FLOAT32_LSE_RESOLVES = 2.0 ** 24


def rows_beyond_float32_lse(golden_lse: torch.Tensor | None) -> int:
    """How many rows have a finite golden lse beyond FLOAT32_LSE_RESOLVES: where a backward
    that recomputes P from a float32 lse gets it wrong (finding 4)."""
    if golden_lse is None:
        return 0
    return int((torch.isfinite(golden_lse) & (golden_lse.abs() > FLOAT32_LSE_RESOLVES)).sum())


def masking_hidden_rows(mods: Mods, hidden: torch.Tensor) -> Mods:
    """``mods`` with the rows ``hidden`` ([B, Hq, Sq] bool, on the inputs' device) masked: the
    case as a kernel that holds them as -inf computes it, for the gradients' other right
    answer (reference/golden.py)."""
    inner = mods.mask_mod

    def unless_hidden(b, h, q_idx, kv_idx):
        seen = ~hidden[b, h, q_idx]
        return seen if inner is None else seen & inner(b, h, q_idx, kv_idx)

    return Mods(unless_hidden, mods.score_mod)
