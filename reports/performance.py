"""Performance conformance, beside the verdict: throughput per case and sparsity efficiency
per variant. Notes, never failures.

A masked case's **sparsity efficiency** is its run time over the ``full`` variant's at the same
shape, dtype and mode, divided by the mask's density: 1.0 when its cost follows the visible
work, 1/density when it pays for the whole score matrix.

A block-sparse kernel computes whole 128 x 128 tiles, so even a perfect one costs its
**block** density, not its density (a document mask at S1024: density 0.09, block density 0.25,
so 2.8x by the first measure). DENSE therefore judges the same ratio against the block density:
a case is flagged when it costs more than ``DENSE_THRESHOLD`` times what skipping the empty
tiles would cost, while its mask leaves tiles to skip (block density under
``SKIPPABLE_BLOCK_DENSITY``) and the ``full`` case runs long enough to measure the difference
(``MIN_JUDGED_SECONDS``: below it a call's fixed overhead dominates). A case with a score mod
is not judged: its time holds the mod's own cost, which no case of the matrix isolates
(softcap at S1024 on cpu-inductor costs 2.25x the full case, while causal, its mask alone,
skips its tiles: the flag blamed the mask for the mod). Its efficiency is still shown.
Results written before the record said whether a case has a score mod are judged as before.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from records.results import Label, Record

DENSE_THRESHOLD = 2.0
#: Below this share of non-empty 128x128 tiles a block-sparse kernel has work to skip.
SKIPPABLE_BLOCK_DENSITY = 0.9
#: A full case faster than this is overhead-bound: its masked siblings are not judged DENSE.
MIN_JUDGED_SECONDS = 0.01


@dataclass(frozen=True)
class CasePerformance:
    case_id: str
    variant: str
    run_seconds: float
    gflops_per_second: float
    density: float
    block_density: float
    efficiency: float | None  # None for the full variant, or without a full case to compare
    full_seconds: float | None = None  # the full case's run time at the same shape
    score_mod: bool | None = None  # whether the case has a score mod (None: not recorded)

    @property
    def tile_efficiency(self) -> float | None:
        """The run-time ratio over the block density: 1.0 for a kernel that skips empty tiles."""
        if self.efficiency is None or not self.block_density:
            return None
        return self.efficiency * self.density / self.block_density

    @property
    def dense(self) -> bool:
        tiles = self.tile_efficiency
        return (tiles is not None and tiles > DENSE_THRESHOLD and not self.score_mod
                and self.block_density < SKIPPABLE_BLOCK_DENSITY
                and (self.full_seconds or 0.0) >= MIN_JUDGED_SECONDS)


@dataclass(frozen=True)
class VariantPerformance:
    variant: str
    cases: int
    median_efficiency: float | None
    worst_efficiency: float | None
    dense_cases: int
    median_gflops_per_second: float


def case_performance(records: tuple[Record, ...] | list[Record]) -> list[CasePerformance]:
    """Every passing record with performance figures, with its efficiency against ``full``
    (a wrong answer's speed says nothing of the backend: results files before 2026-12-05
    gave a MISMATCH figures too)."""
    timed = [r for r in records if r.performance and r.run_seconds and r.case
             and r.label is Label.PASS]
    full = {_shape_key(r): r.run_seconds for r in timed if r.case.get("variant") == "full"}
    rows = []
    for r in timed:
        perf, variant = r.performance, str(r.case.get("variant", "?"))
        base = full.get(_shape_key(r))
        density = float(perf.get("density", 1.0))
        efficiency = None
        if variant != "full" and base and density > 0:
            efficiency = (r.run_seconds / base) / density
        score_mod = perf.get("score_mod")
        rows.append(CasePerformance(r.case_id, variant, r.run_seconds,
                                    float(perf.get("gflops_per_second", 0.0)), density,
                                    float(perf.get("block_density", 1.0)), efficiency, base,
                                    None if score_mod is None else bool(score_mod)))
    return rows


def variant_performance(rows: list[CasePerformance]) -> list[VariantPerformance]:
    by_variant: dict[str, list[CasePerformance]] = {}
    for row in rows:
        by_variant.setdefault(row.variant, []).append(row)
    summary = []
    for variant, cases in by_variant.items():
        effs = [c.efficiency for c in cases if c.efficiency is not None]
        summary.append(VariantPerformance(
            variant, len(cases), statistics.median(effs) if effs else None,
            max(effs) if effs else None, sum(c.dense for c in cases),
            statistics.median(c.gflops_per_second for c in cases)))
    return summary


def _shape_key(record: Record) -> str:
    case = record.case
    return json.dumps([case.get("shape"), case.get("dtype"), case.get("mode")], sort_keys=True)
