"""A mod that flex_attention cannot run is refused before its case runs, in one line with
its own fix (cases/pointwise.py check_mods): a mask that is no bool per point, one that
create_block_mask refuses, a wrong signature, an error of its own (moved out of
tests/test_pointwise_mods.py when that passed 500 lines)."""
from __future__ import annotations

import functools

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from cases.pointwise import PointwiseModError, check_mods


def test_a_mask_that_is_not_one_bool_per_point_is_refused_in_one_line():
    with pytest.raises(PointwiseModError) as err:
        check_mods(lambda b, h, q_idx, kv_idx: torch.stack((q_idx, kv_idx)) >= 0, None,
                   "odd_mask")
    assert ("variant 'odd_mask': its mask_mod cannot be evaluated point by point under "
            "torch.vmap (TypeError: it returned shape (2,) per point, not a 0-d tensor);"
            ) in str(err.value)
    with pytest.raises(PointwiseModError) as err:  # vmap's advice did not apply to it
        check_mods(lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx).int(), None, "odd_mask")
    assert str(err.value) == (
        "variant 'odd_mask': its mask_mod returned a torch.int32 tensor, and flex_attention "
        "needs a bool one per point; return a comparison (or .bool() of the value)")


class _Packer:
    def __init__(self, doc: torch.Tensor):
        self.doc = doc

    def same_document(self, b, h, q_idx, kv_idx):
        return self.doc[q_idx] == self.doc[kv_idx]


