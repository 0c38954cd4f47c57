"""The matrix layout: rows, columns and groups from case ids."""
from __future__ import annotations

from cases.catalog import core_matrix
from reports.matrix import build_matrix, seq_text
from records.results import Label
from tests.test_report_doctored import ODD_ID, case_id, record


def test_core_matrix_is_one_grid_of_8_variants_by_3_batches_x_4_lengths():
    records = [record(c.id) for c in core_matrix("full")]
    matrix = build_matrix(records)
    assert len(matrix.grids) == 1 and not matrix.unplaced
    grid = matrix.grids[0]
    assert grid.title == "bf16 · fwd · h8x8 · d128"
    assert [row for row, _ in grid.rows] == ["full", "causal", "sliding_window", "prefix_lm",
                                             "document", "alibi", "softcap · inputs x2",
                                             "rel_bias"]
    assert grid.batch_spans == [(1, 4), (2, 4), (4, 4)]
    assert [seq_text(seq) for _, seq in grid.columns[:4]] == ["1024", "2048", "4096", "8192"]
    # prefix_lm's parameter scales with the length (p256 ... p2048) and it stays one row
    prefix_cells = dict(grid.rows)["prefix_lm"]
    assert all(cell is not None and cell.case_id.startswith("prefix_lm-p") for cell in prefix_cells)
    assert grid.pass_line == "96/96 conform: 96 PASS"


def test_two_parameterisations_in_one_cell_split_the_row_by_token():
    records = [record(case_id("sliding_window", params=(("w", 64),))),
               record(case_id("sliding_window", params=(("w", 32),)), Label.MISMATCH),
               record(case_id("causal"))]
    grid = build_matrix(records).grids[0]
    assert [row for row, _ in grid.rows] == ["sliding_window-w64", "sliding_window-w32", "causal"]
    assert grid.pass_line == "2/3 conform: 2 PASS"


def test_the_grid_note_counts_what_conforms_not_only_pass():
    unsupported = [record(case_id(v), Label.UNSUPPORTED) for v in ("causal", "alibi", "full")]
    assert build_matrix(unsupported).grids[0].pass_line == "3/3 conform: 3 UNSUPPORTED"
    mixed = unsupported[:2] + [record(case_id("full")), record(case_id("softcap"), Label.CRASH)]
    assert build_matrix(mixed).grids[0].pass_line == "3/4 conform: 1 PASS, 2 UNSUPPORTED"


def test_other_id_parts_make_separate_grids_and_unknown_ids_are_kept_apart():
    records = [record(case_id(dtype="bf16")), record(case_id(dtype="fp32")),
               record("causal/b2x1-h8x2-s128x256-d64/bf16/fwd+bwd"),
               record(case_id() + "/x4"), record(ODD_ID)]
    matrix = build_matrix(records)
    assert [g.title for g in matrix.grids] == ["bf16 · fwd · h8x8 · d128", "fp32 · fwd · h8x8 · d128",
                                               "bf16 · fwd+bwd · h8x2 · d64 · kv batch 1"]
    # the input scale goes with the row: the core matrix's soft-cap x2 stays in its grid
    assert [row for row, _ in matrix.grids[0].rows] == ["causal", "causal · inputs x4"]
    assert seq_text(matrix.grids[2].columns[0][1]) == "128x256"
    assert [r.case_id for r in matrix.unplaced] == [ODD_ID]


def test_every_id_of_every_matrix_is_placed():
    from cases.catalog import MATRICES, matrix

    for name in MATRICES:
        records = [record(c.id) for c in matrix("smoke", name)]
        assert build_matrix(records).unplaced == [], name
