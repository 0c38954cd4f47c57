"""The fuzzing grammar and search: drawn cases are data (specs and ids round-trip), their mods
compute what cases/composed.py defines, eager flex_attention passes the verdict on them, and
the search is repeatable and shrinks a failure to the known minimal case, through a fake
executor and through the real supervised one (whose saved spec `--case-file` runs again)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from cases import composed
from cases.composed import And, Not, Or
from cases.inputs import make_inputs
from cases.model import MODES, Case
from cases.variants import build_mods
from conformance import fuzz, fuzz_grammar
from conformance.run_info import KEEPS_PYTHONPATH, case_file_command
from reference.golden import reference_pair
from reference.verdict import judge
from records.results import Label, Record
from tests.shape_fault_backends import MIN_FAILING_SQ

REPO = Path(__file__).resolve().parent.parent
FAST = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MINIMAL_FAILING_ID = "composed/b1-h2x1-s67x67-d16/bf16/fwd"


@settings(FAST, max_examples=150)
@given(fuzz_grammar.cases(MODES))
def test_drawn_cases_round_trip_through_specs_and_ids(case):
    again = Case.from_json(json.loads(json.dumps(case.to_json())))
    assert again == case and again.id == case.id
    assert re.fullmatch(r"[A-Za-z0-9_./-]+", case.variant.token)
    assert composed.variant_from_token(case.variant.token) == case.variant
    assert composed.decode(case.variant) == composed.decode(again.variant)


def dense(expr, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The mask expression evaluated on index grids, from the atom table of cases/composed.py."""
    if isinstance(expr, Not):
        return ~dense(expr.arg, i, j)
    if isinstance(expr, And):
        return dense(expr.left, i, j) & dense(expr.right, i, j)
    if isinstance(expr, Or):
        return dense(expr.left, i, j) | dense(expr.right, i, j)
    n = expr.value
    table = {"causal": lambda: j <= i + n, "win": lambda: np.abs(i - j) < n,
             "prefix": lambda: np.broadcast_to(j < n, (len(i), j.shape[1])),
             "doc": lambda: i // n == j // n, "block": lambda: (i // n + j // n) % 2 == 0,
             "dil": lambda: (i - j) % n == 0}
    return np.broadcast_to(table[expr.name](), (i.shape[0], j.shape[1]))


