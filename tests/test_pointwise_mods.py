"""Mods are functions of one point, as flex_attention defines them. Mods written in styles that
are correct point by point but not on broadcast grids (tests/pointwise_variants.py) mean their
rule under eager flex_attention in float64; the golden equals eager float64 flex_attention on
them and on every variant of the suite; the old broadcast evaluation got them wrong or raised;
what a mask depends on is read off the mask."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cases import variants as v
from cases.catalog import CORE_VARIANTS
from cases.composed import And, Atom, Not, Or, composed
from cases.custom import defining_module
from cases.inputs import Inputs, make_inputs
from cases.model import Case, Shape
from cases.pointwise import INDEX_NAMES, evaluate_mask, evaluate_score, mask_dependence
from cases.variants import Mods, build_mods, registered_variants
from conformance import compat
from reference.golden import golden_attention
from tests import pointwise_variants as pv
from tests.eager_flex import as_eager_runs_it

#: GQA with equal lengths; then key/value broadcast over the batch with Sq != Skv.
SHAPES = [Shape(2, 4, 2, 64, 64, 16), Shape(2, 4, 4, 40, 72, 8, Bkv=1)]


def eager_flex_float64(case: Case, inputs: Inputs):
    """Eager flex_attention on the inputs in float64, with a block mask of every batch and
    head (so nothing depends on our reading of the mask): (out, lse)."""
    s = case.shape
    mods = build_mods(case.variant, s)
    block_mask = None
    if mods.mask_mod is not None:
        block_mask = create_block_mask(mods.mask_mod, s.B, s.Hq, s.Sq, s.Skv, "cpu")
    q, k, vv = (t.double() for t in (inputs.q, inputs.k, inputs.v))
    k, vv = k.expand(s.B, -1, -1, -1), vv.expand(s.B, -1, -1, -1)
    return compat.attention(flex_attention, q, k, vv, as_eager_runs_it(mods.score_mod),
                            block_mask, enable_gqa=s.Hq != s.Hkv, return_lse=True)


# -- the rules, written point by point in plain Python from the docstrings ----------------------
def sees(name: str, t: dict, b: int, h: int, i: int, j: int) -> bool:
    if name == "tiles_per_batch":
        return bool(t["allowed"][b, i // pv.TILE, j // pv.TILE]) or i == j
    if name == "tiles_per_head":
        return bool(t["allowed"][h, i // pv.TILE, j // pv.TILE]) or i == j
    if name == "counted_documents":
        starts = t["starts"].tolist()
        return sum(x <= i for x in starts) == sum(x <= j for x in starts) and j <= i
    if name == "per_head_prefix":
        return j < int(t["parts"][h].sum()) or j <= i
    if name == "symmetric_pairs":
        return bool(t["allowed"][min(i, j), max(i, j)]) or j <= i
    return j <= i  # the score variants are causal


def modded(name: str, t: dict, score: float, h: int, i: int, j: int) -> float:
    if name == "chained_pair_bias":
        return score + float(t["bias"][h, i % pv.PERIOD, j % pv.PERIOD])
    if name == "promoted_bias":  # the float32 entry, exactly, times the float64 gain
        return score + float(t["bias"][h, (i - j) % pv.PERIOD]) * float(t["gain"])
    if name == "symmetric_pair_bias":
        return score + float(t["bias"][h, min(i, j), max(i, j)])
    if name == "head_temperature":  # the mean as torch takes it of float32 values
        return score * float(t["parts"][h].mean())
    return score


def dense_attention(case: Case, inputs: Inputs) -> np.ndarray:
    """Softmax attention of the rule at every point, in numpy float64 (a fully masked row: 0)."""
    s, name = case.shape, case.variant.name
    t = pv.tables(name, s)
    q, k, vv = (x.double().numpy() for x in (inputs.q, inputs.k, inputs.v))
    out = np.zeros((s.B, s.Hq, s.Sq, s.D))
    for b in range(s.B):
        kb = b if s.Bkv == s.B else 0
        for h in range(s.Hq):
            kh = h // (s.Hq // s.Hkv)
            scores = q[b, h] @ k[kb, kh].T / math.sqrt(s.D)
            for i in range(s.Sq):
                row = np.array([modded(name, t, scores[i, j], h, i, j)
                                if sees(name, t, b, h, i, j) else -np.inf
                                for j in range(s.Skv)])
                if np.isneginf(row).all():
                    continue
                p = np.exp(row - row.max())
                out[b, h, i] = (p / p.sum()) @ vv[kb, kh]
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.token)
@pytest.mark.parametrize("name", pv.NAMES)
def test_each_mod_computes_its_rule_under_eager_flex_attention_in_float64(name, shape):
    case = Case(pv.variant(name), shape, "fp32")
    inputs = make_inputs(case, 3)
    out, _ = eager_flex_float64(case, inputs)
    np.testing.assert_allclose(out.numpy(), dense_attention(case, inputs), rtol=1e-12, atol=1e-12)


def assert_golden_equals_eager_flex(case: Case, seed: int = 0) -> None:
    inputs = make_inputs(case, seed)
    want, want_lse = eager_flex_float64(case, inputs)
    got = golden_attention(case, inputs)
    torch.testing.assert_close(got.out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.token)
@pytest.mark.parametrize("name", pv.NAMES)
def test_golden_equals_eager_flex_attention_in_float64(name, shape):
    assert_golden_equals_eager_flex(Case(pv.variant(name), shape, "bf16"))


# -- what one call on broadcast grids (the golden before REFERENCE_VERSION 2) made of them ------
def broadcast_mask(mask_mod, s: Shape) -> torch.Tensor:
    """main's old golden: the mask of batch 0 in one call on broadcast index grids."""
    heads, rows, keys = torch.arange(s.Hq).view(-1, 1, 1), torch.arange(s.Sq).view(-1, 1), \
        torch.arange(s.Skv)
    mask = torch.as_tensor(mask_mod(torch.tensor(0), heads, rows, keys), dtype=torch.bool)
    return mask.broadcast_to(s.Hq, s.Sq, s.Skv)


