"""The data of a conformance case: shape, variant, case, and its stable id.

Nothing here imports torch: reports and the gate read case ids without it.
An id encodes everything that defines a case and never changes meaning:

    <variant token>/<shape token>/<dtype>/<mode>[/x<input scale>]
    sliding_window-w1000/b4-h8x8-s8192x8192-d128/bf16/fwd
    softcap-cap50/b2-h8x8-s2048x2048-d128/bf16/fwd/x8

Modes: ``fwd`` (the output), ``fwd+lse`` (the output and its log-sum-exp), ``fwd+bwd`` (the
output and dQ, dK, dV). The input scale multiplies the N(0, 1) inputs (1 is left out of the id).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from records.results import FUZZ_PREFIX  # the form of a fuzzed example's record id

DTYPES = ("bf16", "fp16", "fp32")
MODES = ("fwd", "fwd+lse", "fwd+bwd")

_SHAPE_RE = re.compile(r"^b(\d+)(?:x(\d+))?-h(\d+)x(\d+)-s(\d+)x(\d+)-d(\d+)$")

#: The largest value of a shape field, the most elements an operand (q, k, v, the output) may
#: have, and the most scores (B Hq Sq Skv, which a dense mask or kernel would hold): far
#: beyond any device, but within torch's signed 64-bit sizes in bytes; a larger shape is
#: refused where the case is read, not left to overflow inside torch (a harness error). A
#: shape within them that the host cannot hold runs out of memory (OUT_OF_MEMORY) where torch
#: says so; a size torch itself refuses is still the error of whoever allocated it.
LARGEST_DIMENSION = 2 ** 31 - 1
LARGEST_OPERAND_ELEMENTS = 2 ** 56
LARGEST_SCORES = 2 ** 60




def fuzz_id(case: "Case") -> str:
    return FUZZ_PREFIX + case.id


def split_origin(record_id: str) -> tuple[str, str]:
    """(origin, case id) of a record id: ("fuzz", id) for a fuzzed example, ("", id) else."""
    if record_id.startswith(FUZZ_PREFIX):
        return FUZZ_PREFIX.rstrip("/"), record_id[len(FUZZ_PREFIX):]
    return "", record_id


def file_stem(case_id: str) -> str:
    """A file name for a case id (its ``/`` and any other unsafe character become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", case_id)


@dataclass(frozen=True)
class Shape:
    """Attention shape: batch, query heads, key/value heads, query and key lengths, head dim.

    ``Bkv`` is the key/value batch; 1 with ``B > 1`` means key/value broadcast over the batch.
    """

    B: int
    Hq: int
    Hkv: int
    Sq: int
    Skv: int
    D: int
    Bkv: int | None = None

    def __post_init__(self) -> None:
        if self.Bkv is None:
            object.__setattr__(self, "Bkv", self.B)
        for name in ("B", "Hq", "Hkv", "Sq", "Skv", "D", "Bkv"):
            if getattr(self, name) < 1:
                raise ValueError(f"shape {name}={getattr(self, name)} must be >= 1")
            if getattr(self, name) > LARGEST_DIMENSION:
                raise ValueError(f"shape {name}={getattr(self, name)} is above "
                                 f"{LARGEST_DIMENSION}; give a size a device can hold")
        for operand, dims in (("q", ("B", "Hq", "Sq", "D")), ("k", ("Bkv", "Hkv", "Skv", "D"))):
            elements = 1
            for name in dims:
                elements *= getattr(self, name)
            if elements > LARGEST_OPERAND_ELEMENTS:
                raise ValueError(f"shape {'*'.join(dims)} = {elements} elements of {operand}, "
                                 f"above 2^56; give smaller dimensions")
        scores = self.B * self.Hq * self.Sq * self.Skv
        if scores > LARGEST_SCORES:
            raise ValueError(f"shape B*Hq*Sq*Skv = {scores} scores, above 2^60; give smaller "
                             "dimensions")
        if self.Hq % self.Hkv:
            raise ValueError(f"Hq={self.Hq} must be a multiple of Hkv={self.Hkv} (GQA)")
        if self.Bkv not in (1, self.B):
            raise ValueError(f"Bkv={self.Bkv} must be 1 or B={self.B}")

    @property
    def token(self) -> str:
        batch = f"b{self.B}" if self.Bkv == self.B else f"b{self.B}x{self.Bkv}"
        return f"{batch}-h{self.Hq}x{self.Hkv}-s{self.Sq}x{self.Skv}-d{self.D}"

    @classmethod
    def parse(cls, token: str) -> "Shape":
        m = _SHAPE_RE.match(token)
        if not m:
            raise ValueError(
                f"bad shape token {token!r}; expected like 'b4-h8x8-s8192x8192-d128'"
            )
        b, bkv, hq, hkv, sq, skv, d = m.groups()
        return cls(int(b), int(hq), int(hkv), int(sq), int(skv), int(d),
                   int(bkv) if bkv else int(b))


ParamValue = int | float


def id_part_problem(text) -> str | None:
    """Why ``text`` cannot be part of a case id (a variant's name, a parameter's name), with
    the fix; None when it can. pytest writes case ids into its test ids escaping what is not
    printable ASCII, so a record of 'kausal_\u00fc' matched no case of the run's selection,
    and every record of the case module was dropped (a review); '/' splits an id's parts."""
    if not isinstance(text, str) or not text:
        return "is empty or no string; give a name in printable ASCII"
    if not (text.isascii() and text.isprintable()) or "/" in text or " " in text:
        return ("holds a character that a case id cannot (pytest escapes all but printable "
                "ASCII in test ids; '/' and spaces split ids); name it in printable ASCII "
                "without '/' or spaces")
    return None


def is_param_value(value) -> bool:
    """Whether ``value`` may be a variant parameter's: a finite int or float (no bool), as a
    case spec reads it back (case files, case modules: one rule for both)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and (
        not isinstance(value, float) or math.isfinite(value))


@dataclass(frozen=True)
class Variant:
    """A named attention variant with its parameters (the mods are built from these).

    ``params`` is a tuple of (key, value) pairs in a fixed order; the key is the short
    prefix used in the id, e.g. ``("w", 1024)`` gives ``sliding_window-w1024``.
    """

    name: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @property
    def token(self) -> str:
        parts = [self.name] + [f"{key}{_fmt(value)}" for key, value in self.params]
        return "-".join(parts)

    def param(self, key: str) -> ParamValue:
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(f"variant {self.token!r} has no parameter {key!r}")


def _fmt(value: ParamValue) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Case:
    """One conformance case: a variant on a shape, in a dtype and a mode."""

    variant: Variant
    shape: Shape
    dtype: str = "bf16"
    mode: str = "fwd"
    input_scale: int = 1
    tags: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; use one of {', '.join(MODES)}")
        if not (isinstance(self.input_scale, int) and self.input_scale >= 1):
            raise ValueError(f"input_scale {self.input_scale!r} must be an integer >= 1")

    @property
    def id(self) -> str:
        base = f"{self.variant.token}/{self.shape.token}/{self.dtype}/{self.mode}"
        return base if self.input_scale == 1 else f"{base}/x{self.input_scale}"

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "variant": self.variant.name,
            "params": {k: v for k, v in self.variant.params},
            "shape": {
                "B": self.shape.B, "Bkv": self.shape.Bkv, "Hq": self.shape.Hq,
                "Hkv": self.shape.Hkv, "Sq": self.shape.Sq, "Skv": self.shape.Skv,
                "D": self.shape.D,
            },
            "dtype": self.dtype,
            "mode": self.mode,
            "input_scale": self.input_scale,
        }

    @classmethod
    def from_json(cls, data: dict) -> "Case":
        s = data["shape"]
        shape = Shape(s["B"], s["Hq"], s["Hkv"], s["Sq"], s["Skv"], s["D"], s.get("Bkv"))
        variant = Variant(data["variant"], tuple((k, v) for k, v in data["params"].items()))
        case = cls(variant, shape, data["dtype"], data["mode"], int(data.get("input_scale", 1)))
        if "id" in data and data["id"] != case.id:
            raise ValueError(f"case spec id {data['id']!r} does not match its fields ({case.id!r})")
        return case
