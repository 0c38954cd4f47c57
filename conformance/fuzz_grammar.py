"""The fuzzing grammar: hypothesis strategies that draw cases of the ``composed`` variant.

Everything drawn is data: a ``Case`` whose variant is ``cases.composed.composed(mask, score)``,
so a drawn case round-trips through its case spec (``Case.to_json``) and rebuilds its mods in
any process. The grammar (see cases/composed.py for what each atom computes):

    mask   := none | atom | not(mask) | and(mask, mask) | or(mask, mask)      (<= 4 atoms)
    atom   := causal{o} | win{w} | prefix{p} | doc{n} | block{t} | dil{d}
    score  := a sequence of distinct scale{f} | alibi{m} | cap{c} | bias{c}  (<= 3)
    shape  := B in {1, 2}, Hkv in {1, 2}, Hq = Hkv * {1, 2, 4} (GQA), Sq and Skv from
              ``LENGTHS`` (odd lengths, one block +- 1), D from ``HEAD_DIMS``
    case   := shape, then a composed variant or a case module's variant for that shape
              (``fuzz_variants(shape)``, docs/cases.md), dtype, mode, input scale

Each choice lists its simplest value first: hypothesis shrinks towards the first element, so a
failure shrinks to no mask, no score mod, one batch, one head, short and equal lengths.
"""
from __future__ import annotations

from typing import Callable, Sequence

from hypothesis import reject
from hypothesis import strategies as st

from cases.composed import MASK_ATOMS, SCORE_ATOMS, And, Atom, Not, Or, composed
from cases.model import DTYPES, Case, Shape, Variant

#: Values of each atom, simplest first. Lengths are chosen against ``LENGTHS``.
MASK_VALUES: dict[str, tuple[int, ...]] = {
    "causal": (0, 1, 9), "win": (1, 4, 16, 37), "prefix": (0, 3, 24, 100),
    "doc": (1, 7, 32, 64), "block": (1, 5, 16, 128), "dil": (2, 3),
}
SCORE_VALUES: dict[str, tuple[float, ...]] = {
    "scale": (0.5, 2, 0.125), "alibi": (8, 2), "cap": (20, 5, 50), "bias": (1, 0.5, 3),
}
LENGTHS = (16, 1, 7, 31, 64, 67, 100, 127, 128, 129, 200)
HEAD_DIMS = (16, 8, 24, 32, 40, 64, 80)
BATCHES = (1, 2)
KV_HEADS = (1, 2)
GQA_GROUPS = (1, 2, 4)
INPUT_SCALES = (1, 4)
MAX_MASK_ATOMS = 4
MAX_SCORE_ATOMS = 3


def mask_atoms() -> st.SearchStrategy[Atom]:
    return st.one_of([st.builds(Atom, st.just(name), st.sampled_from(MASK_VALUES[name]))
                      for name in MASK_ATOMS])


def masks() -> st.SearchStrategy:
    """A mask expression of at most ``MAX_MASK_ATOMS`` atoms, or None (no mask)."""
    expressions = st.recursive(
        mask_atoms(),
        lambda inner: st.one_of(inner.map(Not), st.builds(And, inner, inner),
                                st.builds(Or, inner, inner)),
        max_leaves=MAX_MASK_ATOMS)
    return st.none() | expressions


def score_chains() -> st.SearchStrategy[tuple[Atom, ...]]:
    """Distinct score atoms in a drawn order (order matters: cap then scale != scale then cap)."""
    names = st.lists(st.sampled_from(SCORE_ATOMS), unique=True, max_size=MAX_SCORE_ATOMS)
    return names.flatmap(lambda chosen: st.tuples(*[
        st.builds(Atom, st.just(name), st.sampled_from(SCORE_VALUES[name])) for name in chosen]))


@st.composite
def shapes(draw) -> Shape:
    kv_heads = draw(st.sampled_from(KV_HEADS))
    group = draw(st.sampled_from(GQA_GROUPS))
    sq = draw(st.sampled_from(LENGTHS))
    skv = draw(st.just(sq) | st.sampled_from(LENGTHS))
    return Shape(B=draw(st.sampled_from(BATCHES)), Hq=kv_heads * group, Hkv=kv_heads,
                 Sq=sq, Skv=skv, D=draw(st.sampled_from(HEAD_DIMS)))


#: A case module's hook (docs/cases.md): the variants the fuzzer may draw for a shape.
VariantSource = Callable[[Shape], Sequence[Variant]]


def cases(modes: tuple[str, ...] = ("fwd",), dtypes: tuple[str, ...] = DTYPES,
          sources: Sequence[VariantSource] = (),
          with_composed: bool = True) -> st.SearchStrategy[Case]:
    """Fuzzed cases in ``modes`` and ``dtypes`` (the first of each is where failures shrink
    to). The variant is a drawn ``composed`` one (unless ``with_composed`` is False) or one of
    the variants a source gives for the drawn shape (case modules' ``fuzz_variants``)."""
    composed_variants = [st.builds(composed, masks(), score_chains())] if with_composed else []

    @st.composite
    def drawn(draw) -> Case:
        shape = draw(shapes())
        choices = composed_variants + [st.sampled_from(found) for found in
                                       (list(source(shape)) for source in sources) if found]
        if not choices:  # no source has a variant for this shape: draw another one
            reject()
        variant = draw(st.one_of(choices))
        return Case(variant, shape, draw(st.sampled_from(dtypes)), draw(st.sampled_from(modes)),
                    draw(st.sampled_from(INPUT_SCALES)))

    return drawn()