def broadcast_score(score_mod, scores: torch.Tensor, s: Shape) -> torch.Tensor:
    heads, rows, keys = torch.arange(s.Hq).view(-1, 1, 1), torch.arange(s.Sq).view(-1, 1), \
        torch.arange(s.Skv)
    return score_mod(scores, torch.tensor(0), heads, rows, keys).expand(s.Hq, s.Sq, s.Skv)


#: What the broadcast evaluation did with each: raised, or silently computed something else
#: ("wrong"); tiles_per_batch was right there (b was one 0-d value per batch) and wrong only
#: in the block mask, which was shared by every batch.
BROADCAST_OUTCOME = {
    "tiles_per_batch": "same", "tiles_per_head": "raised", "counted_documents": "raised",
    "per_head_prefix": "wrong", "symmetric_pairs": "raised", "chained_pair_bias": "raised",
    "promoted_bias": "wrong", "symmetric_pair_bias": "raised", "head_temperature": "wrong",
}


@pytest.mark.parametrize("name", pv.NAMES)
def test_the_broadcast_evaluation_got_these_mods_wrong_or_raised(name):
    s = SHAPES[0]
    mods = build_mods(pv.variant(name), s)
    grid = (torch.tensor([0]), torch.arange(s.Hq), torch.arange(s.Sq), torch.arange(s.Skv))
    scores = torch.randn(s.Hq, s.Sq, s.Skv, dtype=torch.float64)
    if name in pv.MASK_VARIANTS:
        pointwise = evaluate_mask(mods.mask_mod, *grid)[0]
        old = lambda: broadcast_mask(mods.mask_mod, s)  # noqa: E731
    else:
        pointwise = evaluate_score(mods.score_mod, scores[None], *grid)[0]
        old = lambda: broadcast_score(mods.score_mod, scores, s)  # noqa: E731
    try:
        outcome = "same" if torch.equal(old(), pointwise) else "wrong"
    except (IndexError, RuntimeError):
        outcome = "raised"
    assert outcome == BROADCAST_OUTCOME[name]


