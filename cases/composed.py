"""The ``composed`` variant: masks built with and/or/not from small atoms, plus a chain of
score modifications. It is what the fuzzer draws (conformance/fuzz_grammar.py), and it is data
like every variant: the expression lives in the parameters, so a case spec round-trips through
``Case.to_json`` / ``Case.from_json`` and its id says what it computes.

Mask atoms (q = query index, k = key index; each takes one integer >= 0; a mask atom sees key
k from query q iff its condition holds; none depends on b or h, none implies causality):

    causal{o}   k <= q + o               (o = 0: plain causal, q + 1 keys)
    win{w}      |q - k| < w              (a symmetric band of 2w - 1 keys, w >= 1)
    prefix{p}   k < p                    (the first p keys, for every query)
    doc{n}      q // n == k // n         (documents of n tokens, n >= 1; not causal)
    block{t}    (q // t + k // t) even   (a checkerboard of t x t tiles, t >= 1)
    dil{d}      (q - k) % d == 0         (every d-th diagonal, both sides, d >= 1)

Score atoms, applied in order to the scaled score s (h = query head, H = query heads):

    scale{f}    s * f                                  (f > 0)
    alibi{m}    s + 2^(-m (h+1) / H) * (k - q)         (m > 0; m = 8 is ALiBi; slopes float32)
    cap{c}      c * tanh(s / c)                        (c > 0)
    bias{c}     s + c * T[h, (q - k) mod 16]           (T: fixed N(0, 1) float32 table [H, 16],
                                                        BIAS_TABLE_SEED; c * T in float32)

(mod is floor modulo, so (q - k) mod 16 is in 0..15 for k > q too.)

Encoding: the mask is written in prefix notation; each atom becomes one parameter whose key is
the connectives that precede it, dotted, then the atom's name, and whose value is the atom's
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
#: Seed of the fixed ``bias`` table (part of the variant's meaning: never change it).
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
                                 f"use {', '.join(CONNECTIVES)}")
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
    """The variant of an id's first part, e.g. ``composed-and.causal0-not.win64-cap20``."""
    name, *parts = token.split("-")
    if name != NAME:
        raise ValueError(f"{token!r} is not a {NAME} variant token")
    params = []
    for part in parts:
        m = re.fullmatch(r"([a-z._]*[a-z_])(\d+(?:\.\d+)?)", part)
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
                         f"{', '.join(MASK_ATOMS)}; score atoms: {', '.join(SCORE_ATOMS)}")
    value = atom.value
    if atom.name in MASK_ATOMS:
        floor = 1 if atom.name in _AT_LEAST_ONE else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < floor:
            raise ValueError(f"{where}: {atom.name} takes an integer >= {floor}, got {value!r}")
    elif not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0
              and re.fullmatch(r"\d+(\.\d+)?", _number(value))):
        raise ValueError(f"{where}: {atom.name} takes a positive number written plainly "
                         f"(like 0.5 or 20), got {value!r}")
    return atom


def _number(value: ParamValue) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
