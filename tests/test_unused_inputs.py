"""A backend whose output does not depend on an input: autograd gives no gradient for it, which
is a gradient of zero, judged against the golden's like any other (an outside audit: a correct
plain-autograd backend on a score mod that ignores the score was a COMPILE_ERROR)."""
from __future__ import annotations

import pytest

from cases.model import Case, Shape, Variant
from records.results import Label
from tests import score_ignoring_variants
from tests.test_backends_cpu import execute

CAUSAL = Case(Variant("causal"), Shape(1, 2, 2, 32, 32, 16), "fp32", "fwd+bwd")
DENSE = "tests.dense_autograd_backend:DenseAutograd"


@pytest.mark.slow
def test_a_correct_backend_passes_a_score_mod_whose_gradients_are_zero():
    records = execute(DENSE, [score_ignoring_variants.CASE, CAUSAL], seeds=(0, 1),
                      cases_modules=("tests.score_ignoring_variants",))
    assert [r.label for r in records] == [Label.PASS] * 4, [r.message for r in records]


@pytest.mark.slow
def test_a_backend_whose_output_ignores_the_queries_is_a_mismatch_on_dq():
    record, = execute("tests.dense_autograd_backend:IgnoresQueries", [CAUSAL])
    assert record.label is Label.MISMATCH, record.message
    assert record.message.startswith("dq: "), record.message