# -- every variant of the suite -----------------------------------------------------------------
SEQ = 96
COMPOSED = [
    composed(And(Atom("causal", 0), Not(Atom("win", 8))), (Atom("alibi", 8), Atom("cap", 5))),
    composed(Or(Atom("prefix", 10), Atom("doc", 24)), (Atom("bias", 1), Atom("scale", 0.5))),
    composed(Or(Atom("block", 8), Atom("dil", 3))),
]
SUITE_VARIANTS = ([make(SEQ, 16) for _, make in CORE_VARIANTS]
                  + [v.padded_causal(3 * SEQ // 4), v.activation_gelu()] + COMPOSED)


def test_the_list_below_holds_every_variant_of_the_suite():
    ours = {name for name in registered_variants()
            if defining_module(name) in ("cases.variants", "cases.composed")}
    assert ours == {variant.name for variant in SUITE_VARIANTS}


@pytest.mark.parametrize("variant", SUITE_VARIANTS, ids=lambda var: var.token)
def test_golden_equals_eager_flex_attention_on_every_suite_variant(variant):
    assert_golden_equals_eager_flex(Case(variant, Shape(2, 4, 2, SEQ, SEQ, 16), input_scale=4))
    assert_golden_equals_eager_flex(Case(variant, Shape(3, 2, 2, SEQ, SEQ, 8, Bkv=1)), seed=1)


# -- what a mask depends on ------------------------------------------------------------------
DEPENDENCE = {
    "tiles_per_batch": {"b", "q_idx", "kv_idx"},
    "tiles_per_head": {"h", "q_idx", "kv_idx"},
    "per_head_prefix": {"h", "q_idx", "kv_idx"},
    "counted_documents": {"q_idx", "kv_idx"},
    "symmetric_pairs": {"q_idx", "kv_idx"},
}
OTHER_MASKS = {
    "head_0_only": (lambda b, h, q_idx, kv_idx: h == 0, {"h"}),
    "rows_below_5": (lambda b, h, q_idx, kv_idx: q_idx < 5, {"q_idx"}),
    "constant": (lambda b, h, q_idx, kv_idx: torch.tensor(True), set()),
    "batch_parity": (lambda b, h, q_idx, kv_idx: (b + kv_idx) % 2 == 0, {"b", "kv_idx"}),
}


def varying_dimensions(mask_mod, shape: Shape) -> set[str]:
    """The index arguments along which the mask, evaluated at every point, takes two values."""
    grid = [torch.arange(n) for n in (shape.B, shape.Hq, shape.Sq, shape.Skv)]
    mask = evaluate_mask(mask_mod, *grid)
    return {name for dim, name in enumerate(INDEX_NAMES)
            if not torch.equal(mask, mask.narrow(dim, 0, 1).expand_as(mask))}


def test_mask_dependence_is_what_the_mask_uses_and_covers_where_it_varies():
    shape = Shape(2, 4, 4, 64, 64, 16)
    masks = {name: (build_mods(pv.variant(name), shape).mask_mod, deps)
             for name, deps in DEPENDENCE.items()}
    masks.update(OTHER_MASKS)
    masks["causal"] = (build_mods(v.causal(), shape).mask_mod, {"q_idx", "kv_idx"})
    for name, (mask_mod, expected) in masks.items():
        assert mask_dependence(mask_mod) == expected, name
        assert varying_dimensions(mask_mod, shape) == expected, name  # exact on these


def test_a_dependence_that_cancels_is_still_counted_and_that_is_only_conservative():
    times_zero = lambda b, h, q_idx, kv_idx: (h * 0 + kv_idx) <= q_idx  # noqa: E731
    assert mask_dependence(times_zero) == {"h", "q_idx", "kv_idx"}
    assert varying_dimensions(times_zero, Shape(1, 3, 3, 8, 8, 8)) == {"q_idx", "kv_idx"}


def test_per_batch_head_is_accepted_ignored_and_deprecated():
    with pytest.warns(DeprecationWarning, match=r"per_batch_head=True\) is deprecated and ignored"):
        mods = Mods(lambda b, h, q_idx, kv_idx: h == 0, None, per_batch_head=True)
    assert mask_dependence(mods.mask_mod) == {"h"}  # found without the flag


# -- the indexing rule: ours is flex_attention's, call for call ---------------------------------
_ROWS = torch.randint(0, 3, (9,), generator=torch.Generator().manual_seed(0))

#: Score mods over a captured table [4, 6, 5], indexed in each way a mod can index it.
_INDEXING_SCORE_MODS = {
    "by_head": lambda t: lambda s, b, h, q, kv: s + t[h, 0, 0],
    "by_head_and_python_ints": lambda t: lambda s, b, h, q, kv: s * t[h, 2, 1],
    "nested_index_tensors": lambda t: lambda s, b, h, q, kv: s + t[b, _ROWS[q], kv % 5],
    "table_row_then_column": lambda t: lambda s, b, h, q, kv: s - t[h][q % 6][kv % 5],
    "slice_falls_back_to_python": lambda t: lambda s, b, h, q, kv: s + t[1:3, 0, 0].sum() * h,
    "float32_table_promoted": lambda t: lambda s, b, h, q, kv: s + t.float()[h, q % 6, 0],
    # [[1, 2]] is [1, 2] under the rule of torch releases that take ints (a row of 5), and
    # rows 1 and 2 under Python's indexing (then this mod returns 6x5 values a point)
    "list_of_ints": lambda t: lambda s, b, h, q, kv: s + t[[1, 2]][h % 2],
}


def _under_torchs_own_rule(monkeypatch, evaluate):
    """``evaluate()`` with flex_attention's own TransformGetItemToIndex in place of ours."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    import cases.pointwise as pointwise

    with monkeypatch.context() as patch:
        patch.setattr(pointwise, "IndexAsAten", TransformGetItemToIndex)
        return evaluate()


#: torch's own rule cannot differentiate these to the table under vmap (its zeros_and_scatter
#: batching rule asserts on an index batched at a level the value is not); ours can.
_NO_TABLE_GRADIENT_UNDER_TORCHS_RULE = {"table_row_then_column"}


@pytest.mark.parametrize("name", sorted(_INDEXING_SCORE_MODS))
def test_our_indexing_rule_gives_what_flex_attentions_own_gives(monkeypatch, name):
    """IndexAsAten calls aten.index where torch's TransformGetItemToIndex calls it through
    ModIndex: the same values, bit for bit, and the same gradients, to the score and (where
    torch's rule can take it) to a captured table that requires grad."""
    table0 = torch.randn(4, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    score0 = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    grid = (torch.arange(2), torch.arange(4), torch.arange(9), torch.arange(7))

    def evaluate(wrt_table: bool):
        table, score = table0.clone().requires_grad_(), score0.clone().requires_grad_()
        out = evaluate_score(_INDEXING_SCORE_MODS[name](table), score, *grid)
        return (out.detach(), *torch.autograd.grad(out.sum(), (score, table) if wrt_table
                                                    else (score,)))

    wrt_table = name not in _NO_TABLE_GRADIENT_UNDER_TORCHS_RULE
    ours = evaluate(wrt_table)
    theirs = _under_torchs_own_rule(monkeypatch, lambda: evaluate(wrt_table))
    assert len(ours) == len(theirs) == (3 if wrt_table else 2)
    for mine, torchs in zip(ours, theirs):
        assert torch.equal(mine, torchs)
    assert not torch.equal(ours[0], score0)  # the mod did something
    if wrt_table:
        assert ours[2].abs().sum() > 0  # and the table's gradient is not trivially zero
    else:  # torch's rule is really the one in place on the other side: it refuses this one
        assert len(evaluate(True)) == 3
        with pytest.raises(AssertionError) as refused:
            _under_torchs_own_rule(monkeypatch, lambda: evaluate(True))
        # by the batching rule of torch's indexing (zeros_and_scatter); its text differs by
        # release ('must match value shape' in 2.13, none in 2.11), its place does not
        assert refused.traceback[-1].path.name == "_trace_wrapped_higher_order_op.py"


def test_a_mask_that_indexes_gives_what_flex_attentions_own_rule_gives(monkeypatch):
    doc = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3])
    heads = torch.tensor([True, False, False, True])

    def same_document_causal_or_head(b, h, q, kv):
        return (doc[q] == doc[kv]) & (kv <= q) | heads[h] & (kv == 0)

    grid = (torch.arange(2), torch.arange(4), torch.arange(9), torch.arange(9))
    ours = evaluate_mask(same_document_causal_or_head, *grid)
    theirs = _under_torchs_own_rule(
        monkeypatch, lambda: evaluate_mask(same_document_causal_or_head, *grid))
    assert torch.equal(ours, theirs)
    assert ours.any() and not ours.all()


class _RuleThatLeavesIntsToPython(TorchFunctionMode):
    """The older form of flex_attention's rule (torch 2.6): only indices that are all tensors
    become aten.index; ints go to Python's indexing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.__getitem__:
            indices = pytree.tree_leaves(args[1])
            if all(isinstance(i, torch.Tensor) for i in indices):
                return torch.ops.aten.index(args[0], indices)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", sorted(_INDEXING_SCORE_MODS))
def test_under_a_torch_whose_rule_leaves_ints_to_python_ours_does_too(monkeypatch, name):
    import cases.pointwise as pointwise

    table = torch.randn(4, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    score = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    grid = (torch.arange(2), torch.arange(4), torch.arange(9), torch.arange(7))
    mod = _INDEXING_SCORE_MODS[name](table)

    def evaluate():
        try:
            return evaluate_score(mod, score, *grid)
        except Exception as exc:  # noqa: BLE001 - both rules must fail alike
            return type(exc)

    monkeypatch.setattr(pointwise, "_takes_ints", False)
    ours = evaluate()
    monkeypatch.setattr(pointwise, "IndexAsAten", _RuleThatLeavesIntsToPython)
    older = evaluate()
    if isinstance(ours, torch.Tensor):
        assert isinstance(older, torch.Tensor) and torch.equal(ours, older)
    else:
        assert ours is older
    if name == "list_of_ints":  # where the two forms of the rule differ
        assert not isinstance(ours, torch.Tensor) or ours.shape != score.shape


def test_a_score_mod_that_indexes_what_it_computes_from_the_score_has_its_true_gradient():
    """Indexing a tensor made from the score: our rule differentiates it as aten.index does,
    the analytic gradient (torch's ModIndex rule gives other values here under vmap, so the
    comparison is with the analytic one; the suite's mods index only captured tables)."""
    score = torch.randn(1, 6, 3, 4, dtype=torch.float64, requires_grad=True)
    grid = (torch.arange(1), torch.arange(6), torch.arange(3), torch.arange(4))

    def signed_by_head(s, b, h, q, kv):
        return torch.stack([s, -s, 2 * s])[h % 3]

    out = evaluate_score(signed_by_head, score, *grid)
    (grad,) = torch.autograd.grad(out.sum(), score)
    factor = torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64)[torch.arange(6) % 3]
    assert torch.equal(out.detach(), score.detach() * factor.view(1, 6, 1, 1))
    assert torch.equal(grad, factor.view(1, 6, 1, 1).expand_as(score))


def test_torch_dynamo_is_imported_only_when_a_mod_indexes_with_ints():
    """torch._dynamo takes 0.85-2.4 s to import here, and only flex_attention's rule for int
    indices needs it (the rule's probe): importing this module, and evaluating masks and score
    mods that index with tensors only, leave it unimported (the catalog's goldens, a run's
    controller whose goldens the cache serves); the first mod that indexes with ints imports
    it and gets the rule's value. Checked in a fresh process."""
    code = ("import sys, torch\n"
            "dynamo = lambda: 'torch._dynamo' in sys.modules\n"
            "with_torch = dynamo()\n"
            "import cases.pointwise as p\n"
            "grid = (torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(3))\n"
            "slopes = torch.tensor([[0.5, 0.25], [2.0, 4.0]])\n"
            "by_tensor = p.evaluate_score(lambda s, b, h, q, kv: s + slopes[h, h],\n"
            "                             torch.zeros(1, 2, 3, 3), *grid)\n"
            "mask = p.evaluate_mask(lambda b, h, q, kv: slopes[h, h] * kv <= q, *grid)\n"
            "depends = p.mask_dependence(lambda b, h, q, kv: slopes[h, h] * kv <= q)\n"
            "before = dynamo()\n"
            "by_int = p.evaluate_score(lambda s, b, h, q, kv: s + slopes[1, h],\n"
            "                          torch.zeros(1, 2, 3, 3), *grid)\n"
            "print(with_torch, before, dynamo(), float(by_tensor[0, 1, 0, 0]),\n"
            "      int(mask.sum()), sorted(depends), float(by_int[0, 1, 0, 0]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert proc.stdout.split() == ["False", "False", "True", "4.0", "10",
                                   "['h',", "'kv_idx',", "'q_idx']", "4.0"], proc.stderr[-2000:]


def test_a_mod_whose_bare_except_swallows_the_rules_question_still_gets_the_rule(monkeypatch):
    """The indexing rule for ints was asked by raising from inside the mod; a bare ``except:``
    there caught that and returned its other branch, a value that then depended on whether
    an earlier mod of the process had asked. It is asked where the mod indexes, now: the mod
    never sees a question."""
    import cases.pointwise as pointwise

    table = torch.tensor([[1.0, 2.0], [4.0, 8.0]], dtype=torch.float64)

    def adds_a_table_entry(s, b, h, q, kv):
        try:
            return s + table[1, h]
        except:  # noqa: E722 - what the test is about
            return s

    score = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    grid = (torch.arange(1), torch.arange(2), torch.arange(3), torch.arange(3))
    monkeypatch.setattr(pointwise, "_takes_ints", None)  # as in a process that never asked
    asked_first = evaluate_score(adds_a_table_entry, score, *grid)
    assert pointwise._takes_ints is not None
    asked_before = evaluate_score(adds_a_table_entry, score, *grid)
    assert torch.equal(asked_first, asked_before)
    assert torch.equal(asked_first[0, :, 0, 0], table[1])  # the entries, not the except branch
