"""Performance conformance: the mask's density is exact, throughput follows from it, and a
backend that ignores block sparsity is flagged DENSE (a note, never a failure)."""
from __future__ import annotations

import pytest
import torch

from cases.density import BLOCK, attention_flops, mask_density
from cases.model import Case, Shape, Variant
from cases.variants import build_mods
from records import Label, Record, RunResults
from reports.performance import case_performance, variant_performance
from reports.render import write_report
from tests.test_backends_cpu import execute


def _brute_force(case: Case) -> tuple[float, float]:
    """Density and block density by evaluating the scalar mask_mod at every point."""
    shape, mask_mod = case.shape, build_mods(case.variant, case.shape).mask_mod
    visible = torch.zeros(shape.B, shape.Hq, shape.Sq, shape.Skv, dtype=torch.bool)
    for b in range(shape.B):
        for h in range(shape.Hq):
            for q in range(shape.Sq):
                for k in range(shape.Skv):
                    visible[b, h, q, k] = bool(mask_mod(torch.tensor(b), torch.tensor(h),
                                                        torch.tensor(q), torch.tensor(k)))
    tiles = [visible[b, h, i:i + BLOCK, j:j + BLOCK].any()
             for b in range(shape.B) for h in range(shape.Hq)
             for i in range(0, shape.Sq, BLOCK) for j in range(0, shape.Skv, BLOCK)]
    return visible.double().mean().item(), sum(map(bool, tiles)) / len(tiles)


@pytest.mark.parametrize("variant", [
    Variant("causal"), Variant("sliding_window", (("w", 40),)), Variant("document"),
    Variant("prefix_lm", (("p", 24),))], ids=lambda v: v.token)
def test_mask_density_is_exact(variant):
    skv = 160 if variant.name == "document" else 300  # odd lengths: partial tiles
    case = Case(variant, Shape(2, 2, 2, 160, skv, 8))
    density = mask_density(case)
    expected, expected_blocks = _brute_force(case)
    assert density.density == pytest.approx(expected, abs=1e-12)
    assert density.block_density == pytest.approx(expected_blocks, abs=1e-12)
    assert density.visible_pairs == round(expected * 2 * 2 * 160 * skv)


def test_flops_count_visible_pairs_and_the_backward():
    case = Case(Variant("full"), Shape(1, 2, 2, 64, 64, 16))
    assert attention_flops(case, 1000) == 4 * 16 * 1000
    backward = Case(Variant("full"), Shape(1, 2, 2, 64, 64, 16), "fp32", "fwd+bwd")
    assert attention_flops(backward, 1000) == 3.5 * 4 * 16 * 1000


def _record(variant: str, run_seconds: float, density: float, block_density: float,
            **more: float) -> Record:
    case = Case(Variant(variant), Shape(1, 8, 8, 4096, 4096, 64))
    return Record(case_id=case.id, label=Label.PASS, case=case.to_json(), run_seconds=run_seconds,
                  performance={"density": density, "block_density": block_density,
                               "gflops_per_second": 10.0, **more})


def test_a_masked_case_that_costs_as_much_as_full_is_flagged_dense():
    records = [_record("full", 1.0, 1.0, 1.0), _record("causal", 0.55, 0.5, 0.51),
               _record("document", 1.0, 0.09, 0.1), _record("softcap", 1.0, 1.0, 1.0)]
    rows = {row.variant: row for row in case_performance(records)}
    assert rows["full"].efficiency is None and not rows["full"].dense
    assert rows["causal"].efficiency == pytest.approx(1.1) and not rows["causal"].dense
    assert rows["document"].efficiency == pytest.approx(1 / 0.09) and rows["document"].dense
    assert rows["softcap"].efficiency == pytest.approx(1.0) and not rows["softcap"].dense
    summary = {v.variant: v for v in variant_performance(list(rows.values()))}
    assert summary["document"].dense_cases == 1 and summary["causal"].dense_cases == 0


