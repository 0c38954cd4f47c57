#!/usr/bin/env python3
"""Reproduction of one FlexAttention conformance case (written by `flexconf repro`).

    python repro.py     # needs torch; prints the phases, the error metrics and the label
    python repro.py --save-outputs out.pt   # also saves inputs, output, golden, baseline
    python repro.py --compare KEPT.pt       # and compares with the run's kept output

case       composed-cap50-bias1-scale2/b1-h1x1-s127x127-d24/fp32/fwd/x4
backend    cpu-inductor
seed       202
recorded   MISMATCH: 1 query row(s) off, worst b=0 h=0 q=19: rms error 1.24e-05 vs limit 4.46e-06
run on     vm, torch 2.13.0+cpu, suite 0.1.0 (git 7764a57288f530215586b8f7db189fb8629ee53e)
embedded   suite 0.1.0 (git 7764a57288f530215586b8f7db189fb8629ee53e)

It rebuilds the inputs from the case id and the seed, builds the variant's mods, runs the
case on the backend as the suite's child does (first call = compile, then timed runs),
computes the float64 golden and the dtype baseline, and judges with the suite's verdict.
The suite modules it uses are embedded verbatim at the end (SOURCES). Exit status: 0 when
the label is PASS, 1 otherwise."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys

CASE = {
 "id": "composed-cap50-bias1-scale2/b1-h1x1-s127x127-d24/fp32/fwd/x4",
 "variant": "composed",
 "params": {
  "cap": 50,
  "bias": 1,
  "scale": 2
 },
 "shape": {
  "B": 1,
  "Bkv": 1,
  "Hq": 1,
  "Hkv": 1,
  "Sq": 127,
  "Skv": 127,
  "D": 24
 },
 "dtype": "fp32",
 "mode": "fwd",
 "input_scale": 4
}
BACKEND = 'cpu-inductor'
SEED = 202
RUNS = 3  # timed runs after the first (compile) call, as in the suite
CASE_MODULES = []
RECORDED = 'MISMATCH: 1 query row(s) off, worst b=0 h=0 q=19: rms error 1.24e-05 vs limit 4.46e-06'


class EmbeddedSuite(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the embedded suite modules to `import`, ahead of any installed copy."""

    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES:
            return None
        is_package = any(other.startswith(name + ".") for other in SOURCES)
        return importlib.util.spec_from_loader(name, self, is_package=is_package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if any(other.startswith(module.__name__ + ".") for other in SOURCES):
            module.__path__ = []
        module.__file__ = f"<embedded {module.__name__}>"
        exec(compile(SOURCES[module.__name__], module.__file__, "exec"), module.__dict__)


def main():
    import argparse

    parser = argparse.ArgumentParser(description="Reproduce one FlexAttention conformance case.")
    parser.add_argument("--save-outputs", metavar="FILE", help="save the inputs, the output, "
                        "the golden and the baseline (reference.load_case_outputs reads it)")
    parser.add_argument("--compare", metavar="KEPT", help="a file the run kept for this case "
                        "(REPORT_DIR/outputs/...pt): print how this output differs from it")
    args = parser.parse_args()
    sys.meta_path.insert(0, EmbeddedSuite())
    from conformance.repro_runtime import reproduce

    return reproduce(CASE, BACKEND, SEED, RUNS, tuple(CASE_MODULES), RECORDED,
                     args.save_outputs, args.compare)


SOURCES = {
    'cases': '''"""The variant catalog: cases as data (model), variants as mods (variants), matrices (catalog)."""
from cases.model import Case, Shape, Variant

__all__ = ["Case", "Shape", "Variant"]
''',
    'cases.catalog': '''"""The matrices: which cases a profile holds, and lookup of a case by id.

The core gating matrix is 8 variants x batch {1, 2, 4} x sequence {1024, 2048, 4096, 8192},
Hq = Hkv = 8, D = 128, bfloat16, forward: 96 cases. The ``smoke`` profile keeps that structure
with every length and length-like parameter divided by 8.
"""
from __future__ import annotations

from typing import Callable, Iterable

from cases import variants as v
from cases.model import Case, Shape, Variant

PROFILES = ("full", "smoke")
_LENGTH_DIVISOR = {"full": 1, "smoke": 8}

CORE_BATCHES = (1, 2, 4)
CORE_SEQ_LENS = (1024, 2048, 4096, 8192)
CORE_HEADS = 8
CORE_HEAD_DIM = 128
SLIDING_WINDOW = 1024
SOFTCAP = 50.0
REL_BIAS_BUCKETS = 32

#: The eight core variants, each as a function of the sequence length and the profile\'s
#: length divisor (lengths and length-like parameters scale with the profile).
CORE_VARIANTS: tuple[tuple[str, Callable[[int, int], Variant]], ...] = (
    ("full", lambda seq, div: v.full()),
    ("causal", lambda seq, div: v.causal()),
    ("sliding_window", lambda seq, div: v.sliding_window(SLIDING_WINDOW // div)),
    ("prefix_lm", lambda seq, div: v.prefix_lm(seq // 4)),
    ("document", lambda seq, div: v.document()),
    ("alibi", lambda seq, div: v.alibi()),
    ("softcap", lambda seq, div: v.softcap(SOFTCAP)),
    ("rel_bias", lambda seq, div: v.rel_bias(REL_BIAS_BUCKETS)),
)


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; use one of: {\', \'.join(PROFILES)}")
    return profile


def core_matrix(profile: str = "full") -> list[Case]:
    """The 96 gating cases of ``profile``, in a fixed order (variant, batch, sequence)."""
    div = _LENGTH_DIVISOR[check_profile(profile)]
    cases = []
    for _, make_variant in CORE_VARIANTS:
        for batch in CORE_BATCHES:
            for full_seq in CORE_SEQ_LENS:
                seq = full_seq // div
                shape = Shape(batch, CORE_HEADS, CORE_HEADS, seq, seq, CORE_HEAD_DIM)
                cases.append(Case(make_variant(seq, div), shape, "bf16", "fwd",
                                  tags=frozenset({"core", profile})))
    return cases


#: ``custom`` holds no catalog case: it selects the cases of case modules alone (cases/custom.py).
MATRICES = ("core", "extended", "all", "custom")

#: The extended matrix\'s base shape (batch, heads, sequence, head dim) before the profile\'s
#: length divisor; each axis below changes one thing of it.
EXT_BATCH, EXT_SEQ = 2, 2048
#: Inputs x4: scores have a standard deviation of 16, so maxima of tens (soft-capping acts).
LARGE_INPUT_SCALE = 4


def extended_matrix(profile: str = "full") -> list[Case]:
    """Beyond the gate: dtypes, GQA, head dims, odd lengths, cross attention and decoding,
    key/value batch broadcast, large inputs, fully masked rows, log-sum-exp and backward.
    Each axis varies one thing of the base case (B2 H8 S2048 D128 bf16 fwd)."""
    div = _LENGTH_DIVISOR[check_profile(profile)]
    seq = EXT_SEQ // div
    tags = frozenset({"extended", profile})

    def each_variant(shape: Shape, axis: str, **kw) -> list[Case]:
        return [Case(make(shape.Sq, div), shape, tags=tags | {axis}, **kw)
                for _, make in CORE_VARIANTS]

    def base(**changes) -> Shape:
        fields = dict(B=EXT_BATCH, Hq=CORE_HEADS, Hkv=CORE_HEADS, Sq=seq, Skv=seq,
                      D=CORE_HEAD_DIM)
        fields.update(changes)
        return Shape(**fields)

    cases: list[Case] = []
    for dtype in ("fp16", "fp32"):
        cases += each_variant(base(), "dtype", dtype=dtype)
    for hkv in (2, 1):
        cases += each_variant(base(Hkv=hkv), "gqa")
    for head_dim in (64, 80):
        cases += each_variant(base(D=head_dim), "head_dim")
    for odd in (1000, 4095):
        cases += each_variant(base(Sq=odd // div, Skv=odd // div), "odd_length")
    cross = [base(Sq=1024 // div, Skv=4096 // div), base(B=4, Sq=1, Skv=8192 // div),
             base(B=4, Bkv=1, Sq=1, Skv=8192 // div)]
    cases += [Case(v.full(), shape, tags=tags | {"cross"}) for shape in cross]
    broadcast = base(B=4, Bkv=1)
    cases += [Case(make(seq, div), broadcast, tags=tags | {"kv_broadcast"})
              for name, make in CORE_VARIANTS if name in ("full", "causal", "document", "alibi")]
    cases += each_variant(base(), "large_inputs", input_scale=LARGE_INPUT_SCALE)
    padded = v.padded_causal(3 * seq // 4)
    cases += [Case(padded, base(), mode=mode, tags=tags | {"masked_rows"})
              for mode in ("fwd", "fwd+lse")]
    cases += each_variant(base(), "lse", mode="fwd+lse")
    cases += each_variant(base(B=1, Sq=1024 // div, Skv=1024 // div), "backward", mode="fwd+bwd")
    return cases


def matrix(profile: str = "full", name: str = "core") -> list[Case]:
    """All catalog cases of matrix ``name`` (core, extended, all, or custom: none) in ``profile``."""
    if name == "custom":
        check_profile(profile)
        return []
    if name == "core":
        return core_matrix(profile)
    if name == "extended":
        return extended_matrix(profile)
    if name == "all":
        return core_matrix(profile) + extended_matrix(profile)
    raise ValueError(f"unknown matrix {name!r}; use one of: {\', \'.join(MATRICES)}")


def find_case(case_id: str, candidates: Iterable[Case] | None = None) -> Case:
    """The case with id ``case_id`` among ``candidates`` (default: every profile\'s core)."""
    pool = candidates if candidates is not None else [
        c for p in PROFILES for c in matrix(p, "all")]
    for case in pool:
        if case.id == case_id:
            return case
    raise KeyError(f"no case with id {case_id!r}; `flexconf list` prints the ids")
''',
    'cases.composed': '''"""The ``composed`` variant: masks built with and/or/not from small atoms, plus a chain of
score modifications. It is what the fuzzer draws (conformance/fuzz_grammar.py), and it is data
like every variant: the expression lives in the parameters, so a case spec round-trips through
``Case.to_json`` / ``Case.from_json`` and its id says what it computes.

Mask atoms (q = query index, k = key index; each takes one integer >= 0):

    causal{o}   k <= q + o               (o = 0: plain causal)
    win{w}      |q - k| < w              (a band of 2w - 1 keys, w >= 1)
    prefix{p}   k < p                    (keys every query sees)
    doc{n}      q // n == k // n         (documents of n tokens, n >= 1)
    block{t}    (q // t + k // t) even   (a checkerboard of t x t tiles, t >= 1)
    dil{d}      (q - k) % d == 0         (every d-th diagonal, d >= 1)

Score atoms, applied in order to the scaled score s (h = query head, H = query heads):

    scale{f}    s * f                                  (f > 0)
    alibi{m}    s + 2^(-m (h+1) / H) * (k - q)         (m > 0; m = 8 is ALiBi)
    cap{c}      c * tanh(s / c)                        (c > 0)
    bias{c}     s + c * T[h, (q - k) mod 16]           (T: fixed N(0, 1) table [H, 16])

Encoding: the mask is written in prefix notation; each atom becomes one parameter whose key is
the connectives that precede it, dotted, then the atom\'s name, and whose value is the atom\'s
number. Score atoms follow, one parameter each, in order. So ``and(causal0, not(win64))`` with
ALiBi then soft-capping is

    composed-and.causal0-not.win64-alibi8-cap20

A key that would repeat gets a trailing ``_`` per repeat (``causal0-causal_0``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

import torch

from cases.model import ParamValue, Shape, Variant
from cases.variants import Mods, builder

NAME = "composed"

MASK_ATOMS = ("causal", "win", "prefix", "doc", "block", "dil")
SCORE_ATOMS = ("scale", "alibi", "cap", "bias")
CONNECTIVES = {"and": 2, "or": 2, "not": 1}
#: Mask atoms whose number is a length: the shrinker scales them with the sequence.
LENGTH_ATOMS = ("causal", "win", "prefix", "doc", "block")
_AT_LEAST_ONE = ("win", "doc", "block", "dil")
#: Seed of the fixed ``bias`` table (part of the variant\'s meaning: never change it).
BIAS_TABLE_SEED = 20250611
BIAS_TABLE_WIDTH = 16


@dataclass(frozen=True)
class Atom:
    name: str
    value: ParamValue


@dataclass(frozen=True)
class Not:
    arg: "Expr"


@dataclass(frozen=True)
class And:
    left: "Expr"
    right: "Expr"


@dataclass(frozen=True)
class Or:
    left: "Expr"
    right: "Expr"


Expr = Union[Atom, Not, And, Or]


def composed(mask: Expr | None = None, score: Sequence[Atom] = ()) -> Variant:
    """The variant of mask expression ``mask`` (None: no mask) and score chain ``score``."""
    params: list[tuple[str, ParamValue]] = []
    if mask is not None:
        params += _mask_params(mask)
    for atom in score:
        _check_atom(atom, SCORE_ATOMS)
        params.append((atom.name, atom.value))
    seen: dict[str, int] = {}
    unique = []
    for key, value in params:
        repeats = seen.get(key, 0)
        seen[key] = repeats + 1
        unique.append((key + "_" * repeats, value))
    return Variant(NAME, tuple(unique))


def decode(variant: Variant) -> tuple[Expr | None, tuple[Atom, ...]]:
    """The mask expression and score chain of a ``composed`` variant (ValueError, one line)."""
    tokens: list[str | Atom] = []
    score: list[Atom] = []
    for key, value in variant.params:
        *connectives, name = key.rstrip("_").split(".")
        if name in SCORE_ATOMS and not connectives:
            score.append(_check_atom(Atom(name, value), SCORE_ATOMS, key))
            continue
        if score:
            raise ValueError(f"{NAME} parameter {key!r} comes after a score atom; "
                             "write the mask atoms first, then the score atoms")
        for word in connectives:
            if word not in CONNECTIVES:
                raise ValueError(f"{NAME} parameter {key!r}: unknown connective {word!r}; "
                                 f"use {\', \'.join(CONNECTIVES)}")
        tokens += connectives
        tokens.append(_check_atom(Atom(name, value), MASK_ATOMS, key))
    if not tokens:
        return None, tuple(score)
    stream = iter(tokens)
    expr = _parse_prefix(stream, variant)
    if next(stream, None) is not None:
        raise ValueError(f"{variant.token!r}: the mask has more atoms than its connectives "
                         "take; join them with and./or.")
    return expr, tuple(score)


def variant_from_token(token: str) -> Variant:
    """The variant of an id\'s first part, e.g. ``composed-and.causal0-not.win64-cap20``."""
    name, *parts = token.split("-")
    if name != NAME:
        raise ValueError(f"{token!r} is not a {NAME} variant token")
    params = []
    for part in parts:
        m = re.fullmatch(r"([a-z._]*[a-z_])(\\d+(?:\\.\\d+)?)", part)
        if not m:
            raise ValueError(f"bad {NAME} parameter {part!r} in {token!r}; expected like win64")
        number = m.group(2)
        params.append((m.group(1), float(number) if "." in number else int(number)))
    variant = Variant(NAME, tuple(params))
    decode(variant)
    return variant


def mask_text(expr: Expr | None) -> str:
    """``and(causal0, not(win64))``: the expression in function notation (messages, docs)."""
    if expr is None:
        return "none"
    if isinstance(expr, Atom):
        return f"{expr.name}{_number(expr.value)}"
    if isinstance(expr, Not):
        return f"not({mask_text(expr.arg)})"
    word = "and" if isinstance(expr, And) else "or"
    return f"{word}({mask_text(expr.left)}, {mask_text(expr.right)})"


def scale_lengths(variant: Variant, ratio: float) -> Variant:
    """The variant with its length atoms (``LENGTH_ATOMS``) multiplied by ``ratio``."""
    params = []
    for key, value in variant.params:
        name = key.rstrip("_").split(".")[-1]
        if name in LENGTH_ATOMS:
            floor = 1 if name in _AT_LEAST_ONE else 0
            value = max(floor, int(round(value * ratio)))
        params.append((key, value))
    return Variant(variant.name, tuple(params))


@builder(NAME)
def _build_composed(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    expr, chain = decode(variant)
    mask_mod = None
    if expr is not None:
        visible = _mask_fn(expr)

        def composed_mask(b, h, q_idx, kv_idx):
            return visible(q_idx, kv_idx)

        mask_mod = composed_mask
    score_mod = None
    if chain:
        steps = [_score_fn(atom, shape, device) for atom in chain]

        def composed_score(score, b, h, q_idx, kv_idx):
            for step in steps:
                score = step(score, h, q_idx, kv_idx)
            return score

        score_mod = composed_score
    return Mods(mask_mod, score_mod)


# -- the atoms ------------------------------------------------------------------------------
def _mask_fn(expr: Expr):
    if isinstance(expr, Not):
        inner = _mask_fn(expr.arg)
        return lambda q, k: ~inner(q, k)
    if isinstance(expr, (And, Or)):
        left, right = _mask_fn(expr.left), _mask_fn(expr.right)
        if isinstance(expr, And):
            return lambda q, k: left(q, k) & right(q, k)
        return lambda q, k: left(q, k) | right(q, k)
    n = int(expr.value)
    if expr.name == "causal":
        return lambda q, k: k <= q + n
    if expr.name == "win":
        return lambda q, k: (q - k).abs() < n
    if expr.name == "prefix":
        return lambda q, k: k < n
    if expr.name == "doc":
        return lambda q, k: q // n == k // n
    if expr.name == "block":
        return lambda q, k: (q // n + k // n) % 2 == 0
    return lambda q, k: (q - k) % n == 0  # dil


def _score_fn(atom: Atom, shape: Shape, device: torch.device):
    c = float(atom.value)
    if atom.name == "scale":
        return lambda s, h, q, k: s * c
    if atom.name == "cap":
        return lambda s, h, q, k: c * torch.tanh(s / c)
    if atom.name == "alibi":
        slopes = torch.tensor([2.0 ** (-c * (i + 1) / shape.Hq) for i in range(shape.Hq)],
                              dtype=torch.float32, device=device)
        return lambda s, h, q, k: s + slopes[h] * (k - q)
    table = bias_table(shape.Hq).to(device)
    return lambda s, h, q, k: s + c * table[h, (q - k) % BIAS_TABLE_WIDTH]


def bias_table(num_heads: int) -> torch.Tensor:
    """The fixed table of the ``bias`` atom: N(0, 1), [num_heads, 16], float32."""
    gen = torch.Generator().manual_seed(BIAS_TABLE_SEED)
    return torch.randn(num_heads, BIAS_TABLE_WIDTH, generator=gen)


# -- encoding -------------------------------------------------------------------------------
def _prefix_tokens(expr: Expr) -> Iterator[str | Atom]:
    if isinstance(expr, Atom):
        yield expr
    elif isinstance(expr, Not):
        yield "not"
        yield from _prefix_tokens(expr.arg)
    else:
        yield "and" if isinstance(expr, And) else "or"
        yield from _prefix_tokens(expr.left)
        yield from _prefix_tokens(expr.right)


def _mask_params(expr: Expr) -> list[tuple[str, ParamValue]]:
    params, pending = [], []
    for token in _prefix_tokens(expr):
        if isinstance(token, Atom):
            _check_atom(token, MASK_ATOMS)
            params.append((".".join(pending + [token.name]), token.value))
            pending = []
        else:
            pending.append(token)
    return params


def _parse_prefix(stream: Iterator[str | Atom], variant: Variant) -> Expr:
    token = next(stream, None)
    if token is None:
        raise ValueError(f"{variant.token!r}: a connective lacks its operand; "
                         "every and./or. needs two atoms after it, not. one")
    if isinstance(token, Atom):
        return token
    if token == "not":
        return Not(_parse_prefix(stream, variant))
    left = _parse_prefix(stream, variant)
    right = _parse_prefix(stream, variant)
    return And(left, right) if token == "and" else Or(left, right)


def _check_atom(atom: Atom, allowed: tuple[str, ...], key: str | None = None) -> Atom:
    where = f"{NAME} parameter {key or atom.name!r}"
    if atom.name not in allowed:
        raise ValueError(f"{where}: unknown atom {atom.name!r}; mask atoms: "
                         f"{\', \'.join(MASK_ATOMS)}; score atoms: {\', \'.join(SCORE_ATOMS)}")
    value = atom.value
    if atom.name in MASK_ATOMS:
        floor = 1 if atom.name in _AT_LEAST_ONE else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < floor:
            raise ValueError(f"{where}: {atom.name} takes an integer >= {floor}, got {value!r}")
    elif not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0
              and re.fullmatch(r"\\d+(\\.\\d+)?", _number(value))):
        raise ValueError(f"{where}: {atom.name} takes a positive number written plainly "
                         f"(like 0.5 or 20), got {value!r}")
    return atom


def _number(value: ParamValue) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
''',
    'cases.custom': '''"""Variants from outside the suite: case modules named by ``--cases-module`` or installed under
the entry point group ``flexattention_conformance.cases`` (docs/cases.md).

A case module is an importable Python module that

- registers the builder of each of its variants with ``@cases.variants.builder("name")``
  (importing the module is what registers them, in every process that runs its cases), and
- exposes ``cases(profile: str) -> list[Case]``: its cases for the profile (full or smoke).

``load_case_modules`` imports the modules and collects their cases (the parent process);
``import_case_modules`` only imports them (the child process, before building any mods).
"""
from __future__ import annotations

import importlib
import re
import sys
from importlib.metadata import entry_points
from types import ModuleType

from cases.catalog import PROFILES, check_profile, matrix
from cases.model import Case, Variant
from cases import variants

ENTRY_POINT_GROUP = "flexattention_conformance.cases"
_MODULE_NAME = re.compile(r"[A-Za-z_]\\w*(\\.[A-Za-z_]\\w*)*")
#: variant name -> the case module whose import registered it (this process).
_REGISTERED_BY: dict[str, str] = {}


def entry_point_case_modules() -> list[str]:
    """The module names installed under ``flexattention_conformance.cases`` (by entry name)."""
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return [ep.value.partition(":")[0].strip() for ep in found]


def import_case_modules(names: list[str]) -> list[ModuleType]:
    """Import each case module once (registering its variants); ValueError, one line, for a
    name that is not an importable module. Importing again is a no-op."""
    modules = []
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ValueError(f"case module {name!r} is not a Python module name; write a dotted "
                             "name like my_variants (for a file my_variants.py, put its "
                             "directory on PYTHONPATH)")
        if name in sys.modules:
            modules.append(sys.modules[name])
            continue
        before = set(variants.registered_variants())
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                raise ValueError(f"case module {name!r} cannot be found; install it or put "
                                 "its directory on PYTHONPATH") from None
            raise ValueError(f"case module {name!r} failed to import: {exc}; install what "
                             "it needs") from None
        except Exception as exc:  # noqa: BLE001 - the user\'s module: say which and why
            raise ValueError(f"case module {name!r} failed to import: "
                             f"{type(exc).__name__}: {exc}; fix the module") from None
        for variant in set(variants.registered_variants()) - before:
            _REGISTERED_BY[variant] = name
        modules.append(module)
    return modules


def load_case_modules(names: list[str], profile: str = "full") -> list[Case]:
    """The cases of every case module in ``names`` for ``profile``, in module order.

    ValueError (one line, naming the module and the fix) when a module cannot be imported,
    has no ``cases(profile)``, returns something else than cases, uses a variant without a
    registered builder, or when two cases share an id.
    """
    check_profile(profile)
    collected: list[Case] = []
    for name, module in zip(names, import_case_modules(names)):
        make = getattr(module, "cases", None)
        if not callable(make):
            raise ValueError(f"case module {name!r} has no function cases(profile) -> "
                             "list[Case]; define one (docs/cases.md)")
        for case in make(profile):
            if not isinstance(case, Case):
                raise ValueError(f"case module {name!r}: cases({profile!r}) returned a "
                                 f"{type(case).__name__}; return cases.model.Case objects")
            if case.variant.name not in variants.registered_variants():
                raise ValueError(
                    f"case module {name!r}: case {case.id!r} uses variant "
                    f"{case.variant.name!r}, which has no builder; decorate its builder with "
                    f"@cases.variants.builder({case.variant.name!r})")
            collected.append(case)
    seen: set[str] = set()
    for case in collected:
        if case.id in seen:
            raise ValueError(f"case {case.id!r} is defined twice by the case modules "
                             f"{\', \'.join(names)}; give each case a distinct variant or shape")
        seen.add(case.id)
    _refuse_catalog_ids(collected, names)
    return collected


def _refuse_catalog_ids(collected: list[Case], names: list[str]) -> None:
    """An id means one case forever: a custom case may not reuse a catalog case\'s id (a
    record of it would be read as the catalog\'s case by the report, the gate and repro)."""
    if not collected:
        return
    catalog = {case.id: f"the catalog\'s {\'core\' if \'core\' in case.tags else \'extended\'} matrix "
                        f"({profile} profile)"
               for profile in PROFILES for case in matrix(profile, "all")}
    for case in collected:
        if case.id in catalog:
            owner = _REGISTERED_BY.get(case.variant.name) or " or ".join(names)
            raise ValueError(f"case {case.id!r} of case module {owner!r} has the id of a case "
                             f"of {catalog[case.id]}; give the custom case another variant "
                             "name, parameters or shape")


def select_cases(profile: str, matrix_name: str, modules: list[str]) -> list[Case]:
    """The cases of one run: the catalog\'s matrix ``matrix_name`` (none for ``custom``)
    followed by the cases of the case modules. ``custom`` without a case module is a
    ValueError: it would run nothing."""
    if matrix_name == "custom" and not modules:
        raise ValueError("--matrix custom runs only the cases of case modules, and none is "
                         "given; pass --cases-module MODULE (docs/cases.md)")
    return matrix(profile, matrix_name) + load_case_modules(modules, profile)


def defining_module(variant_name: str) -> str:
    """The module whose import registers ``variant_name``\'s builder: ``cases.variants`` or
    ``cases.composed`` for the suite\'s own, the case module for a custom one. ValueError when
    no module of this process registered it."""
    if variant_name in _REGISTERED_BY:
        return _REGISTERED_BY[variant_name]
    build = variants._BUILDERS.get(variant_name)  # noqa: SLF001 - same package
    if build is None:
        raise ValueError(f"unknown variant {variant_name!r}; pass its case module with "
                         "--cases-module (docs/cases.md)")
    return build.__module__


def fuzz_variant_sources(names: list[str]) -> list:
    """The ``fuzz_variants(shape) -> list[Variant]`` hooks of the case modules that define one
    (docs/cases.md), each checked as it is called: ValueError, one line, naming the module,
    when it returns something else than variants with a registered builder."""
    sources = []
    for name, module in zip(names, import_case_modules(names)):
        hook = getattr(module, "fuzz_variants", None)
        if hook is None:
            continue
        if not callable(hook):
            raise ValueError(f"case module {name!r}: fuzz_variants is not a function; define "
                             "fuzz_variants(shape) -> list[Variant] (docs/cases.md)")
        sources.append(_checked_source(name, hook))
    return sources


def _checked_source(name: str, hook):
    def variants_for(shape) -> list:
        found = list(hook(shape))
        for variant in found:
            if not isinstance(variant, Variant):
                raise ValueError(f"case module {name!r}: fuzz_variants returned a "
                                 f"{type(variant).__name__}; return cases.model.Variant objects")
            if variant.name not in variants.registered_variants():
                raise ValueError(f"case module {name!r}: fuzz_variants returned variant "
                                 f"{variant.name!r}, which has no builder; decorate its builder "
                                 f"with @cases.variants.builder({variant.name!r})")
        return found

    return variants_for
''',
    'cases.inputs': '''"""Deterministic inputs of a case: derived from the case id and the run seed only.

Values are drawn in float32 from N(0, 1) with a generator seeded from sha256(id, seed), times
the case\'s input scale, then rounded to the case dtype. The golden reference consumes exactly
these rounded values. The output gradient of a backward case (dO) is drawn the same way from
its own seed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from cases.model import Case

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    return TORCH_DTYPES[name]


def input_seed(case_id: str, seed: int) -> int:
    """A 63-bit generator seed that depends on the case id and the run seed only."""
    digest = hashlib.sha256(f"{case_id}|seed={seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor  # [B, Hq, Sq, D]
    k: torch.Tensor  # [Bkv, Hkv, Skv, D]
    v: torch.Tensor  # [Bkv, Hkv, Skv, D]

    def to(self, device: torch.device | str) -> "Inputs":
        return Inputs(self.q.to(device), self.k.to(device), self.v.to(device))


def make_inputs(case: Case, seed: int = 0) -> Inputs:
    """The case\'s q, k, v on the CPU in the case dtype (bit-identical for the same id and seed)."""
    s = case.shape
    gen = torch.Generator().manual_seed(input_seed(case.id, seed))
    dtype = torch_dtype(case.dtype)

    def draw(*size: int) -> torch.Tensor:
        values = torch.randn(*size, generator=gen, dtype=torch.float32)
        return (values * case.input_scale if case.input_scale != 1 else values).to(dtype)

    q = draw(s.B, s.Hq, s.Sq, s.D)
    k = draw(s.Bkv, s.Hkv, s.Skv, s.D)
    v = draw(s.Bkv, s.Hkv, s.Skv, s.D)
    return Inputs(q, k, v)


def make_grad_output(case: Case, seed: int = 0) -> torch.Tensor:
    """dO of a backward case: [B, Hq, Sq, D] in the case dtype, deterministic like the inputs."""
    s = case.shape
    gen = torch.Generator().manual_seed(input_seed(case.id + "|grad_out", seed))
    return torch.randn(s.B, s.Hq, s.Sq, s.D, generator=gen).to(torch_dtype(case.dtype))
''',
    'cases.model': '''"""The data of a conformance case: shape, variant, case, and its stable id.

Nothing here imports torch: reports and the gate read case ids without it.
An id encodes everything that defines a case and never changes meaning:

    <variant token>/<shape token>/<dtype>/<mode>[/x<input scale>]
    sliding_window-w1024/b4-h8x8-s8192x8192-d128/bf16/fwd
    softcap-cap50/b2-h8x8-s2048x2048-d128/bf16/fwd/x8

Modes: ``fwd`` (the output), ``fwd+lse`` (the output and its log-sum-exp), ``fwd+bwd`` (the
output and dQ, dK, dV). The input scale multiplies the N(0, 1) inputs (1 is left out of the id).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

DTYPES = ("bf16", "fp16", "fp32")
MODES = ("fwd", "fwd+lse", "fwd+bwd")

_SHAPE_RE = re.compile(r"^b(\\d+)(?:x(\\d+))?-h(\\d+)x(\\d+)-s(\\d+)x(\\d+)-d(\\d+)$")


#: The id of a fuzzed example\'s record: ``fuzz/`` then the case\'s own id. The case (and so its
#: inputs, golden and spec) is the same as without the prefix; the prefix says where the
#: record came from, so a fuzzed example never passes for a matrix case.
FUZZ_PREFIX = "fuzz/"


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
                f"bad shape token {token!r}; expected like \'b4-h8x8-s8192x8192-d128\'"
            )
        b, bkv, hq, hkv, sq, skv, d = m.groups()
        return cls(int(b), int(hq), int(hkv), int(sq), int(skv), int(d),
                   int(bkv) if bkv else int(b))


ParamValue = int | float


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
            raise ValueError(f"unknown dtype {self.dtype!r}; use one of {\', \'.join(DTYPES)}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; use one of {\', \'.join(MODES)}")
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
            raise ValueError(f"case spec id {data[\'id\']!r} does not match its fields ({case.id!r})")
        return case
''',
    'cases.pointwise': '''"""How a mod is read: point by point, as flex_attention reads it.

flex_attention defines ``mask_mod(b, h, q_idx, kv_idx)`` and ``score_mod(score, b, h, q_idx,
kv_idx)`` as functions of 0-d tensors, one point of the [B, H, Sq, Skv] grid at a time, and
evaluates them batched with four nested ``torch.vmap`` (kv_idx innermost, then q_idx, h, b;
``_vmap_for_bhqkv`` in torch/nn/attention/flex_attention.py) under ``TransformGetItemToIndex``,
its rule that ``table[idx]`` with tensor indices is ``aten.index`` (not a Python int index).
Everything here evaluates mods exactly that way, on any sub-grid: vmap applies the mod to each
point of the grid it is given, so the values on a sub-grid are the values at those points.

A mod that is correct point by point need not be correct on broadcast index grids
(``table[b, q_idx] == table[b, kv_idx]``, ``torch.where`` on shapes that only line up for
scalars, a sum over an indexed slice): calling it once on broadcast grids can build another
mask, or raise. A mod that vmap cannot run (``.item()``, ``int()``, a Python ``if`` on a tensor
value) is rejected by flex_attention too; ``check_mods`` says so in one line.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
from torch.fx.experimental.proxy_tensor import make_fx

#: The index arguments of a mod, in flex_attention\'s order (vmapped outermost first).
INDEX_NAMES = ("b", "h", "q_idx", "kv_idx")

_HOW_TO_WRITE = ("write it as tensor code on 0-d tensors: torch.where(...) instead of a Python "
                 "if/and/or on a tensor value, no .item(), int() or bool(); flex_attention "
                 "applies the same rule")


class PointwiseModError(ValueError):
    """A mod that cannot be evaluated point by point (under torch.vmap)."""


def evaluate_mask(mask_mod: Callable, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                  kv_idx: torch.Tensor) -> torch.Tensor:
    """``mask_mod`` at every point of the grid b x h x q_idx x kv_idx (1-d index tensors):
    a bool tensor [len(b), len(h), len(q_idx), len(kv_idx)]. Dimensions the mask does not
    depend on come back expanded (stride 0, no copy)."""
    with TransformGetItemToIndex():
        mask = _vmap_bhqkv(mask_mod, score=False)(b, h, q_idx, kv_idx)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask_mod returned {mask.dtype}; a mask_mod returns a bool tensor")
    return mask


def evaluate_score(score_mod: Callable, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
                   q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    """``score_mod`` at every point of the grid: ``score`` is [len(b), len(h), len(q_idx),
    len(kv_idx)], each point\'s score in the same place; the result has that shape too."""
    with TransformGetItemToIndex():
        return _vmap_bhqkv(score_mod, score=True)(score, b, h, q_idx, kv_idx)


def _vmap_bhqkv(fn: Callable, score: bool) -> Callable:
    """``fn`` vmapped over b, h, q_idx and kv_idx as flex_attention does (kv_idx innermost);
    the score, when there is one, is mapped at every level."""
    prefix = (0,) if score else ()
    for level in reversed(range(len(INDEX_NAMES))):  # kv_idx first: the innermost vmap
        dims = tuple(0 if i == level else None for i in range(len(INDEX_NAMES)))
        fn = torch.vmap(fn, in_dims=prefix + dims)
    return fn


def check_mods(mask_mod: Callable | None, score_mod: Callable | None, variant: str,
               device: torch.device | str = "cpu") -> None:
    """Raise PointwiseModError (one line: the variant, the reason, how to write it) when a mod
    cannot be evaluated point by point, or returns something else than a scalar per point
    (a bool one for the mask). Runs each mod on a one-point grid (all indices 0)."""
    point = torch.zeros(1, dtype=torch.int64, device=device)
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is None:
            continue
        try:
            if name == "mask_mod":
                out = evaluate_mask(mod, point, point, point, point)
            else:
                score = torch.zeros(1, 1, 1, 1, dtype=torch.float64, device=device)
                out = evaluate_score(mod, score, point, point, point, point)
            if not isinstance(out, torch.Tensor) or out.shape != (1, 1, 1, 1):
                raise TypeError(f"it returned {_shape_of(out)} per point, not a 0-d tensor")
        except Exception as exc:  # noqa: BLE001 - the user\'s mod: say which and why
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise PointwiseModError(
                f"variant {variant!r}: its {name} cannot be evaluated point by point under "
                f"torch.vmap ({type(exc).__name__}: {reason}); {_HOW_TO_WRITE}") from exc


def _shape_of(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"shape {tuple(out.shape[4:])}"
    return f"a {type(out).__name__}"


def mask_dependence(mask_mod: Callable, device: torch.device | str = "cpu") -> frozenset[str]:
    """The index arguments (``INDEX_NAMES``) the value of ``mask_mod`` depends on (its
    captured tensors on ``device``).

    Why it is exact: ``make_fx`` traces the scalar mod on 0-d int64 fake tensors, recording
    every tensor operation, including indexing (under flex_attention\'s ``TransformGetItemToIndex``).
    Fake tensors carry no values, so a mod whose Python code branches on, or converts, an
    index\'s value raises instead of being traced down one path; the graph therefore computes
    the output for every index value, and an argument whose placeholder has no path to the
    output cannot change it. The converse need not hold (``q_idx * 0`` counts as a
    dependence): the answer errs only towards more dimensions, which costs memory, never
    correctness. A mod that cannot be traced at all (an operation without a fake kernel)
    counts as depending on everything, for the same reason.
    """
    args = [torch.zeros((), dtype=torch.int64, device=device) for _ in INDEX_NAMES]
    try:
        with TransformGetItemToIndex():
            graph = make_fx(mask_mod, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
    except Exception:  # noqa: BLE001 - untraceable: assume the worst (see above)
        return frozenset(INDEX_NAMES)
    nodes = list(graph.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    reached, stack = set(), [n for n in nodes if n.op == "output"]
    while stack:
        for source in stack.pop().all_input_nodes:
            if source not in reached:
                reached.add(source)
                stack.append(source)
    return frozenset(name for name, node in zip(INDEX_NAMES, placeholders) if node in reached)
''',
    'cases.variants': '''"""The variant catalog: one constructor (data) and one builder (mods) per variant.

A constructor returns a ``Variant`` (name + parameters) and is what the matrix uses.
A builder turns that data into FlexAttention mods for one shape on one device:
``mask_mod(b, h, q_idx, kv_idx) -> bool`` and ``score_mod(score, b, h, q_idx, kv_idx)``,
where ``score`` is the already scaled ``q.k / sqrt(D)``. Each mod is a function of one point:
0-d tensors in, a 0-d tensor out. FlexAttention evaluates it batched with torch.vmap, and so
does the float64 golden (cases/pointwise.py); it need not be correct on broadcast grids.

Adding a variant is one edit in this file: a constructor, a builder with ``@builder``.
Never change what an existing name and its parameters compute: ids must keep their meaning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from cases.model import Shape, Variant

MaskMod = Callable[..., torch.Tensor]
ScoreMod = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Mods:
    """The callables of one variant on one shape.

    ``per_batch_head`` is deprecated and ignored: what the mask depends on (b, h) is read off
    the mask itself (cases.pointwise.mask_dependence), for the block mask and the memory
    estimate alike.
    """

    mask_mod: MaskMod | None
    score_mod: ScoreMod | None
    per_batch_head: bool = False

    def __post_init__(self) -> None:
        if self.per_batch_head:
            warnings.warn("Mods(per_batch_head=True) is deprecated and ignored: the suite "
                          "finds what the mask depends on by itself; drop the argument",
                          DeprecationWarning, stacklevel=3)


Builder = Callable[[Variant, Shape, torch.device], Mods]
_BUILDERS: dict[str, Builder] = {}


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register the builder of the variant called ``name``."""

    def register(fn: Builder) -> Builder:
        if name in _BUILDERS and _BUILDERS[name] is not fn:
            raise ValueError(f"variant {name!r} is defined twice")
        _BUILDERS[name] = fn
        return fn

    return register


def registered_variants() -> list[str]:
    return sorted(_BUILDERS)


def build_mods(variant: Variant, shape: Shape, device: torch.device | str = "cpu") -> Mods:
    """The mods of ``variant`` for ``shape``, with captured tensors on ``device``."""
    try:
        build = _BUILDERS[variant.name]
    except KeyError:
        raise ValueError(
            f"unknown variant {variant.name!r}; known: {\', \'.join(registered_variants())}"
            " (custom variants: pass --cases-module)"
        ) from None
    return build(variant, shape, torch.device(device))


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


# --- 1. full ---------------------------------------------------------------------------
def full() -> Variant:
    """Plain softmax attention: every query sees every key, no score change."""
    return Variant("full")


@builder("full")
def _build_full(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    return Mods(None, None)


# --- 2. causal -------------------------------------------------------------------------
def causal() -> Variant:
    """Causal: query i sees keys j <= i."""
    return Variant("causal")


@builder("causal")
def _build_causal(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    return Mods(_causal, None)


# --- 3. sliding_window -----------------------------------------------------------------
def sliding_window(window: int) -> Variant:
    """Causal look-back window: query i sees keys j with i - window < j <= i (``window`` keys,
    itself included)."""
    return Variant("sliding_window", (("w", window),))


@builder("sliding_window")
def _build_sliding_window(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    window = int(variant.param("w"))

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return Mods(sliding_window_mask, None)


# --- 4. prefix_lm ----------------------------------------------------------------------
def prefix_lm(prefix: int) -> Variant:
    """Prefix LM: keys j < prefix are seen by every query (bidirectional prefix); after it,
    causal (j <= i)."""
    return Variant("prefix_lm", (("p", prefix),))


@builder("prefix_lm")
def _build_prefix_lm(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    prefix = int(variant.param("p"))

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    return Mods(prefix_lm_mask, None)


# --- 5. document -----------------------------------------------------------------------
#: Relative document lengths, in units of S/64; they sum to 64, so the documents tile the
#: sequence exactly, and none starts on a 128-token block boundary past the first.
DOCUMENT_LENGTH_PATTERN = (5, 11, 3, 17, 8, 13, 7)


def document() -> Variant:
    """Packed documents, causal within each document, none across.

    Document lengths are ``DOCUMENT_LENGTH_PATTERN`` x S/64 (for S=1024: 80, 176, 48, 272,
    128, 208, 112); the document id of every token is held in a captured tensor.
    """
    return Variant("document")


def document_lengths(seq_len: int) -> list[int]:
    """Lengths of the packed documents of a sequence of ``seq_len`` tokens (sum = seq_len)."""
    unit = seq_len // sum(DOCUMENT_LENGTH_PATTERN)
    lengths = [n * unit for n in DOCUMENT_LENGTH_PATTERN] if unit else [seq_len]
    lengths[-1] += seq_len - sum(lengths)
    return lengths


@builder("document")
def _build_document(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    if shape.Sq != shape.Skv:
        raise ValueError(f"document masking needs Sq == Skv, got {shape.Sq} and {shape.Skv}")
    lengths = document_lengths(shape.Skv)
    doc_ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device),
        torch.tensor(lengths, device=device),
    )

    def document_causal_mask(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)

    return Mods(document_causal_mask, None)


# --- 6. alibi --------------------------------------------------------------------------
def alibi() -> Variant:
    """Causal plus ALiBi: score + slope_h * (j - i), slope_h = 2^(-8 (h+1) / H)."""
    return Variant("alibi")


def alibi_slopes(num_heads: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]


@builder("alibi")
def _build_alibi(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    slopes = torch.tensor(alibi_slopes(shape.Hq), dtype=torch.float32, device=device)

    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return Mods(_causal, alibi_bias)


# --- 7. softcap ------------------------------------------------------------------------
def softcap(cap: float) -> Variant:
    """Causal plus tanh soft-capping of the scores: cap * tanh(score / cap)."""
    return Variant("softcap", (("cap", cap),))


@builder("softcap")
def _build_softcap(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    cap = float(variant.param("cap"))

    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return Mods(_causal, tanh_softcap)


# --- 8. rel_bias -----------------------------------------------------------------------
#: Seed of the deterministic "learned" bias table (fixed: it is part of the variant\'s meaning).
REL_BIAS_TABLE_SEED = 20240917


def rel_bias(num_buckets: int) -> Variant:
    """Causal plus a learned relative-position bias per head, T5 style.

    score + table[h, bucket(|i - j|)]. Distances below num_buckets/2 get a bucket each; longer
    ones share log-spaced buckets (two per octave) up to the last. ``table`` is a deterministic
    N(0, 1) [H, num_buckets] tensor; the bucket of each distance is a captured lookup tensor.
    """
    return Variant("rel_bias", (("nb", num_buckets),))


def relative_buckets(max_distance: int, num_buckets: int) -> list[int]:
    """Bucket of every distance 0..max_distance-1 (exact below nb/2, log2-spaced above)."""
    exact = num_buckets // 2
    buckets = []
    for d in range(max_distance):
        if d < exact:
            buckets.append(d)
            continue
        octave = d.bit_length() - exact.bit_length()  # how many doublings past `exact`
        half = 1 if d >= (3 << (d.bit_length() - 2)) else 0  # upper half of the octave
        buckets.append(min(exact + 2 * octave + half, num_buckets - 1))
    return buckets


@builder("rel_bias")
def _build_rel_bias(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    num_buckets = int(variant.param("nb"))
    gen = torch.Generator().manual_seed(REL_BIAS_TABLE_SEED)
    table = torch.randn(shape.Hq, num_buckets, generator=gen).to(device)
    max_distance = max(shape.Sq, shape.Skv)
    bucket_of = torch.tensor(relative_buckets(max_distance, num_buckets), device=device)

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, bucket_of[(q_idx - kv_idx).abs()]]

    return Mods(_causal, relative_bias)


# --- padded_causal (extended matrix: fully masked rows) -------------------------------------
def padded_causal(valid: int) -> Variant:
    """Causal over the first ``valid`` tokens; the rest is padding. Padded keys are never seen
    and padded queries see nothing: their rows are fully masked (output 0, lse -inf)."""
    return Variant("padded_causal", (("v", valid),))


@builder("padded_causal")
def _build_padded_causal(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    valid = int(variant.param("v"))

    def padded_causal_mask(b, h, q_idx, kv_idx):
        return (q_idx < valid) & (kv_idx <= q_idx)

    return Mods(padded_causal_mask, None)


# --- composed (masks with and/or/not, score chains; what the fuzzer draws) ------------------
from cases import composed as _composed  # noqa: E402,F401  (registers its builder)
''',
    'conformance': '''"""Runner, backends and the pytest matrix of the conformance suite."""
''',
    'conformance.backends': '''"""Built-in backends and the registry (conformance/backends/registry.py)."""
''',
    'conformance.backends.base': '''"""The backend interface: what the suite needs to know about a place flex_attention runs.

A backend is a small object (docs/backends.md). The parent process (pytest) asks it whether
it is available, what environment to record, which cases it supports and what environment
variables each worker\'s child needs. The child process asks it for the device and for the
callable to run; the first call of that callable is timed as the compile phase.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from cases.model import Case


class FatalSetupError(RuntimeError):
    """Raised by ``warm_up`` when no case can be run or timed honestly in this child (the
    backend\'s package cannot be imported, it offers no way to wait for the device). Every
    case of the child is then HARNESS_ERROR with this message, never a backend label."""


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""  # why not (and how to fix it) when unavailable


@dataclass(frozen=True)
class WorkerSlot:
    """Which slice of the machine one pytest worker\'s child may use."""

    index: int  # 0-based worker index (gw3 -> 3)
    count: int  # number of workers


def threads_per_worker(slot: WorkerSlot) -> int:
    """A fair share of the machine\'s cores for one worker (at least 1)."""
    import os

    return max(1, (os.cpu_count() or 1) // max(1, slot.count))


#: fn(q, k, v, score_mod, block_mask) -> output tensor
AttentionFn = Callable[..., Any]


class Backend:
    """Base class of all backends; subclasses override what differs."""

    name: str = ""
    description: str = ""
    device_type: str = "cpu"
    compiled: bool = False  # True when the first call compiles (the compile phase means something)

    def availability(self) -> Availability:
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        """Versions and device description to print beside the results (parent process)."""
        import platform

        import torch

        return {
            "backend": self.name,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": platform.node(),
            "platform": platform.platform(),
        }

    def check_worker_count(self, count: int) -> None:
        """In the controller, before anything runs: raise ValueError (one line) when
        ``count`` workers cannot each get their slice of the device."""

    def unsupported_reason(self, case: Case) -> str | None:
        """None when the backend runs ``case``; otherwise why not (becomes UNSUPPORTED)."""
        return None

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        """Environment variables for the child process of worker ``slot`` (device slice,
        thread count, compiler cache directory; ``cache_dir`` None means the default)."""
        return {}

    def process_cache_env(self, cache_dir: str, cold: bool) -> dict[str, str]:
        """Environment variables for a compiler that reads its cache settings once per
        process: with ``cold``, no cache may serve any case of the child; otherwise the
        shared cache ``cache_dir`` (never a host-wide default). {}: nothing of the kind."""
        return {}

    def device(self) -> str:
        """The torch device string the child runs on (after child_env took effect)."""
        return self.device_type

    def artifact_env(self, directory: str) -> dict[str, str]:
        """Environment variables that make a child keep its compile artefacts in
        ``directory`` (one per child process; {}: this backend keeps none). The executor files
        each case\'s new artefacts under the report directory when the case fails."""
        return {}

    def warm_up(self) -> None:
        """In the child, once at start: pay one-time start-up costs (compiler initialisation)
        so that no case\'s compile seconds include them. Errors here are logged, not fatal,
        except FatalSetupError (every case of the child becomes HARNESS_ERROR)."""

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        """In the child, before each case: forget everything compiled for earlier cases (each
        case compiles afresh for its static shape), clear compile counters, and point the
        compiler cache at ``cache_dir`` (None: leave it). ``cold`` asks for empty in-memory
        caches too (the run uses ``--compile-cache cold``)."""

    def prepare(self, case: Case) -> AttentionFn:
        """In the child: the callable that computes the case (compiled lazily on first call)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (timing); nothing to do on the CPU."""

    def cache_hit(self) -> bool | None:
        """In the child, after the first call: whether the compile hit a cache (None: unknown)."""
        return None

    def compile_breakdown(self) -> dict[str, float] | None:
        """In the child, after the first call: its compile stages (name to seconds) as the
        compiler itself measured them; None when it does not say. The child adds the
        remainder of the compile phase as ``other``."""
        return None

    def fallback_ops(self) -> list[str]:
        """In the child, after the timed runs: operations of the case that ran on the host
        instead of the device. Any makes the case COMPILE_ERROR: a computation that fell
        back is not the backend\'s."""
        return []

    def is_execution_timeout(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the device runtime\'s own execution timeout (then RUN_TIMEOUT,
        not RUNTIME_ERROR)."""
        return False
''',
    'conformance.backends.cpu': '''"""The built-in CPU backends: flex_attention run eagerly, and compiled by Inductor.

``cpu-inductor`` compiles ``flex_attention`` with ``fullgraph=True`` (a graph break raises
instead of silently running part of the call eagerly) and ``dynamic=False`` (every case
compiles for its own static shape). ``begin_case`` resets Dynamo before each case, so a
reused child never turns a later compile into a cheap dynamic-shape recompile, and in cold
mode also clears Inductor\'s in-memory code caches (a new cache directory alone is not
enough: a kernel compiled earlier in the process would be loaded from memory).
Inductor\'s CPU lowering of flex_attention raises rather than falling back to eager.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from cases.model import Case
from conformance import compat
from conformance.backends.base import AttentionFn, Backend, WorkerSlot, threads_per_worker

#: A tiny case compiled once when a child starts: it pays the process\'s one-time compiler
#: start-up (~15 s on a 2-core machine) so that no case\'s compile seconds include it.
WARM_UP_SHAPE = (1, 1, 128, 16)  # B, H, S, D


class CpuEager(Backend):
    name = "cpu-eager"
    description = "flex_attention called eagerly on the CPU (unfused reference path of torch)"
    device_type = "cpu"
    compiled = False

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env.update(device="cpu", device_name=_cpu_name(), cpu_count=os.cpu_count())
        return env

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ""}  # never touch a GPU by accident

    def unsupported_reason(self, case: Case) -> str | None:
        # torch\'s own refusal, said before a child spends a compile on it (conformance/compat.py)
        return compat.known_cpu_refusal(case.mode, self.compiled)

    def warm_up(self) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        q, score_mod, block_mask = _warm_up_inputs()
        flex_attention(q, q, q, score_mod=score_mod, block_mask=block_mask)

    def prepare(self, case: Case) -> AttentionFn:
        from torch.nn.attention.flex_attention import flex_attention

        return case_call(flex_attention, case)


class CpuInductor(CpuEager):
    name = "cpu-inductor"
    description = "torch.compile(flex_attention, fullgraph=True, dynamic=False) on the CPU (Inductor)"
    compiled = True

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        env = super().child_env(slot, cache_dir)
        # Inductor\'s parallel compile pool would otherwise start one process per core in
        # every worker\'s child and oversubscribe the machine.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads_per_worker(slot))
        if cache_dir:
            env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        return env

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        env["compiler"] = "inductor"
        env["cxx"] = _cxx_version()
        return env

    def warm_up(self) -> None:
        # bf16, a block mask and a score mod: the code paths the matrix\'s cases take
        q, score_mod, block_mask = _warm_up_inputs()
        compiled = torch_compile_flex()
        compiled(q, q, q, score_mod=score_mod, block_mask=block_mask)

    def begin_case(self, cache_dir: str | None, cold: bool) -> None:
        import torch
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        if cold:
            clear = getattr(torch._inductor.utils, "clear_caches", None)  # torch >= 2.6
            if clear is not None:
                clear()
        if cache_dir:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        counters.clear()

    def prepare(self, case: Case) -> AttentionFn:
        return case_call(torch_compile_flex(), case)

    def cache_hit(self) -> bool | None:
        return inductor_cache_hit()


def case_call(flex: Callable, case: Case) -> AttentionFn:
    """``flex`` (flex_attention, eager or compiled) called as ``case`` needs: GQA enabled when
    Hq != Hkv, and the log-sum-exp asked for in ``fwd+lse`` mode (compat picks the API)."""
    gqa = case.shape.Hq != case.shape.Hkv
    lse = case.mode == "fwd+lse"

    def call(q, k, v, score_mod, block_mask):
        return compat.attention(flex, q, k, v, score_mod, block_mask, enable_gqa=gqa,
                                return_lse=lse)

    return call


def torch_compile_flex():
    """flex_attention compiled by Inductor for one static shape, graph breaks forbidden."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True, dynamic=False)


def _warm_up_inputs():
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    b, h, s, d = WARM_UP_SHAPE
    q = torch.randn(b, h, s, d, dtype=torch.bfloat16)

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    def halve(score, b, h, q_idx, kv_idx):
        return score * 0.5

    return q, halve, create_block_mask(causal, None, None, s, s, device="cpu")


def inductor_cache_hit() -> bool | None:
    """Whether the last compile was served by Inductor\'s FX graph cache (None: no lookup)."""
    from torch._dynamo.utils import counters

    stats = counters["inductor"]
    if stats.get("fxgraph_cache_hit", 0):
        return True
    if stats.get("fxgraph_cache_miss", 0) or stats.get("fxgraph_cache_bypass", 0):
        return False
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cxx_version() -> str:
    import shutil
    import subprocess

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or ""
    if not cxx:
        return "none found"
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.splitlines()[0] if out.stdout else cxx
    except (OSError, subprocess.SubprocessError):
        return cxx
''',
    'conformance.backends.registry': '''"""Finding a backend by name: built-ins, installed plugins, ``module:object`` and ``auto``.

A backend is named on the command line as one of:
- a registered name: a built-in (``BUILTIN``) or an installed plugin, i.e. an entry point in
  the group ``flexattention_conformance.backends`` whose value is ``package.module:object``;
- ``package.module:object``: a backend importable from the current environment;
- ``auto``: the first available backend of ``AUTO_PREFERENCE``.
``object`` may be a Backend subclass (instantiated without arguments), an instance, or a
function returning one. Modules are imported only when their backend is asked for.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from conformance.backends.base import Backend

ENTRY_POINT_GROUP = "flexattention_conformance.backends"

#: Built-in backends: name -> "module:object" (imported lazily).
BUILTIN: dict[str, str] = {
    "cpu-eager": "conformance.backends.cpu:CpuEager",
    "cpu-inductor": "conformance.backends.cpu:CpuInductor",
    "cuda-eager": "conformance.backends.cuda:CudaEager",
    "cuda-inductor": "conformance.backends.cuda:CudaInductor",
    "neuron": "conformance.backends.neuron:Neuron",
}

#: What ``auto`` picks: the first of these that is registered and available here.
AUTO_PREFERENCE = ("cuda-inductor", "neuron", "cpu-inductor")


class BackendError(ValueError):
    """A backend that cannot be used; the message says which and what to do."""


def registered() -> dict[str, str]:
    """Every backend known by name: built-ins, then installed plugins (name -> target)."""
    names = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def load_backend(spec: str) -> Backend:
    """The backend named ``spec`` (a registered name or ``package.module:object``), available
    or not; ``auto`` is resolved by ``resolve_backend``."""
    names = registered()
    target = names.get(spec)
    if target is None and ":" not in spec:
        raise BackendError(
            f"unknown backend {spec!r}; available: auto, {\', \'.join(names)}"
            " (or package.module:object)")
    return _instantiate(target or spec, spec)


def resolve_backend(spec: str) -> Backend:
    """The backend to run: ``spec`` itself if available, or for ``auto`` the best available.

    Raises BackendError naming the backend and the reason when it cannot run here.
    """
    if spec == "auto":
        names = registered()
        reasons = []
        for name in AUTO_PREFERENCE:
            if name not in names:
                continue
            backend = load_backend(name)
            availability = backend.availability()
            if availability.available:
                return backend
            reasons.append(f"{name}: {availability.reason}")
        raise BackendError("no backend is available for --backend auto; " + "; ".join(reasons))
    backend = load_backend(spec)
    availability = backend.availability()
    if not availability.available:
        raise BackendError(f"backend {spec!r} is not available here: {availability.reason}")
    return backend


def _instantiate(target: str, spec: str) -> Backend:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise BackendError(f"bad backend {spec!r}; write package.module:object")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"backend {spec!r}: cannot import {module_name!r} ({exc});"
                           " install it or fix PYTHONPATH") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendError(f"backend {spec!r}: module {module_name!r} has no {attr!r}") from None
    if isinstance(obj, type) and issubclass(obj, Backend):
        obj = obj()
    elif not isinstance(obj, Backend) and callable(obj):
        obj = obj()
    if not isinstance(obj, Backend):
        raise BackendError(f"backend {spec!r} is a {type(obj).__name__}, not a"
                           " conformance.backends.base.Backend (subclass it)")
    if not obj.name:
        raise BackendError(f"backend {spec!r} has an empty name; set the class attribute `name`")
    return obj
''',
    'conformance.child': '''"""The child process: runs cases of one backend, one at a time, reporting each phase.

Started by ``conformance.supervisor`` as
``python -m conformance.child --backend SPEC --events-fd N`` in a session of its own (so the
watchdog can kill it with every compiler subprocess it started). Requests arrive as JSON lines
on stdin; events leave as JSON lines on fd N. stdout and stderr go to a log file, so nothing a
compiler prints can corrupt the protocol. Events:

    {"event": "phase", "phase": "warm-up" | "setup" | "compile" | "run"}
    {"event": "ready", "warm_up_seconds": s, "warm_up_error": str | null, "fatal": str | null}
    {"event": "done", "setup_seconds": s, "compile_seconds": s, "run_seconds": s | null,
     "cache_hit": bool | null, "compile_breakdown": {stage: s} | null, "output_path": path | null}
    {"event": "error", "phase": p, "kind": "error" | "oom" | "unsupported" | "harness"
     | "exec-timeout", "message": "Type: first line", "detail": "traceback"}

A request with ``"compile_only": true`` (``--phase compile``) stops after the compile phase:
no timed runs, no output file. A warm-up that raised FatalSetupError makes every request an
error of kind ``harness`` carrying that message.

The output tensor goes through a file (it can be tens of MB), never through the pipe.
The verdict is not computed here: the parent compares the output with the reference.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable

_OOM_TEXTS = ("out of memory", "can\'t allocate memory", "cannot allocate memory")

Emit = Callable[..., None]


def classify_exception(exc: BaseException, backend=None) -> str:
    """The kind of a failure: oom, unsupported (upstream\'s own sentence, matched whole:
    conformance.compat.UNSUPPORTED_SENTENCES), exec-timeout (the device runtime\'s own
    execution timeout, as ``backend`` recognises it) or error."""
    from conformance.compat import unsupported_sentence

    text = str(exc)
    if isinstance(exc, MemoryError) or any(t in text.lower() for t in _OOM_TEXTS):
        return "oom"
    if unsupported_sentence(exc):
        return "unsupported"
    if backend is not None and _recognised_timeout(backend, exc):
        return "exec-timeout"
    return "error"


def _recognised_timeout(backend, exc: BaseException) -> bool:
    try:
        return bool(backend.is_execution_timeout(exc))
    except Exception:  # noqa: BLE001 - a broken recogniser leaves the error an error
        return False


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` for the unsupported mapping (exact text) and for one-line summaries."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class CaseFailed(Exception):
    def __init__(self, phase: str, kind: str, exc: BaseException):
        super().__init__(phase)
        self.phase, self.kind, self.exc = phase, kind, exc


def _guard(phase: str, fn: Callable[[], Any], harness: bool = False, backend=None) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a labelled event
        kind = "harness" if harness else classify_exception(exc, backend)
        raise CaseFailed(phase, kind, exc) from exc


def run_case(backend, request: dict, emit: Emit, fatal: str | None = None) -> None:
    """Run one case; emits phase events and exactly one ``done`` or ``error`` event (the
    error carries the seconds of the phases that finished). ``fatal``: why this child can
    run no case (a FatalSetupError at warm-up)."""
    timings: dict[str, Any] = {}
    if fatal:
        emit(event="error", phase="setup", kind="harness", message=fatal, detail="")
        return
    try:
        _run_phases(backend, request, emit, timings)
        emit(event="done", **timings)
    except CaseFailed as failed:
        traceback.print_exception(failed.exc)  # into the child\'s log, kept with the artefacts
        detail = "".join(traceback.format_exception(failed.exc)[-12:])
        message = describe_exception(failed.exc)
        if failed.kind == "unsupported":  # upstream\'s words, unwrapped from Dynamo\'s or Inductor\'s
            from conformance.compat import unsupported_sentence

            sentence = unsupported_sentence(failed.exc)
            if not str(failed.exc).strip().startswith(sentence):
                message = sentence
        emit(event="error", phase=failed.phase, kind=failed.kind,
             message=message, detail=detail, **timings)


def _run_phases(backend, request: dict, emit: Emit, timings: dict) -> None:
    import torch

    from cases.custom import import_case_modules
    from cases.inputs import make_grad_output, make_inputs
    from cases.model import Case
    from cases.variants import build_mods
    from conformance.contract import check_gradients, check_result

    emit(event="phase", phase="setup")
    start = time.perf_counter()
    _guard("setup", lambda: import_case_modules(request.get("cases_modules") or []), harness=True)
    case = _guard("setup", lambda: Case.from_json(request["case"]), harness=True)
    _guard("setup", lambda: backend.begin_case(request.get("cache_dir"), request.get("cold", True)))
    device = _guard("setup", backend.device)
    seed = request.get("seed", 0)
    inputs = _guard("setup", lambda: make_inputs(case, seed), harness=True)
    mods = _guard("setup", lambda: build_mods(case.variant, case.shape, device), harness=True)
    inputs = _guard("setup", lambda: inputs.to(device))
    backward = case.mode == "fwd+bwd"
    grad_out = _guard("setup", lambda: make_grad_output(case, seed).to(device)) if backward else None
    mask = _guard("setup", lambda: _block_mask(case, mods, device))
    fn = _guard("setup", lambda: backend.prepare(case))
    timings["setup_seconds"] = time.perf_counter() - start

    def call():  # every result is checked: a wrong structure is the call\'s phase\'s error
        if not backward:
            result = fn(inputs.q, inputs.k, inputs.v, mods.score_mod, mask)
            backend.synchronize()
            return check_result(case, result, inputs.q.dtype, device)
        q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        out = check_result(case, fn(q, k, v, mods.score_mod, mask), inputs.q.dtype, device)
        grads = torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)
        check_gradients(case, grads)
        backend.synchronize()
        return out, dict(zip(("dq", "dk", "dv"), grads))

    emit(event="phase", phase="compile")
    start = time.perf_counter()
    result = _guard("compile", call, backend=backend)
    timings["compile_seconds"] = time.perf_counter() - start
    timings["cache_hit"] = _cache_hit(backend)
    timings["compile_breakdown"] = _compile_breakdown(backend, timings["compile_seconds"])
    if request.get("compile_only"):
        _refuse_fallbacks(backend, "compile")
        return

    emit(event="phase", phase="run")
    times = []
    for _ in range(max(1, int(request.get("runs", 3)))):
        start = time.perf_counter()
        result = _guard("run", call, backend=backend)
        times.append(time.perf_counter() - start)
    _refuse_fallbacks(backend, "run")
    output_path = request["output_path"]
    _guard("run", lambda: torch.save(_observed(case, result), output_path), harness=True)
    timings["run_seconds"] = statistics.median(times)
    timings["output_path"] = output_path


def _cache_hit(backend) -> bool | None:
    """Whether the compile hit a cache; unknown (None) when the backend cannot say, or fails
    to: a broken counter must not turn a compiled case into a crash."""
    try:
        return backend.cache_hit()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return None


def _compile_breakdown(backend, compile_seconds: float) -> dict[str, float] | None:
    """The compiler\'s own stage times for the first call, plus ``other``: the rest of the
    compile phase (tracing the suite\'s call, the execution, waiting), so the stages always
    sum to the phase. None when the backend does not report stages, or fails to."""
    try:
        stages = backend.compile_breakdown()
    except Exception:  # noqa: BLE001 - a broken counter must not fail a compiled case
        traceback.print_exc()
        return None
    if not stages:
        return None
    breakdown = {str(name): max(0.0, float(seconds)) for name, seconds in stages.items()}
    breakdown["other"] = max(0.0, compile_seconds - sum(breakdown.values()))
    return breakdown


def _refuse_fallbacks(backend, phase: str) -> None:
    """A case whose operations ran on the host instead of the device fails: its numbers and
    times are not the backend\'s (COMPILE_ERROR, the compiler did not take the graph)."""
    ops = _guard(phase, backend.fallback_ops)
    if ops:
        names = ", ".join(sorted(set(map(str, ops))))
        raise CaseFailed("compile", "error", RuntimeError(
            f"{len(ops)} operation(s) fell back to the CPU instead of running on the device: "
            f"{names}; a case that ran on the host cannot pass"))


def _block_mask(case, mods, device):
    """The case\'s BlockMask, or None. Built per batch or per head only when the mask depends
    on them; per batch when key/value are broadcast over the batch (flex_attention requires a
    block mask of the query batch then, so an unmasked variant gets a no-op one)."""
    from torch.nn.attention.flex_attention import noop_mask

    from cases.pointwise import mask_dependence
    from conformance import compat
    from conformance.estimates import block_mask_batch_heads

    shape = case.shape
    mask_mod = mods.mask_mod or (noop_mask if shape.Bkv != shape.B else None)
    if mask_mod is None:
        return None
    b, h = block_mask_batch_heads(shape, mask_dependence(mask_mod, device))
    return compat.block_mask(mask_mod, b, h, shape.Sq, shape.Skv, device)


def _observed(case, result) -> dict:
    """What the parent judges, on the CPU: {"out"} plus "lse" or "grads" as the mode needs
    (``result`` has passed conformance.contract.check_result)."""
    if case.mode == "fwd+bwd":
        out, grads = result
        return {"out": out.detach().cpu(), "grads": {k: g.detach().cpu() for k, g in grads.items()}}
    if case.mode == "fwd+lse":
        out, lse = result
        return {"out": out.detach().cpu(), "lse": lse.detach().cpu()}
    return {"out": result.detach().cpu()}


def _die_with_parent() -> None:
    """When the pytest worker dies, take this child and its compiler processes along."""
    parent = os.getppid()
    try:  # Linux: the kernel sends SIGKILL when the parent exits
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch():
        while True:
            if os.getppid() != parent:
                os.killpg(0, signal.SIGKILL)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.child")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--events-fd", type=int, required=True)
    args = parser.parse_args(argv)
    events = os.fdopen(args.events_fd, "w", buffering=1)
    lock = threading.Lock()

    def emit(**event: Any) -> None:
        with lock:
            events.write(json.dumps(event) + "\\n")
            events.flush()

    faulthandler.enable()  # a segfault leaves a Python traceback in the log
    _die_with_parent()
    import torch

    threads = int(os.environ.get("FLEXCONF_NUM_THREADS", "0"))
    if threads > 0:
        torch.set_num_threads(threads)
    from conformance.backends.registry import load_backend

    from conformance.backends.base import FatalSetupError

    backend = load_backend(args.backend)
    emit(event="phase", phase="warm-up")
    start, warm_error, fatal = time.perf_counter(), None, None
    try:
        backend.warm_up()
    except FatalSetupError as exc:  # no case can run or be timed honestly in this child
        fatal = f"the suite cannot run {backend.name} here: {describe_exception(exc)}"
        traceback.print_exc()
    except Exception as exc:  # noqa: BLE001 - a broken compiler shows up in the cases
        warm_error = describe_exception(exc)
        traceback.print_exc()
    emit(event="ready", pid=os.getpid(), warm_up_seconds=time.perf_counter() - start,
         warm_up_error=warm_error, fatal=fatal)
    for line in sys.stdin:
        if line.strip():
            run_case(backend, json.loads(line), emit, fatal)
            sys.stdout.flush()
            sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
''',
    'conformance.compat': '''"""What differs in the flex_attention API between the torch versions the suite supports.

The suite supports torch >= 2.6 (the first release with compiled flex_attention on the CPU)
up to the newest. What changed, and how each difference is handled here:

- The log-sum-exp: ``return_lse=True`` until 2.8; from 2.9 ``return_aux=AuxRequest(lse=True)``
  returns ``(out, AuxOutput)`` and ``return_lse`` is deprecated (a FutureWarning, announced for
  removal). ``attention`` asks for it the way the running torch prefers.
- ``create_block_mask``\'s ``device`` defaulted to ``"cuda"`` in 2.6 and to ``None`` later,
  and its keyword set grew (``separate_full_blocks``, ...). ``block_mask`` always passes the
  device and refuses, in one line, a keyword the running torch lacks.
- The device check: upstream rejects devices outside a fixed list (CUDA or CPU in 2.6; CUDA,
  CPU, HPU (and later XPU, MPS) since) with a ValueError before any kernel runs. Under
  ``torch.compile`` Dynamo re-raises it wrapped (2.13: ``Unsupported: Observed exception``),
  so ``validate_device`` runs upstream\'s own check eagerly first, and
  ``unsupported_device_message`` recovers upstream\'s exact sentence from a wrapped error.

Functions take the torch functions as optional arguments so tests can check both API
generations with stand-ins of the older signatures.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

MIN_TORCH = (2, 6)
#: The start of upstream\'s device rejection, identical in every supported version.
UNSUPPORTED_DEVICE_PREFIX = "FlexAttention is only supported on"
_UNSUPPORTED_DEVICE_RE = re.compile(
    re.escape(UNSUPPORTED_DEVICE_PREFIX) + r"[^\'\\"\\n]*?devices\\.(?: Found input tensors on \\S+ device\\.)?")


def torch_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` (default: the running torch), e.g. \'2.13.0+cpu\' -> (2, 13)."""
    if text is None:
        import torch

        text = torch.__version__
    m = re.match(r"(\\d+)\\.(\\d+)", str(text))
    if not m:
        raise ValueError(f"cannot read a torch version from {text!r}; expected like \'2.13.0\'")
    return int(m.group(1)), int(m.group(2))


def require_supported_torch(text: str | None = None) -> None:
    """Raise RuntimeError (one line) when the running torch is older than the suite supports."""
    version = torch_version(text)
    if version < MIN_TORCH:
        raise RuntimeError(
            f"torch {text or _running_torch()} is too old for this suite (flex_attention needs "
            f">= {MIN_TORCH[0]}.{MIN_TORCH[1]}); install torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}")


@dataclass(frozen=True)
class FlexApi:
    """How one torch version\'s flex_attention hands back the log-sum-exp."""

    lse_via_aux: bool  # return_aux=AuxRequest(lse=True) exists (torch >= 2.9)
    lse_via_flag: bool  # return_lse=True exists (deprecated from 2.9)


def flex_api(flex_attention: Callable | None = None) -> FlexApi:
    """The API of ``flex_attention`` (default: the running torch\'s, computed once)."""
    if flex_attention is None:
        return _running_api()
    params = inspect.signature(flex_attention).parameters
    return FlexApi(lse_via_aux="return_aux" in params, lse_via_flag="return_lse" in params)


@lru_cache(maxsize=1)
def _running_api() -> FlexApi:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_api(flex_attention)


def attention(fn: Callable, q, k, v, score_mod=None, block_mask=None, *, enable_gqa: bool = False,
              return_lse: bool = False, api: FlexApi | None = None) -> Any:
    """Call ``fn`` (flex_attention or a compiled flex_attention): the output, or
    ``(output, lse)`` when ``return_lse``, whichever way the running torch returns the lse.
    ``api`` describes ``fn``\'s torch (default: the running one)."""
    api = api or flex_api()
    kwargs: dict[str, Any] = {"score_mod": score_mod, "block_mask": block_mask}
    if enable_gqa:
        kwargs["enable_gqa"] = True
    if not return_lse:
        return fn(q, k, v, **kwargs)
    if api.lse_via_aux:
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    if api.lse_via_flag:
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
        return out, lse
    raise RuntimeError(f"this torch ({_running_torch()}) offers neither return_aux nor return_lse "
                       "on flex_attention; report it with `python -m torch.utils.collect_env`")


def block_mask(mask_mod: Callable, B: int | None, H: int | None, q_len: int, kv_len: int,
               device: str, *, create: Callable | None = None, **options: Any):
    """``create_block_mask`` (or ``create``, a stand-in) with the device always given (its
    default changed from \'cuda\' to None after 2.6); every keyword in ``options`` (e.g.
    BLOCK_SIZE) must exist in the running version, else a one-line TypeError."""
    if create is None:
        from torch.nn.attention.flex_attention import create_block_mask as create
    unknown = sorted(set(options) - set(inspect.signature(create).parameters))
    if unknown:
        raise TypeError(f"create_block_mask of torch {_running_torch()} has no parameter "
                        f"{unknown[0]!r}; drop it or upgrade torch")
    return create(mask_mod, B, H, q_len, kv_len, device=device, **options)


def validate_device(q, k, v) -> None:
    """Run upstream\'s own device check eagerly (the exact ValueError it raises for a device
    it does not support); nothing when this torch has no such check."""
    from torch.nn.attention import flex_attention as module

    check = getattr(module, "_validate_device", None)
    if check is not None:
        check(q, k, v)


#: Upstream flex_attention\'s own sentences declaring something unsupported, matched whole:
#: its device check, backward on the CPU or MPS, the lse of compiled CPU flex_attention.
UNSUPPORTED_SENTENCES = (
    _UNSUPPORTED_DEVICE_RE,
    re.compile(r"FlexAttention does not support backward on (?:CPU|MPS)\\. Please set the input "
               r"requires_grad to False or use another device\\."),
    re.compile(r"torch\\.compile on CPU only supports inference and `return_lse` is not "
               r"supported yet\\."),
)


#: What CPU flex_attention refuses in every torch from MIN_TORCH to NEWEST_CHECKED_TORCH, in
#: upstream\'s words (matched by UNSUPPORTED_SENTENCES): backends declare these before running
#: (``unsupported_reason``), so the fuzzer never spends an example on them. A newer torch runs
#: the case, and its own error (or its success) decides.
NEWEST_CHECKED_TORCH = (2, 13)
CPU_BACKWARD_SENTENCE = ("FlexAttention does not support backward on CPU. Please set the input "
                         "requires_grad to False or use another device.")
CPU_COMPILED_LSE_SENTENCE = ("torch.compile on CPU only supports inference and `return_lse` is "
                             "not supported yet.")


def known_cpu_refusal(mode: str, compiled: bool, version: tuple[int, int] | None = None) -> str | None:
    """Upstream\'s sentence refusing ``mode`` on the CPU (eager or compiled) in this torch (or
    ``version``), when it is a version this suite has checked; else None."""
    if (version or torch_version()) > NEWEST_CHECKED_TORCH:
        return None
    if mode == "fwd+bwd":
        return CPU_BACKWARD_SENTENCE
    if mode == "fwd+lse" and compiled:
        return CPU_COMPILED_LSE_SENTENCE
    return None


def unsupported_sentence(exc: BaseException) -> str | None:
    """Upstream\'s exact sentence declaring the case unsupported, if ``exc`` carries one in its
    text (also as Dynamo or Inductor word a wrapped error) or in an exception it was raised
    from (``__cause__`` only: an error raised while handling another is its own error)."""
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for sentence in UNSUPPORTED_SENTENCES:
            m = sentence.search(str(current))
            if m:
                return m.group(0)
        current = current.__cause__
    return None


def unsupported_device_message(exc: BaseException) -> str | None:
    """Upstream\'s exact device-rejection sentence carried by ``exc`` (see unsupported_sentence)."""
    sentence = unsupported_sentence(exc)
    return sentence if sentence and _UNSUPPORTED_DEVICE_RE.fullmatch(sentence) else None


def _running_torch() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "(not installed)"
''',
    'conformance.contract': '''"""What a backend\'s ``fn(q, k, v, score_mod, block_mask)`` must return in each mode, checked.

The child checks every call\'s result against this contract before anything is saved or judged
(conformance/child.py). A result of the wrong structure is the backend\'s error, raised as a
``ContractError`` inside the call\'s phase (COMPILE_ERROR on the first call, RUNTIME_ERROR on a
later one), with a message that quotes the contract. Without the check a backend returning the
output alone in ``fwd+lse`` mode would be unpacked along its batch dimension into a wrong
"output" and "lse" and judged a MISMATCH (or fail with a bare unpacking error).
docs/backends.md states the same contract.
"""
from __future__ import annotations

from typing import Any

#: The contract of each mode, as quoted in errors and in docs/backends.md.
CONTRACT: dict[str, str] = {
    "fwd": "fn returns the output: a tensor [B, Hq, Sq, D] in the inputs\' dtype, on the "
           "backend\'s device",
    "fwd+lse": "fn returns a tuple (out, lse): out a tensor [B, Hq, Sq, D] in the inputs\' dtype, "
               "lse a floating-point tensor [B, Hq, Sq] (natural log; flex_attention gives "
               "float32), both on the backend\'s device",
    "fwd+bwd": "fn returns the output: a tensor [B, Hq, Sq, D] in the inputs\' dtype, on the "
               "backend\'s device, differentiable with respect to q, k and v (autograd computes "
               "dQ, dK, dV from it)",
}


class ContractError(TypeError):
    """The backend\'s fn returned something outside the contract of the case\'s mode."""


def check_result(case, result: Any, dtype, device: str) -> Any:
    """``result`` when it keeps ``CONTRACT[case.mode]`` for ``case`` on inputs of ``dtype`` on
    ``device``; raises ContractError (one line: what is wrong, then the contract) otherwise."""
    shape = case.shape
    out_shape = (shape.B, shape.Hq, shape.Sq, shape.D)
    if case.mode == "fwd+lse":
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            got = (f"a {type(result).__name__} of {len(result)} items"
                   if isinstance(result, (tuple, list)) else _kind(result, "a single tensor"))
            _fail(case, f"fn returned {got}")
        out, lse = result
        _check_tensor(case, "out", out, out_shape, device, dtype)
        _check_tensor(case, "lse", lse, out_shape[:3], device, None)
        if not lse.is_floating_point():
            _fail(case, f"lse has dtype {lse.dtype}, not a floating-point dtype")
        return out, lse
    _check_tensor(case, "the output", result, out_shape, device, dtype)
    if case.mode == "fwd+bwd" and not result.requires_grad:
        _fail(case, "the output does not require grad (it is not connected to q, k, v)")
    return result


def check_gradients(case, grads: tuple) -> None:
    """Every one of dQ, dK, dV exists: the output depends on q, k and v."""
    for name, grad in zip(("q", "k", "v"), grads):
        if grad is None:
            _fail(case, f"the output does not depend on {name} (autograd gives no d{name.upper()})")


def _check_tensor(case, what: str, value: Any, expected_shape: tuple, device: str, dtype) -> None:
    import torch

    if not isinstance(value, torch.Tensor):
        _fail(case, f"{what} is {_kind(value)}")
    if tuple(value.shape) != tuple(expected_shape):
        _fail(case, f"{what} has shape {list(value.shape)}, expected {list(expected_shape)}")
    if dtype is not None and value.dtype != dtype:
        _fail(case, f"{what} has dtype {value.dtype}, expected {dtype} (the inputs\')")
    if value.device.type != torch.device(device).type:
        _fail(case, f"{what} is on device {value.device}, expected {device}")


def _kind(value: Any, tensor: str = "a tensor") -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return tensor
    return "None" if value is None else f"a {type(value).__name__}, not a tensor"


def _fail(case, problem: str) -> None:
    raise ContractError(f"{case.mode}: {problem}; the backend contract (docs/backends.md): "
                        f"{CONTRACT[case.mode]}")
''',
    'conformance.estimates': '''"""Estimated peak memory of a case, for the memory gate (and cost, for balancing shards).

Rough on purpose, and erring high: a case counts what its child allocates (inputs, output,
block mask, the score matrix an unfused eager path materialises, compiler working memory)
plus what the parent holds for the verdict (float64 golden, baseline, observed output, and the
reference\'s bounded chunk workspace). ``create_block_mask`` evaluates the mask over the whole
[B?, H?, Sq, Skv] grid in several temporaries, measured here at ~9 bytes per element; which
of B and H the grid has follows what the mask depends on (``block_mask_batch_heads``).
"""
from __future__ import annotations

from cases.model import Case, Shape

GiB = 1 << 30
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Bytes per element of the grid create_block_mask evaluates (measured, rounded up).
_MASK_BYTES_PER_ELEMENT = 10
#: Working memory of a compiler in the child (Inductor measured ~0.6 GiB; rounded up).
_COMPILER_BYTES = 1 * GiB
#: The reference\'s chunk workspace (score chunks of 8 Mi float64 elements, a few copies).
_REFERENCE_WORKSPACE = 512 << 20


def tensor_bytes(case: Case) -> tuple[int, int, int]:
    """Elements of q (and the output), of k plus v, and of one full score matrix."""
    s = case.shape
    q = s.B * s.Hq * s.Sq * s.D
    kv = 2 * s.Bkv * s.Hkv * s.Skv * s.D
    scores = s.B * s.Hq * s.Sq * s.Skv
    return q, kv, scores


def block_mask_batch_heads(shape: Shape,
                           mask_depends_on: frozenset[str]) -> tuple[int | None, int | None]:
    """B and H to pass to create_block_mask (None: one mask shared by every batch or head).

    The batch when the mask depends on ``b``, or when key/value are broadcast over the batch
    (flex_attention then requires a block mask of the query batch); the query heads when the
    mask depends on ``h``. ``mask_depends_on`` is cases.pointwise.mask_dependence\'s answer.
    """
    batch = shape.B if "b" in mask_depends_on or shape.Bkv != shape.B else None
    heads = shape.Hq if "h" in mask_depends_on else None
    return batch, heads


def child_peak_bytes(case: Case, compiled: bool,
                     mask_depends_on: frozenset[str] = frozenset()) -> int:
    q, kv, scores = tensor_bytes(case)
    s = case.shape
    item = _DTYPE_BYTES[case.dtype]
    batch, heads = block_mask_batch_heads(s, mask_depends_on)
    mask_grid = (batch or 1) * (heads or 1) * s.Sq * s.Skv
    total = (2 * q + kv) * item + mask_grid * _MASK_BYTES_PER_ELEMENT
    if compiled:
        total += _COMPILER_BYTES
    else:  # eager flex_attention materialises scores, mask and probabilities in float32
        total += 3 * scores * 4
    if case.mode != "fwd":
        total *= 2
    return total


def parent_peak_bytes(case: Case) -> int:
    q, kv, _ = tensor_bytes(case)
    # float64 copies of q, k, v and the golden output, the float32 baseline, observed output
    return (2 * q + kv) * 8 + q * (4 + _DTYPE_BYTES[case.dtype]) + _REFERENCE_WORKSPACE


def case_peak_bytes(case: Case, compiled: bool,
                    mask_depends_on: frozenset[str] = frozenset()) -> int:
    """Estimated bytes a case needs at its peak, child and parent together; ``mask_depends_on``
    are the index arguments its mask depends on (cases.pointwise.mask_dependence)."""
    return child_peak_bytes(case, compiled, mask_depends_on) + parent_peak_bytes(case)


def relative_cost(case: Case) -> float:
    """A unitless cost of running a case (score elements plus a fixed compile share), for
    balancing work across shards and workers."""
    _, _, scores = tensor_bytes(case)
    return scores * case.shape.D / 1e9 + 1.0
''',
    'conformance.observation': '''"""What the supervised child reported for one case, and the label it implies.

The child (or, when the child hung or died, the watchdog) produces an ``Observation``; the
executor turns it into a ``Record``. Only an observation with outcome ``ok`` needs the verdict
(PASS or MISMATCH); every other outcome decides the label by itself (``label_of``).
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.results import Label

#: outcome values: ok, error, timeout, exec-timeout (the device runtime\'s own), crash, oom,
#: unsupported, harness
#: phase values: start (child imports), warm-up (the backend\'s one-time compiler start-up),
#: setup (inputs, mods, block mask, prepare), compile (first call), run (timed calls, saving)
PHASES = ("start", "warm-up", "setup", "compile", "run")


@dataclass(frozen=True)
class Observation:
    outcome: str
    phase: str
    message: str = ""  # first line: what happened; further lines: detail (traceback, log tail)
    setup_seconds: float | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None
    cache_hit: bool | None = None
    compile_breakdown: dict[str, float] | None = None
    output_path: str | None = None  # the output tensor, saved by the child (outcome ok)


def label_of(obs: Observation) -> Label | None:
    """The label an observation decides by itself; None for ``ok`` (the verdict decides)."""
    if obs.outcome == "ok":
        return None
    if obs.outcome == "timeout":
        if obs.phase in ("compile", "warm-up"):
            return Label.COMPILE_TIMEOUT
        return Label.RUN_TIMEOUT if obs.phase in ("setup", "run") else Label.HARNESS_ERROR
    if obs.outcome == "error":
        if obs.phase == "compile":
            return Label.COMPILE_ERROR
        return Label.RUNTIME_ERROR if obs.phase in ("setup", "run") else Label.HARNESS_ERROR
    fixed = {"exec-timeout": Label.RUN_TIMEOUT, "crash": Label.CRASH, "oom": Label.OUT_OF_MEMORY,
             "unsupported": Label.UNSUPPORTED, "harness": Label.HARNESS_ERROR}
    try:
        return fixed[obs.outcome]
    except KeyError:
        raise ValueError(f"unknown observation outcome {obs.outcome!r}") from None
''',
    'conformance.reference_cache': '''"""The golden output and the dtype baseline of a case, computed once and kept on disk.

Computed in the parent (never in the child), on ``device`` (cpu, or cuda for float64 on a GPU),
and returned on the CPU. The cache key covers everything the numbers depend on: the case id,
the seed, the torch version, the reference version and the source of the modules that define
the inputs, the variants and the reference itself (an edit to any of them is a new key). The
cache directory is bounded: after each write the least recently used entries are removed
until it fits ``max_bytes``. Entries are written atomically, so workers can share it.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Modules whose source defines the reference numbers (part of the cache key); the module
#: that defines the case\'s variant (a custom case module, say) is added per case.
_KEY_MODULES = ("cases.inputs", "cases.variants", "cases.composed", "cases.model",
                "reference.golden")


def compute_reference(case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
    """(golden, baseline) References of ``case`` (output, lse, and gradients for backward
    cases), on the CPU, without any cache."""
    from cases.inputs import make_grad_output, make_inputs
    from reference.golden import reference_pair

    inputs = make_inputs(case, seed)
    grad_out = make_grad_output(case, seed) if case.mode == "fwd+bwd" else None
    if device != "cpu":
        inputs = inputs.to(device)
        grad_out = grad_out.to(device) if grad_out is not None else None
    golden, baseline = reference_pair(case, inputs, grad_out)
    return _on_cpu(golden), _on_cpu(baseline)


def _on_cpu(ref):
    from reference.golden import Reference

    grads = {k: g.cpu() for k, g in ref.grads.items()} if ref.grads else None
    return Reference(ref.out.cpu(), ref.lse.cpu() if ref.lse is not None else None, grads)


class ReferenceCache:
    def __init__(self, directory: str | Path | None, max_bytes: int):
        self.directory = Path(directory) if directory else None
        self.max_bytes = int(max_bytes)

    def get(self, case, seed: int, device: str = "cpu") -> tuple[Any, Any]:
        """The reference of ``case``: from the cache when present, else computed and stored."""
        if self.directory is None:
            return compute_reference(case, seed, device)
        import torch

        from reference.outputs import reference_from_dict, reference_to_dict

        key = cache_key(case.id, seed, device, _variant_module(case))
        path = self.directory / f"{key}.pt"
        try:
            data = torch.load(path, weights_only=True)
            os.utime(path)  # recently used
            return reference_from_dict(data["golden"]), reference_from_dict(data["baseline"])
        except (FileNotFoundError, RuntimeError, KeyError, EOFError):
            pass  # absent, or torn by a crash: compute again
        golden, baseline = compute_reference(case, seed, device)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        torch.save({"golden": reference_to_dict(golden), "baseline": reference_to_dict(baseline)},
                   tmp)
        tmp.replace(path)
        self._evict()
        return golden, baseline

    def _evict(self) -> None:
        entries = []
        for path in self.directory.glob("*.pt"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            total -= size


def cache_key(case_id: str, seed: int, device: str, variant_module: str | None = None) -> str:
    import torch

    from reference.golden import REFERENCE_VERSION

    modules = _KEY_MODULES + ((variant_module,) if variant_module else ())
    text = "|".join([case_id, f"seed={seed}", f"device={device}", f"torch={torch.__version__}",
                     f"reference={REFERENCE_VERSION}", _source_digest(modules)])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _variant_module(case) -> str | None:
    from cases.custom import defining_module

    try:
        return defining_module(case.variant.name)
    except ValueError:
        return None  # the reference computation will say which variant is unknown


@lru_cache(maxsize=8)
def _source_digest(modules: tuple[str, ...]) -> str:
    import importlib

    digest = hashlib.sha256()
    for name in dict.fromkeys(modules):
        module = importlib.import_module(name)
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()
''',
    'conformance.repro_runtime': '''"""What a reproduction script (``flexconf repro``) runs: one case, the way the suite runs it.

The script embeds this module with the suite modules it uses, so the inputs (cases/inputs.py),
the mods, the child\'s phases (conformance/child.py ``run_case``: setup, block mask, the
backend\'s callable, the first call as the compile phase, the timed runs), the reference
(conformance/reference_cache.py ``compute_reference``) and the verdict are the suite\'s own code.
Only torch (and the backend\'s own package) must be installed. There is no watchdog: a hang
hangs, a crash kills the script.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path


def reproduce(case_spec: dict, backend_spec: str, seed: int, runs: int = 3,
              case_modules: tuple[str, ...] = (), recorded: str = "",
              save_outputs: str | None = None, compare: str | None = None) -> int:
    """Run the case, print the phases, the error metrics and the label; 0 when it passes.

    ``save_outputs``: write the inputs, the output, the golden and the baseline there (the
    format of ``--keep-outputs``, reference/outputs.py). ``compare``: a file kept by the run
    (``<report-dir>/outputs/...pt``); print how far this output is from the run\'s."""
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import load_backend

    backend = load_backend(backend_spec)
    workdir = Path(tempfile.mkdtemp(prefix="flexconf-repro-"))
    os.environ.update(backend.child_env(WorkerSlot(0, 1), str(workdir / "compile-cache")))
    import torch

    for name in case_modules:
        importlib.import_module(name)
    from cases.model import Case

    case = Case.from_json(case_spec)
    print(f"case      {case.id}")
    print(f"backend   {backend.name} ({backend_spec}), torch {torch.__version__}, seed {seed}")
    if recorded:
        print(f"recorded  {recorded}")
    reason = backend.unsupported_reason(case)
    if reason:
        return _finish("UNSUPPORTED", reason)
    kept = None
    if compare:
        from reference.outputs import load_case_outputs

        kept = load_case_outputs(compare)
        if kept.case.id != case.id or kept.seed != seed:
            raise SystemExit(f"{compare} holds {kept.case.id} seed {kept.seed}, not this case "
                             f"({case.id} seed {seed}); pass the file kept for this case")
    label, message, metrics, tensors = _run(backend, case, seed, runs, workdir)
    if metrics:
        print("metrics   " + json.dumps(metrics, indent=None, default=str))
    if tensors is not None and save_outputs:
        from reference.outputs import save_case_outputs

        print(f"saved     {save_outputs}")
        save_case_outputs(_case_outputs(case, seed, label, message, tensors), save_outputs)
    if kept is not None:
        print(f"compared  {compare}: {_difference(tensors, kept)}")
    return _finish(label, message)


def _case_outputs(case, seed: int, label: str, message: str, tensors):
    from cases.inputs import make_grad_output, make_inputs
    from reference.outputs import CaseOutputs

    observed, golden, baseline = tensors
    return CaseOutputs(case=case, seed=seed, label=label, message=message,
                       inputs=make_inputs(case, seed),
                       grad_out=make_grad_output(case, seed) if case.mode == "fwd+bwd" else None,
                       observed=observed, golden=golden, baseline=baseline)


def _difference(tensors, kept) -> str:
    """How this run\'s output compares with the kept one (bit-identical, or the largest gap)."""
    import torch

    if tensors is None:
        return f"no output here to compare (the run\'s was {kept.label})"
    out, theirs = tensors[0].out.double(), kept.observed.out.double()
    if torch.equal(tensors[0].out, kept.observed.out):
        return "the output is bit-identical to the run\'s"
    gap = (out - theirs).abs().nan_to_num(float("inf"))
    where = tuple(int(i) for i in torch.unravel_index(gap.argmax(), gap.shape))
    return f"the output differs from the run\'s: max |diff| {gap.max().item():.3g} at {where}"


def _run(backend, case, seed: int, runs: int, workdir: Path) -> tuple[str, str, dict]:
    import torch

    from conformance.child import run_case
    from conformance.observation import Observation, label_of
    from conformance.reference_cache import compute_reference
    from reference.golden import Reference
    from reference.verdict import judge

    events: list[dict] = []

    def emit(**event) -> None:
        events.append(event)
        if event.get("event") == "phase":
            print(f"phase     {event[\'phase\']}", file=sys.stderr, flush=True)

    request = {"case": case.to_json(), "seed": seed, "runs": runs, "cold": True,
               "output_path": str(workdir / "output.pt"),
               "cache_dir": str(workdir / "compile-cache")}
    run_case(backend, request, emit)
    final = events[-1]
    seconds = ", ".join(f"{phase} {final[f\'{phase}_seconds\']:.3g} s"
                        for phase in ("setup", "compile", "run")
                        if final.get(f"{phase}_seconds") is not None)
    print(f"seconds   {seconds}")
    if final["event"] == "error":
        observation = Observation(final["kind"], final["phase"], final["message"])
        return label_of(observation).value, final["message"], {}, None
    golden, baseline = compute_reference(case, seed, "cpu")
    saved = torch.load(final["output_path"], weights_only=True)
    observed = Reference(saved["out"], saved.get("lse"), saved.get("grads"))
    verdict = judge(case, golden, baseline, observed)
    return (("PASS" if verdict.passed else "MISMATCH"), verdict.summary, verdict.metrics,
            (observed, golden, baseline))


def _finish(label: str, message: str) -> int:
    if message:
        print(f"message   {message}")
    print(f"label: {label}")
    return 0 if label == "PASS" else 1
''',
    'reference': '''"""The oracle: float64 golden (golden.py) and the verdict (verdict.py). No backends, no pytest.
``load_case_outputs`` reads a case\'s kept tensors (outputs.py)."""
from reference.outputs import CaseOutputs, load_case_outputs, save_case_outputs  # noqa: F401
''',
    'reference.golden': '''"""The float64 golden output, and the dtype baseline, of a case, without flex_attention.

FlexAttention\'s semantics, written out: scores = q k^T * scale (scale = 1/sqrt(D));
score_mod applied to the scaled scores; masked positions set to -inf; softmax over keys;
out = P v. A query row whose keys are all masked gives out = 0 and lse = -inf. With GQA,
query head h reads key/value head h // (Hq / Hkv); with Bkv = 1, every batch reads kv batch 0.

Memory stays bounded: one batch at a time, query rows in chunks, and key columns that the
mask excludes for a whole chunk are skipped (exactly: they would contribute exp(-inf) = 0).
Mods are evaluated as flex_attention defines them, point by point (cases/pointwise.py): the
score_mod and mask_mod of each chunk run under flex_attention\'s four nested torch.vmap over the
chunk\'s b, h, q_idx and kv_idx, never once on broadcast index grids.

The same kernel run as fused attention kernels run it is the baseline, what a careful
implementation in the case dtype achieves: inputs in the dtype, float32 scores, softmax and
accumulation, the probabilities rounded to the dtype for the P.V product (as FlashAttention,
flex_attention\'s Triton template and its eager path all do), and the output rounded to the dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from cases.inputs import Inputs, torch_dtype
from cases.model import Case
from cases.pointwise import check_mods, evaluate_mask, evaluate_score
from cases.variants import Mods, build_mods

#: Version of the reference computation; part of every reference cache key.
#: 2: mods evaluated point by point (torch.vmap), no longer on broadcast index grids.
REFERENCE_VERSION = 2

#: Upper bound for one chunk\'s score matrix [Hq, rows, kept keys], in elements.
_CHUNK_SCORE_ELEMENTS = 8 * 1024 * 1024


@dataclass(frozen=True)
class Reference:
    """Output [B, Hq, Sq, D], log-sum-exp [B, Hq, Sq] (natural log) and, for backward cases,
    gradients ``{"dq", "dk", "dv"}`` of one computation (golden, baseline or observed)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] | None = None


def reference_pair(case: Case, inputs: Inputs,
                   grad_out: torch.Tensor | None = None) -> tuple[Reference, Reference]:
    """The golden (float64) and the baseline (case dtype) of everything ``case.mode`` checks:
    the output always, the log-sum-exp for ``fwd+lse``, dQ/dK/dV for ``fwd+bwd`` (then
    ``grad_out`` is dO, see cases.inputs.make_grad_output)."""
    mods = build_mods(case.variant, case.shape, inputs.q.device)
    dtype = torch_dtype(case.dtype)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    base_out, base_lse = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=dtype)
    golden = Reference(out, lse)
    baseline = Reference(base_out.to(dtype), base_lse)
    if case.mode == "fwd+bwd":
        if grad_out is None:
            raise ValueError(f"{case.id}: a backward case needs grad_out (dO)")
        golden = replace(golden, grads=chunked_gradients(
            case, inputs, mods, grad_out, torch.float64))
        base_grads = chunked_gradients(case, inputs, mods, grad_out, torch.float32, dtype)
        baseline = replace(baseline, grads={k: g.to(dtype) for k, g in base_grads.items()})
    return golden, baseline


def golden_attention(case: Case, inputs: Inputs, mods: Mods | None = None) -> Reference:
    """The float64 golden of ``case`` on ``inputs`` (computed on the inputs\' device)."""
    mods = mods or build_mods(case.variant, case.shape, inputs.q.device)
    out, lse = chunked_attention(case, inputs, mods, torch.float64)
    return Reference(out, lse)


def baseline_attention(case: Case, inputs: Inputs, mods: Mods | None = None) -> torch.Tensor:
    """What a careful implementation in the case dtype gets: float32 math, dtype output."""
    mods = mods or build_mods(case.variant, case.shape, inputs.q.device)
    dtype = torch_dtype(case.dtype)
    out, _ = chunked_attention(case, inputs, mods, torch.float32, probs_dtype=dtype)
    return out.to(dtype)


def chunked_attention(
    case: Case, inputs: Inputs, mods: Mods, compute_dtype: torch.dtype,
    probs_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``case`` computed in ``compute_dtype``; returns (out, lse) in it.

    With ``probs_dtype``, the unnormalized probabilities exp(s - rowmax) are rounded to it
    before the product with V (the normalizer is summed before rounding).
    """
    s = case.shape
    out = torch.empty(s.B, s.Hq, s.Sq, s.D, dtype=compute_dtype, device=inputs.q.device)
    lse = torch.empty(s.B, s.Hq, s.Sq, dtype=compute_dtype, device=inputs.q.device)
    for chunk in _chunks(case, inputs, mods, compute_dtype):
        out[chunk.b, :, chunk.rows], lse[chunk.b, :, chunk.rows] = _attend(chunk, mods, probs_dtype)
    return out, lse


def chunked_gradients(
    case: Case, inputs: Inputs, mods: Mods, grad_out: torch.Tensor,
    compute_dtype: torch.dtype, probs_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """dQ, dK, dV of sum(out * grad_out), chunk by chunk (autograd through one query chunk
    at a time, so memory stays bounded like the forward). Shapes follow q, k, v."""
    s = case.shape
    device = inputs.q.device
    dq = torch.zeros(s.B, s.Hq, s.Sq, s.D, dtype=compute_dtype, device=device)
    dk = torch.zeros(s.Bkv, s.Hkv, s.Skv, s.D, dtype=compute_dtype, device=device)
    dv = torch.zeros_like(dk)
    for chunk in _chunks(case, inputs, mods, compute_dtype, requires_grad=True):
        with torch.enable_grad():
            out, _ = _attend(chunk, mods, probs_dtype)
            if not out.requires_grad:  # every row of the chunk is fully masked
                continue
            g_q, g_k, g_v = torch.autograd.grad(
                out, (chunk.q, chunk.k, chunk.v),
                grad_out[chunk.b, :, chunk.rows].to(compute_dtype), allow_unused=True)
        dq[chunk.b, :, chunk.rows] = g_q
        if g_k is not None:
            dk[chunk.kv_batch] += g_k
            dv[chunk.kv_batch] += g_v
    return {"dq": dq, "dk": dk, "dv": dv}


@dataclass(frozen=True)
class _Chunk:
    """One query chunk of one batch: its rows, operands in the compute dtype, mask, the index
    vectors the mods are evaluated on, and the key columns any of its rows may see."""

    b: int
    kv_batch: int
    rows: slice
    q: torch.Tensor  # [Hq, n, D]
    k: torch.Tensor  # [Hkv, Skv, D] of kv_batch (shared by the batch\'s chunks)
    v: torch.Tensor
    mask: torch.Tensor | None  # broadcastable to [Hq, n, Skv]
    keys: slice | torch.Tensor
    batch: torch.Tensor  # [1]: b
    heads: torch.Tensor  # [Hq]
    q_idx: torch.Tensor  # [n]
    scale: float
    group: int  # query heads per key/value head


def _chunks(case: Case, inputs: Inputs, mods: Mods, compute_dtype: torch.dtype,
            requires_grad: bool = False):
    """The query chunks of ``case``, batch by batch (operands are leaves that require grad
    when asked, so autograd can run through one chunk at a time)."""
    s = case.shape
    device = inputs.q.device
    check_mods(mods.mask_mod, mods.score_mod, case.variant.token, device)
    rows = max(1, min(s.Sq, _CHUNK_SCORE_ELEMENTS // (s.Hq * s.Skv)))
    heads = torch.arange(s.Hq, device=device)
    all_keys = torch.arange(s.Skv, device=device)
    for b in range(s.B):
        kv_batch = b if s.Bkv == s.B else 0
        k = inputs.k[kv_batch].to(compute_dtype).requires_grad_(requires_grad)
        v = inputs.v[kv_batch].to(compute_dtype).requires_grad_(requires_grad)
        batch = torch.tensor([b], device=device)
        for q0 in range(0, s.Sq, rows):
            q_idx = torch.arange(q0, min(q0 + rows, s.Sq), device=device)
            span = slice(q0, q0 + len(q_idx))
            q = inputs.q[b, :, span].to(compute_dtype).requires_grad_(requires_grad)
            mask = _evaluate_mask(mods, batch, heads, q_idx, all_keys)
            yield _Chunk(b, kv_batch, span, q, k, v, mask, _kept_keys(mask, s.Skv), batch,
                         heads, q_idx, 1.0 / math.sqrt(s.D), s.Hq // s.Hkv)


def _evaluate_mask(mods: Mods, b, h, q_idx, kv_idx) -> torch.Tensor | None:
    """The mask of one chunk, broadcastable to [Hq, n, Skv]; None when nothing is masked.

    A head or row dimension the mask does not depend on comes back from vmap expanded (stride
    0): it is kept at size 1, a view, so the key-range scans below read each distinct row once.
    The key dimension keeps its length: it says which columns exist.
    """
    if mods.mask_mod is None:
        return None
    mask = evaluate_mask(mods.mask_mod, b, h, q_idx, kv_idx)[0]
    for dim in range(mask.dim() - 1):
        if mask.stride(dim) == 0:  # every entry along dim is the same one
            mask = mask.narrow(dim, 0, 1)
    return mask


def _kept_keys(mask: torch.Tensor | None, num_keys: int) -> slice | torch.Tensor:
    """The key columns that any row of the chunk may see: a slice when contiguous."""
    if mask is None:
        return slice(0, num_keys)
    visible = mask.reshape(-1, mask.shape[-1]).any(0)
    return _as_slice(visible.nonzero().flatten())


def _as_slice(cols: torch.Tensor) -> slice | torch.Tensor:
    if len(cols) == 0:
        return slice(0, 0)
    first, last = int(cols[0]), int(cols[-1])
    if last - first + 1 == len(cols):
        return slice(first, last + 1)
    return cols


def _apply_mask(scores: torch.Tensor, mask: torch.Tensor) -> None:
    """Set masked scores to -inf in place, touching only the columns some row masks."""
    seen_by_all = mask.reshape(-1, mask.shape[-1]).all(0)
    cols = (~seen_by_all).nonzero().flatten()
    if len(cols) == 0:
        return
    span = slice(int(cols[0]), int(cols[-1]) + 1)
    scores[..., span].masked_fill_(~mask[..., span], -math.inf)


def _attend(chunk: _Chunk, mods: Mods, probs_dtype: torch.dtype | None):
    """Softmax attention of one query chunk over its kept key columns.

    Heads that share a key/value head are stacked along the rows, so both products are plain
    batched matmuls over the key/value heads with no copies.
    """
    q, k, v, keys, mask, group = chunk.q, chunk.k, chunk.v, chunk.keys, chunk.mask, chunk.group
    hq, n, d = q.shape
    hkv = hq // group
    k_sel, v_sel = k[:, keys], v[:, keys]  # [Hkv, m, D]
    m = k_sel.shape[1]
    if m == 0:  # every row of the chunk is fully masked
        zeros = torch.zeros(hq, n, v.shape[-1], dtype=q.dtype, device=q.device)
        return zeros, torch.full((hq, n), -math.inf, dtype=q.dtype, device=q.device)
    scores = torch.bmm(q.reshape(hkv, group * n, d), k_sel.transpose(1, 2)).view(hq, n, m)
    scores.mul_(chunk.scale)
    if mods.score_mod is not None:
        kv_idx = torch.arange(k.shape[1], device=q.device)[keys]
        modded = evaluate_score(mods.score_mod, scores.unsqueeze(0), chunk.batch, chunk.heads,
                                chunk.q_idx, kv_idx)[0]
        scores = modded.to(q.dtype).contiguous()
    if mask is not None:
        _apply_mask(scores, mask[..., keys])
    # The shift cancels in the softmax, so it is a constant for autograd (exact gradients).
    row_max = scores.detach().amax(-1, keepdim=True)
    row_max = torch.nan_to_num(row_max, neginf=0.0)  # fully masked rows: subtract nothing
    probs = scores.sub_(row_max).exp_()
    denom = probs.sum(-1, keepdim=True)  # >= 1 (the max term is exp(0)) unless fully masked
    if probs_dtype is not None:
        probs = probs.to(probs_dtype).to(q.dtype)
    out = torch.bmm(probs.view(hkv, group * n, m), v_sel).view(hq, n, -1)
    out = out / denom.clamp_min(1.0)  # a fully masked row has out = 0 and stays 0
    lse = (row_max + torch.log(denom)).squeeze(-1)  # log(0) = -inf for fully masked rows
    return out, lse
''',
    'reference.outputs': '''"""One case\'s tensors in one file: what went in, what the backend gave back, and what it should
have given. Written by the executor (``--keep-outputs``, conformance/kept_outputs.py) and by a
reproduction script (``python repro.py --save-outputs FILE``); read by ``load_case_outputs``
(a notebook, ``python repro.py --compare FILE``).

The file is ``torch.save`` of a dict of plain values and CPU tensors (so
``torch.load(path, weights_only=True)`` reads it too):

    format      "flexattention-conformance/case-outputs"    version  1
    case        the case spec (cases.model.Case.to_json)     seed     the run\'s seed
    label       the record\'s label ("MISMATCH", ...)         message  the record\'s message
    inputs      {"q", "k", "v"} and "grad_out" (dO) for fwd+bwd cases: what the backend got
    observed    {"out", "lse", "grads": {"dq", "dk", "dv"}}: what it returned (on the CPU)
    golden      the same keys: the float64 golden            baseline the same: the dtype baseline

``lse`` and ``grads`` are None when the case\'s mode has none.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from cases.inputs import Inputs
from cases.model import Case
from reference.golden import Reference

FORMAT = "flexattention-conformance/case-outputs"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CaseOutputs:
    """The tensors of one case of one run (see the module docstring for the file)."""

    case: Case
    seed: int
    label: str
    message: str
    inputs: Inputs
    grad_out: torch.Tensor | None  # dO of a backward case
    observed: Reference
    golden: Reference
    baseline: Reference

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held (about the file\'s size)."""
        return sum(t.numel() * t.element_size() for t in _tensors(self))


def save_case_outputs(outputs: CaseOutputs, path: str | Path) -> Path:
    """Write ``outputs`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs = {"q": outputs.inputs.q, "k": outputs.inputs.k, "v": outputs.inputs.v}
    if outputs.grad_out is not None:
        inputs["grad_out"] = outputs.grad_out
    data = {"format": FORMAT, "version": FORMAT_VERSION, "case": outputs.case.to_json(),
            "seed": outputs.seed, "label": outputs.label, "message": outputs.message,
            "inputs": {k: _cpu(t) for k, t in inputs.items()},
            "observed": reference_to_dict(outputs.observed),
            "golden": reference_to_dict(outputs.golden),
            "baseline": reference_to_dict(outputs.baseline)}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    torch.save(data, tmp)
    tmp.replace(path)
    return path


def load_case_outputs(path: str | Path) -> CaseOutputs:
    """The CaseOutputs saved in ``path``; ValueError (one line) for a file of another kind."""
    try:
        data = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; kept outputs are in REPORT_DIR/outputs/ "
                         "(pytest --keep-outputs failed|all)") from None
    except Exception as exc:  # noqa: BLE001 - torn or foreign file: say which
        raise ValueError(f"{path}: not a case outputs file ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else \'\'})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a case outputs file (no format {FORMAT!r})")
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: case outputs version {data.get(\'version\')!r}; this suite "
                         f"reads version {FORMAT_VERSION}")
    inputs = data["inputs"]
    return CaseOutputs(case=Case.from_json(data["case"]), seed=int(data["seed"]),
                       label=str(data["label"]), message=str(data["message"]),
                       inputs=Inputs(inputs["q"], inputs["k"], inputs["v"]),
                       grad_out=inputs.get("grad_out"),
                       observed=reference_from_dict(data["observed"]),
                       golden=reference_from_dict(data["golden"]),
                       baseline=reference_from_dict(data["baseline"]))


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def reference_to_dict(ref: Reference) -> dict:
    """A Reference as plain values (what torch.save(weights_only) keeps), on the CPU."""
    grads = {k: _cpu(g) for k, g in ref.grads.items()} if ref.grads else None
    return {"out": _cpu(ref.out), "lse": None if ref.lse is None else _cpu(ref.lse),
            "grads": grads}


def reference_from_dict(data: dict) -> Reference:
    """The Reference of ``reference_to_dict``."""
    return Reference(data["out"], data.get("lse"), data.get("grads"))


def _tensors(outputs: CaseOutputs) -> list[torch.Tensor]:
    found = [outputs.inputs.q, outputs.inputs.k, outputs.inputs.v]
    if outputs.grad_out is not None:
        found.append(outputs.grad_out)
    for ref in (outputs.observed, outputs.golden, outputs.baseline):
        found.append(ref.out)
        if ref.lse is not None:
            found.append(ref.lse)
        found += list((ref.grads or {}).values())
    return found
''',
    'reference.verdict': '''"""The verdict: does an observed output agree with the float64 golden?

Errors are judged relative to the baseline (reference/golden.py: what a careful
implementation in the case dtype achieves on the same inputs), at three scales:

1. global, PyTorch\'s rule: mean|O - G| <= (1 + fudge) * mean|R - G| + atol;
2. per head (b, h): the same rule over the head\'s elements, so one wrong head cannot hide in
   the mean over all heads;
3. per query row (b, h, q): RMS over the head dim of (O - G) <= row_factor * RMS of (R - G)
   + u * RMS(G row), u the dtype\'s unit roundoff, so one wrong row, a dropped key block or an
   off-by-one at a mask boundary cannot hide in a mean.

Any NaN or Inf where the golden is finite fails on its own. The same rules judge dQ, dK and
dV of backward cases (rows are query rows of dQ, key rows of dK and dV). The log-sum-exp of
``fwd+lse`` cases is judged per row: |lse - G| <= lse_factor * |baseline lse - G| +
lse_rtol * max(1, |G|), and -inf exactly where the golden is -inf (fully masked rows).
docs/oracle.md gives the reasons for each threshold and the margins measured on both sides.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cases.model import Case
from reference.golden import Reference


@dataclass(frozen=True)
class Tolerance:
    """Thresholds of the three rules for one dtype."""

    fudge: float  # global and per-head: error <= (1 + fudge) * baseline error + atol
    atol: float
    row_factor: float  # per row: rms <= row_factor * baseline rms + unit_roundoff * rms(G)
    unit_roundoff: float


#: PyTorch\'s fudge factors (1.1 for 16-bit types, 10 for float32); row factors: docs/oracle.md.
TOLERANCES: dict[str, Tolerance] = {
    "bf16": Tolerance(fudge=1.1, atol=1e-7, row_factor=4.0, unit_roundoff=2.0 ** -8),
    "fp16": Tolerance(fudge=1.1, atol=1e-7, row_factor=4.0, unit_roundoff=2.0 ** -11),
    "fp32": Tolerance(fudge=10.0, atol=1e-9, row_factor=20.0, unit_roundoff=2.0 ** -24),
}


@dataclass(frozen=True)
class Verdict:
    passed: bool
    summary: str  # one line: what failed and where ("" when passed)
    metrics: dict[str, Any] = field(default_factory=dict)


#: log-sum-exp: per-row factor over the baseline\'s error, and a floor of 128 float32 ulps.
LSE_FACTOR = 4.0
LSE_RTOL = 128 * 2.0 ** -24


def judge(case: Case, golden: Reference, baseline: torch.Tensor | Reference,
          observed: Any) -> Verdict:
    """Compare what the backend computed for ``case`` with the golden, relative to the baseline.

    ``observed`` and ``baseline`` are the output tensor, or a Reference with the log-sum-exp
    (``fwd+lse``) or the gradients (``fwd+bwd``) as the case\'s mode requires.
    """
    base = baseline if isinstance(baseline, Reference) else Reference(baseline)
    obs = observed if isinstance(observed, Reference) else Reference(observed)
    tol = TOLERANCES[case.dtype]
    verdict = _judge_tensor(golden.out, base.out, obs.out, tol, "output")
    parts: list[tuple[str, Verdict]] = []
    if case.mode == "fwd+lse":
        parts.append(("lse", _judge_lse(golden.lse, base.lse, obs.lse)))
    if case.mode == "fwd+bwd":
        for name in ("dq", "dk", "dv"):
            got = (obs.grads or {}).get(name)
            parts.append((name, _judge_tensor(golden.grads[name], base.grads[name], got, tol, name)))
    return _combine(verdict, parts)


def _combine(main: Verdict, parts: list[tuple[str, Verdict]]) -> Verdict:
    if not parts:
        return main
    metrics = dict(main.metrics)
    failed = [f"output:{rule}" for rule in main.metrics.get("failed_rules", [])]
    summaries = [f"output: {main.summary}"] if main.summary else []
    for name, part in parts:
        metrics[name] = part.metrics
        failed += [f"{name}:{rule}" for rule in part.metrics.get("failed_rules", [])]
        if part.summary:
            summaries.append(f"{name}: {part.summary}")
    metrics["failed_rules"] = failed
    return Verdict(not failed, "; ".join(summaries), metrics)


def _malformed(what: str, golden: torch.Tensor, observed: Any,
               dtype: torch.dtype | None = None) -> Verdict | None:
    """A MISMATCH when ``observed`` is missing, not a tensor, of the wrong shape, or (given
    ``dtype``) not of flex_attention\'s output dtype, the query\'s."""
    if observed is None:
        return Verdict(False, f"no {what} was returned", {"failed_rules": ["missing"]})
    if not isinstance(observed, torch.Tensor):
        return Verdict(False, f"{what} is a {type(observed).__name__}, not a tensor",
                       {"failed_rules": ["type"]})
    if tuple(observed.shape) != tuple(golden.shape):
        return Verdict(False, f"{what} shape {tuple(observed.shape)}, expected "
                       f"{tuple(golden.shape)}", {"failed_rules": ["shape"]})
    if dtype is not None and observed.dtype != dtype:
        return Verdict(False, f"{what} dtype {observed.dtype}, expected {dtype} (the inputs\')",
                       {"failed_rules": ["dtype"]})
    return None


def _judge_tensor(golden: torch.Tensor, baseline: torch.Tensor, observed: Any,
                  tol: Tolerance, what: str) -> Verdict:
    malformed = _malformed(what, golden, observed, baseline.dtype)
    if malformed:
        return malformed
    stats = _ErrorStats.collect(golden, baseline, observed.detach().cpu())
    return _decide(stats, tol)


def _judge_lse(golden: torch.Tensor, baseline: torch.Tensor, observed: Any) -> Verdict:
    malformed = _malformed("log-sum-exp", golden, observed)
    if malformed:
        return malformed
    obs = observed.detach().cpu().to(torch.float64)
    masked = torch.isneginf(golden)
    wrong_masked = int((masked & ~torch.isneginf(obs)).sum())
    nonfinite = int((~masked & ~torch.isfinite(obs)).sum())
    live = ~masked & torch.isfinite(obs)
    err = torch.where(live, (obs - golden).abs(), 0.0)
    base_err = torch.where(live, (baseline.to(torch.float64) - golden).abs(), 0.0)
    limit = LSE_FACTOR * base_err + LSE_RTOL * golden.abs().clamp_min(1.0).where(live, 1.0)
    margins = err / limit
    worst = _argmax(margins)
    failing = int((~(margins <= 1)).sum())  # a NaN margin fails too
    metrics: dict[str, Any] = {
        "max_abs_err": float(err.max()) if err.numel() else 0.0,
        "worst_row_margin": float(margins[worst]) if margins.numel() else 0.0,
        "worst_place": dict(zip("bhq", worst)),
        "failing_rows": failing,
        "fully_masked_rows": int(masked.sum()),
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
    if failing:
        failed.append("row")
        b, h, q = worst
        summary.append(f"{failing} row(s) off, worst b={b} h={h} q={q}: error "
                       f"{float(err[worst]):.3g} vs limit {float(limit[worst]):.3g}")
    metrics["failed_rules"] = failed
    return Verdict(not failed, "; ".join(summary), metrics)


@dataclass
class _ErrorStats:
    """Per-row and per-head error sums of observed (obs) and baseline (base) against golden."""

    row_rms_obs: torch.Tensor  # [B, H, S]
    row_rms_base: torch.Tensor
    row_rms_golden: torch.Tensor
    head_sum_obs: torch.Tensor  # [B, H]
    head_sum_base: torch.Tensor
    elements_per_head: int
    max_abs_err: float
    max_place: tuple[int, int, int, int]
    nonfinite: int
    nan_count: int
    inf_count: int
    first_nonfinite: tuple[int, int, int, int] | None

    @classmethod
    def collect(cls, golden: torch.Tensor, baseline: torch.Tensor,
                observed: torch.Tensor) -> "_ErrorStats":
        B, H, S, D = golden.shape
        rows_obs, rows_base, rows_gold, heads_obs, heads_base = [], [], [], [], []
        max_err, max_place = -1.0, (0, 0, 0, 0)
        nan_count = inf_count = 0
        first_bad = None
        for b in range(B):  # one batch at a time bounds the float64 temporaries
            g = golden[b]
            obs = observed[b].to(torch.float64)
            bad = ~torch.isfinite(obs) & torch.isfinite(g)
            if bad.any():
                nan_count += int(torch.isnan(obs).sum())
                inf_count += int(torch.isinf(obs).sum())
                if first_bad is None:
                    first_bad = (b, *map(int, bad.nonzero()[0].tolist()))
            err_obs = torch.where(torch.isfinite(obs), (obs - g).abs(), torch.inf)
            err_base = (baseline[b].to(torch.float64) - g).abs()
            rows_obs.append(err_obs.pow(2).mean(-1).sqrt())
            rows_base.append(err_base.pow(2).mean(-1).sqrt())
            rows_gold.append(g.pow(2).mean(-1).sqrt())
            heads_obs.append(err_obs.sum((-1, -2)))
            heads_base.append(err_base.sum((-1, -2)))
            finite_err = torch.where(torch.isfinite(err_obs), err_obs, -1.0)
            flat = int(finite_err.argmax())
            if finite_err.flatten()[flat] > max_err:
                max_err = float(finite_err.flatten()[flat])
                max_place = (b, *torch.unravel_index(torch.tensor(flat), (H, S, D)))
        return cls(
            torch.stack(rows_obs), torch.stack(rows_base), torch.stack(rows_gold),
            torch.stack(heads_obs), torch.stack(heads_base), S * D,
            max(max_err, 0.0), tuple(int(x) for x in max_place),
            nan_count + inf_count, nan_count, inf_count, first_bad,
        )


def _decide(st: _ErrorStats, tol: Tolerance) -> Verdict:
    factor = 1.0 + tol.fudge
    n_heads = st.head_sum_obs.numel()
    mean_obs = float(st.head_sum_obs.sum()) / (n_heads * st.elements_per_head)
    mean_base = float(st.head_sum_base.sum()) / (n_heads * st.elements_per_head)
    global_margin = mean_obs / (factor * mean_base + tol.atol)

    head_obs = st.head_sum_obs / st.elements_per_head
    head_base = st.head_sum_base / st.elements_per_head
    head_margins = head_obs / (factor * head_base + tol.atol)
    worst_head = _argmax(head_margins)

    row_limit = tol.row_factor * st.row_rms_base + tol.unit_roundoff * st.row_rms_golden
    row_limit = row_limit.clamp_min(tol.atol)
    row_margins = st.row_rms_obs / row_limit
    worst_row = _argmax(row_margins)
    failing_rows = int((~(row_margins <= 1)).sum())  # a NaN margin fails too

    metrics: dict[str, Any] = {
        "max_abs_err": st.max_abs_err,
        "mean_abs_err": mean_obs,
        "baseline_mean_abs_err": mean_base,
        "error_ratio": mean_obs / mean_base if mean_base > 0 else None,
        "global_margin": global_margin,
        "worst_head_ratio": float(head_obs[worst_head] / head_base[worst_head])
        if head_base[worst_head] > 0 else None,
        "worst_head_margin": float(head_margins[worst_head]),
        "worst_head": {"b": worst_head[0], "h": worst_head[1]},
        "worst_row_margin": float(row_margins[worst_row]),
        "worst_place": {"b": worst_row[0], "h": worst_row[1], "q": worst_row[2]},
        "failing_rows": failing_rows,
        "max_err_place": dict(zip("bhqd", st.max_place)),
        "nan_count": st.nan_count,
        "inf_count": st.inf_count,
    }
    failed, summary = [], []
    if st.nonfinite:
        failed.append("nonfinite")
        b, h, q, d = st.first_nonfinite
        summary.append(f"{st.nan_count} NaN and {st.inf_count} Inf where the golden is finite"
                       f" (first at b={b} h={h} q={q} d={d})")
    if not global_margin <= 1:
        failed.append("global")
        summary.append(f"mean error {mean_obs:.3g} is {mean_obs / max(mean_base, 1e-300):.2f}x "
                       f"the baseline\'s {mean_base:.3g} (limit {factor:.2f}x)")
    if not head_margins[worst_head] <= 1:
        failed.append("head")
        b, h = worst_head
        summary.append(f"head b={b} h={h}: mean error {float(head_obs[b, h]):.3g} is "
                       f"{float(head_margins[b, h]) * factor:.2f}x its baseline\'s (limit {factor:.2f}x)")
    if failing_rows:
        failed.append("row")
        b, h, q = worst_row
        summary.append(f"{failing_rows} query row(s) off, worst b={b} h={h} q={q}: rms error "
                       f"{float(st.row_rms_obs[b, h, q]):.3g} vs limit {float(row_limit[b, h, q]):.3g}")
    metrics["failed_rules"] = failed
    return Verdict(not failed, "; ".join(summary), metrics)


def _argmax(values: torch.Tensor) -> tuple[int, ...]:
    finite = torch.nan_to_num(values, nan=torch.inf)
    return tuple(int(i) for i in torch.unravel_index(finite.argmax(), values.shape))
''',
    'reports': '''"""Reports and the release gate: read results files, never torch."""
''',
    'reports.results': '''"""The results file: labels, one record per case, and a run (versioned JSON, no torch).

This module is the contract between the executor (which writes records) and the report and
gate (which read them). ``load_results`` validates against ``results.schema.json``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

SCHEMA_NAME = "flexattention-conformance/results"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("results.schema.json")


class Label(str, Enum):
    """The closed set of outcomes of a case (docs/labels.md says what each one means)."""

    PASS = "PASS"
    MISMATCH = "MISMATCH"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    RUN_TIMEOUT = "RUN_TIMEOUT"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    CRASH = "CRASH"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNSUPPORTED = "UNSUPPORTED"
    HARNESS_ERROR = "HARNESS_ERROR"
    #: only in a compile-only pass (``--phase compile``): the first call finished; no verdict
    COMPILED = "COMPILED"

    @property
    def acceptable(self) -> bool:
        """Whether a conformance run may contain this label and still conform (dEQP rule)."""
        return self in (Label.PASS, Label.UNSUPPORTED)


@dataclass(frozen=True)
class Record:
    """The outcome of one case in one run.

    Times are seconds: ``compile_seconds`` is the first call (trace, compile, one execution),
    ``run_seconds`` the median of the timed calls after it. ``cache_hit`` is None when the
    backend cannot tell. ``metrics`` are the verdict\'s numbers (reference/verdict.py).
    ``compile_breakdown`` splits the compile phase by stage (stage name to seconds, the
    remainder as ``other``) when the backend\'s compiler reports its stages. ``artifacts`` is
    the directory, relative to the report directory, holding the case\'s compile artefacts
    (kept for failed cases, or for all with ``--keep-artifacts``).
    """

    case_id: str
    label: Label
    case: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    setup_seconds: float | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None
    cache_hit: bool | None = None
    metrics: dict[str, Any] | None = None
    compile_breakdown: dict[str, float] | None = None
    artifacts: str | None = None
    worker: str = ""
    started_at: str = ""
    finished_at: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["label"] = self.label.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Record":
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["label"] = Label(data["label"])
        return cls(**kwargs)


@dataclass(frozen=True)
class RunResults:
    """A whole run: environment, options and every record (in case order)."""

    environment: dict[str, Any]
    options: dict[str, Any]
    records: tuple[Record, ...]
    suite_version: str
    started_at: str = ""
    finished_at: str = ""
    complete: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "suite_version": self.suite_version,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "complete": self.complete,
            "environment": self.environment,
            "options": self.options,
            "records": [r.to_json() for r in self.records],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunResults":
        return cls(
            environment=data["environment"],
            options=data["options"],
            records=tuple(Record.from_json(r) for r in data["records"]),
            suite_version=data["suite_version"],
            started_at=data.get("started_at", ""),
            finished_at=data.get("finished_at", ""),
            complete=data.get("complete", True),
        )

    def by_id(self) -> dict[str, Record]:
        return {r.case_id: r for r in self.records}


class ResultsError(ValueError):
    """A results file that cannot be used; the message names the file and the problem."""


def validate_results_json(data: Any, source: str = "results") -> None:
    """Raise ResultsError if ``data`` does not follow results.schema.json."""
    import jsonschema  # a dependency of the project; imported here to keep import time low

    schema = json.loads(SCHEMA_PATH.read_text())
    if isinstance(data, dict) and data.get("schema_version") not in (None, SCHEMA_VERSION):
        raise ResultsError(
            f"{source}: schema_version {data.get(\'schema_version\')!r} is not supported "
            f"(this suite reads version {SCHEMA_VERSION}); re-run or re-render with a matching suite"
        )
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise ResultsError(f"{source}: not a valid results file at {where}: {first.message}")


def load_results(path: str | Path) -> RunResults:
    """Read and validate a results.json."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file; pass the results.json of a run") from None
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}: not JSON ({exc}); pass the results.json of a run") from None
    validate_results_json(data, str(path))
    return RunResults.from_json(data)


def write_results(results: RunResults, path: str | Path) -> None:
    """Write atomically (temporary file + rename) so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results.to_json(), indent=1, sort_keys=False) + "\\n")
    tmp.replace(path)
''',
}

if __name__ == '__main__':
    sys.exit(main())
