"""The log-sum-exp rule of ``fwd+lse`` cases (reference/verdict.py judges the rest), per row:
|lse - G| <= LSE_FACTOR * |baseline lse - G| + LSE_RTOL * max(1, |G|) + u * the row's lse
size (the roundings of its scores in a float32 kernel: reference/row_noise.py,
_LseRounding), and -inf exactly where the golden is -inf (fully masked rows)."""
from __future__ import annotations

import math
from typing import Any

import torch

from reference.verdict import Tolerance, Verdict, _argmax, _malformed

#: log-sum-exp: per-row factor over the baseline's error, and a floor of 128 float32 ulps.
LSE_FACTOR = 4.0
LSE_RTOL = 128 * 2.0 ** -24


def judge_lse(golden: torch.Tensor, baseline: torch.Tensor, observed: Any,
              hidden: torch.Tensor | None = None, overflow_at: float = math.inf,
              noise: torch.Tensor | None = None, tol: Tolerance | None = None) -> Verdict:
    """``hidden``: rows a score mod hides by overflow (reference/overflow_rows.py), where an
    lse is right when it is -inf or at most ``-overflow_at`` (the mod's constant may be the
    score dtype's min, so its value there is the kernel's own; every correct kernel agrees
    the row is beyond the dtype's range). ``noise``: the golden's lse row sizes (in ``tol``'s
    unit roundoff: row_noise._LseRounding), added to each row's limit."""
    malformed = _malformed("log-sum-exp", golden, observed)
    if malformed:
        return malformed
    obs = observed.detach().cpu().to(torch.float64)
    masked = torch.isneginf(golden)
    as_masked, in_range = 0, 0
    if hidden is None:
        hidden = torch.zeros_like(masked)
    else:
        taken = hidden & torch.isneginf(obs)
        masked, as_masked = masked | taken, int(taken.sum())
        in_range = int((hidden & ~taken & ~(obs <= -overflow_at)).sum())  # NaN counts as in range
    wrong_masked = int((masked & ~torch.isneginf(obs)).sum())
    nonfinite = int((~masked & ~hidden & ~torch.isfinite(obs)).sum())
    live = ~masked & ~hidden & torch.isfinite(obs)
    err = torch.where(live, (obs - golden).abs(), 0.0)
    base_err = torch.where(live, (baseline.to(torch.float64) - golden).abs(), 0.0)
    limit = LSE_FACTOR * base_err + LSE_RTOL * golden.abs().clamp_min(1.0).where(live, 1.0)
    if noise is not None and tol is not None:
        limit = limit + tol.unit_roundoff * noise.to(limit.device, torch.float64)
    margins = err / limit
    worst = _argmax(margins)
    failing = int((~(margins <= 1)).sum())  # a NaN margin fails too
    metrics: dict[str, Any] = {
        "max_abs_err": float(err.max()) if err.numel() else 0.0,
        "worst_row_margin": float(margins[worst]) if margins.numel() else 0.0,
        "worst_place": dict(zip("bhq", worst)),
        "failing_rows": failing,
        "fully_masked_rows": int(masked.sum()) - as_masked,
        "overflow_rows_minus_inf": as_masked,
        "overflow_rows_in_range": in_range,
        "nonfinite_count": nonfinite,
        "not_minus_inf_on_masked_rows": wrong_masked,
    }
    failed, summary = [], []
    if wrong_masked:
        failed.append("masked_rows")
        summary.append(f"{wrong_masked} fully masked row(s) do not have lse = -inf")
    if nonfinite:
        failed.append("nonfinite")
        summary.append(f"{nonfinite} non-finite lse value(s) where the golden is finite")
    if in_range:
        failed.append("overflow_rows")
        summary.append(f"{in_range} row(s) a score mod hides beyond the dtype's range in log2 "
                       f"units have an lse above -{overflow_at:.3g} (want -inf, or at most that)")
    if failing:
        failed.append("row")
        b, h, q = worst
        summary.append(f"{failing} row(s) off, worst b={b} h={h} q={q}: error "
                       f"{float(err[worst]):.3g} vs limit {float(limit[worst]):.3g}"
                       + _narrow_lse_hint(observed.dtype))
    metrics["failed_rules"] = failed
    return Verdict(not failed, "; ".join(summary), metrics)


def _narrow_lse_hint(dtype: torch.dtype) -> str:
    """Why an lse of fewer bits than float32 is off: it cannot hold what the golden does."""
    if not dtype.is_floating_point or torch.finfo(dtype).bits >= 32:
        return ""
    return (f" (the lse came back as {str(dtype).removeprefix('torch.')}; flex_attention's "
            "kernels return float32: docs/findings.md, finding 6)")