def test_a_case_with_a_score_mod_is_not_judged_dense_its_time_holds_the_mods_cost():
    """softcap at S1024 cost 2.25x full on cpu-inductor while causal, its mask alone, skipped
    its tiles: DENSE blamed the mask for the mod (an outside trial). Results that do not say
    whether a case has a score mod are judged as before."""
    records = [_record("full", 1.0, 1.0, 1.0), _record("causal", 0.55, 0.5, 0.56, score_mod=0),
               _record("softcap", 2.25, 0.5, 0.56, score_mod=1),
               _record("alibi", 2.25, 0.5, 0.56)]
    rows = {row.variant: row for row in case_performance(records)}
    assert rows["softcap"].efficiency == pytest.approx(4.5) and not rows["softcap"].dense
    assert rows["alibi"].dense and not rows["causal"].dense


def test_a_kernel_that_skips_empty_tiles_is_not_dense_though_tiles_exceed_the_density():
    # a document mask at S1024: density 0.09 but a quarter of the tiles hold a visible pair
    records = [_record("full", 1.0, 1.0, 1.0), _record("document", 0.26, 0.09, 0.25)]
    document = [r for r in case_performance(records) if r.variant == "document"][0]
    assert document.efficiency == pytest.approx(0.26 / 0.09)  # 2.9x by the density
    assert document.tile_efficiency == pytest.approx(1.04) and not document.dense


def test_an_overhead_bound_shape_is_not_judged():
    records = [_record("full", 0.004, 1.0, 1.0), _record("document", 0.004, 0.09, 0.1)]
    document = [r for r in case_performance(records) if r.variant == "document"][0]
    assert document.tile_efficiency == pytest.approx(10.0) and not document.dense


def test_a_wrong_answer_has_no_speed_in_the_report():
    """A MISMATCH's GFLOP/s were listed and fed its variant's median (older results files
    carry them; the executor gives figures to passing cases only)."""
    from dataclasses import replace

    wrong = replace(_record("causal", 0.1, 0.5, 0.5), label=Label.MISMATCH)
    rows = case_performance([_record("full", 1.0, 1.0, 1.0), wrong])
    assert [row.variant for row in rows] == ["full"]


def test_a_tiny_case_cannot_be_dense_its_mask_leaves_no_tile_to_skip():
    records = [_record("full", 1.0, 1.0, 1.0), _record("causal", 1.0, 0.5, 1.0)]
    causal = [r for r in case_performance(records) if r.variant == "causal"][0]
    assert causal.efficiency == pytest.approx(2.0) and not causal.dense


def test_records_carry_density_and_throughput_and_the_report_shows_them(tmp_path):
    shape = Shape(1, 2, 2, 256, 256, 16)
    cases = [Case(Variant("full"), shape), Case(Variant("causal"), shape),
             Case(Variant("alibi"), shape)]
    full, causal, alibi = execute("cpu-eager", cases)
    assert (full.label, causal.label, alibi.label) == (Label.PASS,) * 3
    assert causal.performance["density"] == pytest.approx(mask_density(cases[1]).density)
    assert causal.performance["block_density"] == pytest.approx(0.75)
    expected = attention_flops(cases[1], causal.performance["visible_pairs"]) / causal.run_seconds
    assert causal.performance["gflops_per_second"] == pytest.approx(expected / 1e9, rel=1e-3)
    assert [r.performance["score_mod"] for r in (full, causal, alibi)] == [0.0, 0.0, 1.0]
    written = (full, causal, _record("document", 10.0, 0.09, 0.1), _record("full", 1.0, 1.0, 1.0))
    write_report(RunResults({}, {"backend": "cpu-eager", "profile": "smoke", "seed": 0},
                            written, "t"), tmp_path)
    html = (tmp_path / "index.html").read_text()
    assert 'id="variant-efficiency"' in html and ">DENSE<" in html
    dense = sum(row.dense for row in case_performance(written))  # the document one, at least
    words = "1 masked case costs" if dense == 1 else f"{dense} masked cases cost"
    assert f"Performance note: {words} as if dense" in (tmp_path / "summary.md").read_text()