class _DocumentMask(torch.nn.Module):
    def __init__(self, doc: torch.Tensor):
        super().__init__()
        self.register_buffer("doc", doc)

    def forward(self, b, h, q_idx, kv_idx):
        return self.doc[q_idx] == self.doc[kv_idx]


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_logged
def _logged_causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@pytest.mark.parametrize("mask_mod, name, counted", [
    (_Packer(torch.arange(8) // 3).same_document, "_Packer.same_document",
     "counted 5 positional parameters, a score_mod's"),
    (_DocumentMask(torch.arange(8) // 3), "_DocumentMask", "Expected 4 or 5 positional args, "
                                                           "got 2"),
    (_logged_causal, "_logged_causal", "Expected 4 or 5 positional args, got 0"),
])
def test_a_mask_that_create_block_mask_refuses_is_the_mods_fault_not_the_backends(
        mask_mod, name, counted):
    """A bound method, an nn.Module and a decorated function were accepted here and by the
    golden, then create_block_mask refused them in the backend's child: RUNTIME_ERROR, a
    traceback, on every backend (an outside trial). flex_attention refuses them too."""
    with pytest.raises(AssertionError):
        create_block_mask(mask_mod, None, None, 8, 8, device="cpu")
    with pytest.raises(PointwiseModError) as err:
        check_mods(mask_mod, None, "mine")
    assert str(err.value) == (
        f"variant 'mine': its mask_mod {name} is refused by flex_attention's create_block_mask "
        f"({counted}): it counts a mask_mod's positional parameters from its code and needs "
        "exactly 4; pass a plain function, e.g. lambda b, h, q_idx, kv_idx: mod(b, h, q_idx, "
        "kv_idx)")
    check_mods(lambda b, h, q_idx, kv_idx: mask_mod(b, h, q_idx, kv_idx), None, "mine")


def _raises_its_own_error(b, h, q_idx, kv_idx):
    raise ValueError("window must be positive")


@pytest.mark.parametrize("mask_mod, score_mod, says", [
    (lambda q_idx, kv_idx: kv_idx <= q_idx, None,
     "its mask_mod takes (q_idx, kv_idx), and flex_attention calls mask_mod(b, h, q_idx, "
     "kv_idx); give it those 4 arguments"),
    (None, lambda score, q_idx, kv_idx: score,
     "its score_mod takes (score, q_idx, kv_idx), and flex_attention calls score_mod(score, b, "
     "h, q_idx, kv_idx); give it those 5 arguments"),
    (_raises_its_own_error, None,
     "its mask_mod raised ValueError: window must be positive at the point b = h = q_idx = "
     "kv_idx = 0, where eager flex_attention calls it too; fix the mod"),
])
def test_a_mod_with_the_wrong_signature_or_an_error_of_its_own_is_told_its_own_fix(
        mask_mod, score_mod, says):
    """Both used to get vmap's advice (torch.where instead of a Python if), which does not
    apply to them."""
    with pytest.raises(PointwiseModError) as err:
        check_mods(mask_mod, score_mod, "mine")
    assert str(err.value) == f"variant 'mine': {says}"


def test_a_case_whose_defined_answer_is_nan_is_the_cases_fault_not_the_backends():
    """flex_attention's answer is NaN where a mod puts +inf at a visible pair: every backend,
    eager flex_attention itself included, was a MISMATCH, whose message blamed it (an
    outside audit). Such a case is the case's HARNESS_ERROR, whatever the backend computed."""
    from cases.model import Case, Shape, Variant
    from records.results import Label
    from tests import where_variants  # the worker computes the reference: it needs the builder
    from tests.test_backends_cpu import execute

    assert "where_first_key_forced" not in where_variants.NAMES  # the finite-answer ones
    case = Case(Variant("where_first_key_forced"), Shape(1, 2, 2, 16, 16, 16), "fp32")
    [record] = execute("cpu-eager", [case], cases_modules=("tests.where_variants",))
    assert record.label is Label.HARNESS_ERROR, record.message
    assert record.message.startswith("the case's own mods make flex_attention's answer NaN "
                                     "(out: 512 of 512 values): a score of +inf"), record.message
    assert record.message.endswith("no backend can be judged on it; fix the variant, not the "
                                   "backend")


def test_gradients_that_are_nan_by_definition_make_the_answer_undefined_too():
    """dQ of a torch.where mod whose branch not taken has an infinite derivative is NaN under
    flex_attention (and in a dense float64 autograd): no backend could pass it."""
    from cases.inputs import make_grad_output, make_inputs
    from cases.model import Case, Shape, Variant
    from conformance.decision import _undefined_answer
    from reference.golden import reference_pair
    from tests import where_variants  # noqa: F401  (registers the variant)

    case = Case(Variant(where_variants.NAMES[0]), Shape(1, 2, 2, 16, 16, 16), "fp32", "fwd+bwd")
    golden, _ = reference_pair(case, make_inputs(case, 0), make_grad_output(case, 0))
    assert torch.isfinite(golden.out).all()
    undefined = _undefined_answer(golden)
    assert undefined.startswith("dq: ") and "dv" not in undefined, undefined
    forward = Case(case.variant, case.shape, "fp32", "fwd")
    assert _undefined_answer(reference_pair(forward, make_inputs(forward, 0))[0]) == ""


def test_a_case_that_overflows_float32_where_flex_attention_computes_it_is_the_cases_fault():
    """A naive softplus, log(1 + exp(40 s)) / 40, is finite in the float64 reference and inf in
    float32, where flex_attention evaluates it (eager flex_attention's answer is NaN in 368 of
    1024 values here, in float64 in none): it was the backend's MISMATCH (an outside review).
    The baseline, a careful float32 kernel, overflows there too: the case's HARNESS_ERROR."""
    from cases.model import Case, Shape, Variant
    from records.results import Label
    import importlib

    from tests.test_backends_cpu import execute

    case = Case(Variant("softplus_naive"), Shape(1, 2, 2, 32, 32, 16), "fp32")
    # rows hidden by overflow: the baseline's lse is -inf there, and the verdict's (a review)
    padded = Case(Variant("pad_twice"), Shape(2, 2, 2, 64, 64, 16), "fp32", "fwd+lse")
    modules = ("tests.where_variants", "tests.padding_variants")
    for module in modules:  # their builders: this worker computes the reference
        importlib.import_module(module)
    overflowing, hidden = execute("cpu-eager", [case, padded], cases_modules=modules)
    assert overflowing.label is Label.HARNESS_ERROR, overflowing.message
    assert overflowing.message.startswith(
        "the case overflows the arithmetic flex_attention computes it in: a careful fp32 "
        "kernel (the baseline"), overflowing.message
    assert "where the float64 reference is finite (out: " in overflowing.message
    assert hidden.label is Label.PASS, hidden.message
    # a backend wrong where the case is defined is the backend's MISMATCH, on both
    wrong = execute("tests.fault_backends:OnePercentOff", [case, padded], cases_modules=modules)
    assert [r.label for r in wrong] == [Label.MISMATCH, Label.MISMATCH], [r.message for r in wrong]


def _four(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _five(score, b, h, q_idx, kv_idx):
    return score


@functools.wraps(_five)
def _four_wrapping_five(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _four_and_more(b, h, q_idx, kv_idx, *more):
    return kv_idx <= q_idx


def _four_and_keywords(b, h, q_idx, kv_idx, **keywords):
    return kv_idx <= q_idx


def _four_and_a_keyword_only(b, h, q_idx, kv_idx, *, window):
    return kv_idx <= q_idx


def _four_and_a_default(b, h, q_idx, kv_idx, window=4):
    return kv_idx <= q_idx


@pytest.mark.parametrize("mod", [
    _four, _five, _four_wrapping_five, _four_and_more, _four_and_keywords,
    _four_and_a_keyword_only, _four_and_a_default, lambda b, h, q_idx, kv_idx: q_idx >= 0,
    functools.partial(_five, 0.0)], ids=lambda mod: getattr(mod, "__name__", "partial"))
def test_the_mask_check_takes_unasked_only_what_torchs_rule_takes(mod):
    """The mask check takes a plain four-parameter function without asking torch's rule
    (whose module imports sympy in torch 2.14), only where every release's rule takes it as
    a mask_mod: 2.13 and 2.14 count __code__'s parameters, 2.6 to 2.9 inspect.signature's,
    which counts *args, **kwargs and a keyword-only one and follows __wrapped__ (a review).
    Each mod is asked of the running torch's rule; a mod taken unasked must be one it takes
    (and one both rules take: plain parameters only)."""
    import inspect

    from cases.pointwise import _takes_four_plain_parameters
    from torch.nn.attention.flex_attention import _get_mod_type, _ModificationType

    unasked = _takes_four_plain_parameters(mod)
    if unasked:
        assert _get_mod_type(mod) == _ModificationType.MASK_MOD
        parameters = inspect.signature(mod, follow_wrapped=True).parameters.values()
        assert [p.kind for p in parameters] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 4
        assert all(p.default is inspect.Parameter.empty for p in parameters)
    assert unasked is (mod is _four or getattr(mod, "__name__", "") == "<lambda>")
