"""The matrix as grids: variants as rows, batch x sequence as columns, one grid per
combination of the other parts of the case (dtype, mode, heads, head dim, kv broadcast and any
later part of the id but the input scale). The input scale goes with the row (``softcap ·
inputs x2``): the core matrix, whose soft-cap cases run on inputs x2, stays one grid.

Coordinates come from the record's case spec, or else from parsing the case id; records
whose id follows no known form are collected in ``unplaced`` (shown as a plain list).
A variant whose parameters scale with the sequence (``prefix_lm-p256`` at S=1024) stays one
row; only when two records would share a cell does the row split by the full variant token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cases.model import Shape, split_origin
from records.results import Label, Record


@dataclass(frozen=True)
class Coordinates:
    variant: str  # the variant's name, e.g. sliding_window
    variant_token: str  # with parameters, e.g. sliding_window-w1024
    batch: int
    seq: tuple[int, int]  # (Sq, Skv)
    group: str  # everything else, e.g. "bf16 · fwd · h8x8 · d128"


@dataclass
class Grid:
    title: str
    columns: list[tuple[int, tuple[int, int]]]  # (batch, (Sq, Skv)), sorted
    rows: list[tuple[str, list[Record | None]]] = field(default_factory=list)

    @property
    def pass_line(self) -> str:
        """What conforms over the grid's cases: ``18/20 conform: 16 PASS, 2 UNSUPPORTED``."""
        records = [rec for _, cells in self.rows for rec in cells if rec is not None]
        counts: dict[Label, int] = {}
        for rec in records:
            if rec.label.acceptable:
                counts[rec.label] = counts.get(rec.label, 0) + 1
        conforming = sum(counts.values())
        detail = ", ".join(f"{n} {label.value}" for label in Label
                           if (n := counts.get(label)))
        return f"{conforming}/{len(records)} conform" + (f": {detail}" if detail else "")

    @property
    def batch_spans(self) -> list[tuple[int, int]]:
        """(batch, number of columns) for the two-level column header."""
        spans: list[tuple[int, int]] = []
        for batch, _ in self.columns:
            if spans and spans[-1][0] == batch:
                spans[-1] = (batch, spans[-1][1] + 1)
            else:
                spans.append((batch, 1))
        return spans


@dataclass
class Matrix:
    grids: list[Grid]
    unplaced: list[Record]


def seq_text(seq: tuple[int, int]) -> str:
    return f"{seq[0]}" if seq[0] == seq[1] else f"{seq[0]}x{seq[1]}"


def coordinates(record: Record) -> Coordinates | None:
    """Where ``record`` sits in the matrix, or None when its id has no known form.

    Fuzzed examples (``fuzz/`` ids) have a grid per dtype and mode: their heads and head dims
    vary from example to example, so those go in the row with the variant."""
    origin, case_id = split_origin(record.case_id)
    parts = case_id.split("/")
    if len(parts) < 4:
        return None
    variant_token, shape_token, dtype, mode, *rest = parts  # rest: e.g. input scale "x4"
    try:
        shape = Shape.parse(shape_token)
    except ValueError:
        return None
    name = record.case.get("variant") if isinstance(record.case, dict) else None
    if not isinstance(name, str) or not variant_token.startswith(name):
        name = variant_token.split("-", 1)[0]
    kv_batch = "" if shape.Bkv == shape.B else " · kv batch 1"
    scale = "".join(f" · inputs {part}" for part in rest if _is_scale(part))
    extra = "".join(f" · {part}" for part in rest if not _is_scale(part))
    name, variant_token = name + scale, variant_token + scale
    heads = f"h{shape.Hq}x{shape.Hkv} · d{shape.D}{kv_batch}{extra}"
    if origin:
        row = f"{variant_token} · {heads}"
        return Coordinates(row, row, shape.B, (shape.Sq, shape.Skv), f"{origin} · {dtype} · {mode}")
    group = f"{dtype} · {mode} · {heads}"
    return Coordinates(name, variant_token, shape.B, (shape.Sq, shape.Skv), group)


def _is_scale(part: str) -> bool:
    """Whether an id part after the mode is the input scale (``x4``)."""
    return part.startswith("x") and part[1:].isdigit()


def build_matrix(records: tuple[Record, ...] | list[Record]) -> Matrix:
    placed: dict[str, list[tuple[Coordinates, Record]]] = {}
    unplaced = []
    for rec in records:
        where = coordinates(rec)
        if where is None:
            unplaced.append(rec)
        else:
            placed.setdefault(where.group, []).append((where, rec))
    return Matrix([_grid(title, items) for title, items in placed.items()], unplaced)


def _grid(title: str, items: list[tuple[Coordinates, Record]]) -> Grid:
    columns = sorted({(c.batch, c.seq) for c, _ in items})
    by_name: dict[tuple[str, tuple], int] = {}
    for c, _ in items:
        key = (c.variant, (c.batch, c.seq))
        by_name[key] = by_name.get(key, 0) + 1
    split = {name for (name, _), n in by_name.items() if n > 1}
    rows: dict[str, dict[tuple, Record]] = {}
    for c, rec in items:
        row = c.variant_token if c.variant in split else c.variant
        rows.setdefault(row, {}).setdefault((c.batch, c.seq), rec)
    grid = Grid(title, columns)
    grid.rows = [(row, [cells.get(col) for col in columns]) for row, cells in rows.items()]
    return grid