def dense_scores(chain, s: np.ndarray, heads: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    h = np.arange(heads)[:, None, None]
    for atom in chain:
        c = float(atom.value)
        if atom.name == "scale":
            s = s * c
        elif atom.name == "cap":
            s = c * np.tanh(s / c)
        elif atom.name == "alibi":
            s = s + 2.0 ** (-c * (h + 1) / heads) * (j - i)
        else:
            table = composed.bias_table(heads).double().numpy()
            s = s + c * table[h, (i - j) % 16]
    return s


@settings(FAST, max_examples=80)
@given(fuzz_grammar.masks(), fuzz_grammar.score_chains(), fuzz_grammar.shapes())
def test_mods_compute_the_atoms_definitions(mask, chain, shape):
    mods = build_mods(composed.composed(mask, chain), shape)
    i, j = np.arange(shape.Sq)[:, None], np.arange(shape.Skv)[None, :]
    q_idx, kv_idx = torch.arange(shape.Sq).view(-1, 1), torch.arange(shape.Skv)
    if mask is None:
        assert mods.mask_mod is None
    else:
        got = torch.broadcast_to(mods.mask_mod(0, 0, q_idx, kv_idx), (shape.Sq, shape.Skv))
        assert (got.numpy() == dense(mask, i, j)).all(), composed.mask_text(mask)
    if not chain:
        assert mods.score_mod is None
        return
    scores = torch.randn(shape.Hq, shape.Sq, shape.Skv, dtype=torch.float64) * 4
    heads = torch.arange(shape.Hq).view(-1, 1, 1)
    got = mods.score_mod(scores.clone(), 0, heads, q_idx, kv_idx).double()
    expected = dense_scores(chain, scores.numpy(), shape.Hq, i, j)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


@settings(FAST, max_examples=8)
@given(fuzz_grammar.cases(("fwd",)))
def test_eager_flex_attention_passes_the_verdict_on_drawn_cases(case):
    s = case.shape
    inputs = make_inputs(case)
    golden, baseline = reference_pair(case, inputs)
    mods = build_mods(case.variant, s)
    mask = None if mods.mask_mod is None else create_block_mask(
        mods.mask_mod, None, None, s.Sq, s.Skv, device="cpu")
    out = flex_attention(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod,
                         block_mask=mask, enable_gqa=s.Hq != s.Hkv)
    verdict = judge(case, golden, baseline, out)
    assert verdict.passed, f"{case.id}: {verdict.summary}"


def fake_execute(calls: list[str]):
    """MISMATCH exactly when tests/shape_fault_backends.WrongOnLongHead1 is wrong."""
    def execute(case: Case) -> Record:
        calls.append(case.id)
        wrong = case.shape.Sq >= MIN_FAILING_SQ and case.shape.Hq >= 2
        return Record(case.id, Label.MISMATCH if wrong else Label.PASS, case.to_json())
    return execute


def test_search_shrinks_to_the_minimal_failing_case_and_is_repeatable():
    first, second, other = [], [], []
    result = fuzz.search(fake_execute(first), examples=20, seed=7)
    fuzz.search(fake_execute(second), examples=20, seed=7)
    fuzz.search(fake_execute(other), examples=20, seed=8)
    assert result.failure is not None and result.failure.label is Label.MISMATCH
    assert result.failure.case_id == MINIMAL_FAILING_ID
    assert first == second and first != other
    assert result.examples_run == len(first)


def test_shrinking_keeps_the_label_of_the_failure_it_found():
    """A smaller case that fails another way (here: every short one is a HARNESS_ERROR, as a
    custom variant's mod that raises at small shapes is) is not the failure being shrunk."""
    def execute(case: Case) -> Record:  # once shrinking began, every short case raises
        wrong = case.shape.Sq >= MIN_FAILING_SQ and case.shape.Hq >= 2
        label = Label.MISMATCH if wrong else (
            Label.HARNESS_ERROR if case.shape.Sq < 32 and mismatched else Label.PASS)
        mismatched.extend([True] if wrong else [])
        return Record(case.id, label, case.to_json())

    mismatched: list[bool] = []
    result = fuzz.search(execute, examples=20, seed=7)
    assert result.failure is not None and result.failure.label is Label.MISMATCH
    assert result.failure.case_id == MINIMAL_FAILING_ID
    assert any(Label.HARNESS_ERROR is r.label for r in result.tried)  # tried while shrinking


def test_search_without_failures_runs_the_examples_asked_for():
    calls = []
    result = fuzz.search(fake_execute(calls), examples=6, seed=1,
                         unsupported=lambda case: "no" if case.shape.Sq >= 65 else None)
    assert result.failure is None and result.examples_run == len(calls) == 6
    assert all(Case.from_json(json.loads(json.dumps(r.case))).shape.Sq < 65 for r in result.tried)


@pytest.mark.slow
def test_search_through_the_supervised_executor_saves_a_spec_that_reruns_and_fuzzing_is_off_by_default(tmp_path):
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import load_backend
    from conformance.executor import Executor, Settings
    from conformance.reference_cache import ReferenceCache

    spec = "tests.shape_fault_backends:WrongOnLongHead1"
    executor = Executor(load_backend(spec), spec, WorkerSlot(0, 1), Settings(timed_runs=1),
                        ReferenceCache(None, 0), worker="test")
    try:
        result = fuzz.search(executor.execute, examples=8, seed=3)
    finally:
        executor.close()
    assert result.failure is not None, [r.case_id for r in result.tried]
    assert result.failure.case_id == MINIMAL_FAILING_ID, result.failure.message
    assert result.failure.label is Label.MISMATCH and not result.flaky
    path = fuzz.save_failure(result.failure, tmp_path / "report", spec, 3)
    assert path.parent == tmp_path / "report" / "fuzz-failures"
    rerun_dir = tmp_path / "rerun"
    command = case_file_command(path, spec, 3, (), rerun_dir)
    # a module:object backend comes with the PYTHONPATH it was imported from
    assert command == (f"PYTHONPATH={REPO}{KEEPS_PYTHONPATH} pytest conformance/ --backend {spec} "
                       f"--case-file {path} --seed 3 --report-dir {rerun_dir}")
    # the whole conformance/ directory: the matrix runs the spec, test_fuzz.py skips
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *command.split()[2:], "-p", "no:cacheprovider", "-rs",
         "--reference-cache", "none"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[MISMATCH]" in proc.stdout and "1 failed, 1 skipped" in proc.stdout
    assert "fuzzing is off; pass --fuzz-examples N (N > 0)" in proc.stdout


@pytest.mark.slow
def test_fuzz_examples_option_runs_the_search_and_names_the_saved_spec(tmp_path):
    spec = "tests.shape_fault_backends:WrongOnLongHead1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_fuzz.py", "-p", "no:cacheprovider",
         "--fuzz-examples", "16", "--seed", "3", "--backend", spec,
         "--report-dir", str(tmp_path / "report"), "--reference-cache", "none"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = tmp_path / "report" / "fuzz-failures" / "fuzz_composed_b1-h2x1-s67x67-d16_bf16_fwd.json"
    assert f"[MISMATCH] fuzzed case fuzz/{MINIMAL_FAILING_ID}" in proc.stdout
    assert (f"run it again: PYTHONPATH={REPO}{KEEPS_PYTHONPATH} pytest conformance/ --backend "
            f"{spec} --case-file "
            f"{saved} --seed 3 --report-dir {tmp_path / 'report'}-fuzz-rerun") in proc.stdout
    assert json.loads(saved.read_text())["cases"][0]["id"] == MINIMAL_FAILING_ID
    # results.json: the examples drawn up to the first failure, then the minimal failing case;
    # the shrinking's executions are not records
    from records.results import load_results

    results = load_results(tmp_path / "report" / "results.json")
    assert results.complete  # a search that failed has ended: its run is whole
    records = results.records
    failed = [r for r in records if r.label is not Label.PASS]
    from conformance.kept_outputs import outputs_path

    kept = sorted((tmp_path / "report" / "outputs").glob("*.pt"))  # none for a shrinking try
    assert kept == sorted({outputs_path(tmp_path / "report", r.case_id) for r in failed})
    first = next(r for r in records if r.label is Label.MISMATCH)  # where the search met it
    if first.case_id != f"fuzz/{MINIMAL_FAILING_ID}":  # the failure line says where it began
        assert (f"found as {first.case_id}, shrunk to the case above (same label)"
                in proc.stdout), proc.stdout[-3000:]
    assert [r.case_id for r in failed if r.case_id == f"fuzz/{MINIMAL_FAILING_ID}"], failed
    assert len(failed) <= 2  # the first failing example drawn, and the minimal one
    assert all(r.case_id.startswith("fuzz/") for r in records)


def test_the_failure_line_names_where_the_search_met_it_and_what_else_failed():
    """The minimal case can be another variant than the failure the search met, and other
    failures met on the way were dropped without a word (an outside trial)."""
    from conformance.fuzz import FuzzResult
    from conformance.test_fuzz import _found_as
    from records.results import Record

    met = Record(case_id="fuzz/composed-alibi2/b2-h8x2-s200x200-d16/fp16/fwd",
                 label=Label.MISMATCH)
    crash = Record(case_id="fuzz/composed/b1-h2x2-s16x16-d16/fp32/fwd", label=Label.RUNTIME_ERROR)
    minimal = Record(case_id="fuzz/composed/b1-h1x1-s16x16-d16/bf16/fwd", label=Label.MISMATCH)
    result = FuzzResult(tried=[Record(case_id="fuzz/a", label=Label.PASS), met, crash, minimal])
    assert _found_as(result, minimal) == [
        f"found as {met.case_id}, shrunk to the case above (same label)",
        f"also met while searching (not recorded): RUNTIME_ERROR x1 (e.g. {crash.case_id})"]
    assert _found_as(FuzzResult(tried=[minimal]), minimal) == []
