"""Fuzzing tests what can run and says what it did: it draws only the modes and dtypes the
backend runs, every example is a results.json record under ``fuzz/`` that the report places,
``-v`` prints each one as it goes, and a case module's ``fuzz_variants`` feeds the grammar."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from torch.nn.attention.flex_attention import flex_attention

from cases.custom import fuzz_variant_sources
from cases.model import Case, Shape, split_origin
from conformance import compat, fuzz, fuzz_grammar
from conformance.backends.cpu import CpuEager, CpuInductor
from reports.matrix import coordinates
from records.results import Label, load_results
from tests.test_custom_cases import EXAMPLES
from tests.test_plugin_runs import REPO, clean_env

CUSTOM_NAMES = {"dilated_sliding_window", "global_window"}


def test_the_fuzzer_draws_only_what_each_cpu_backend_runs():
    eager, inductor = fuzz.runnable(CpuEager().unsupported_reason), \
        fuzz.runnable(CpuInductor().unsupported_reason)
    assert (eager.modes, eager.dtypes) == (("fwd", "fwd+lse"), ("bf16", "fp16", "fp32"))
    assert (inductor.modes, inductor.dtypes) == (("fwd",), ("bf16", "fp16", "fp32"))
    assert inductor.refusals() == [
        f"fwd+lse/bf16, fwd+lse/fp16, fwd+lse/fp32: {compat.CPU_COMPILED_LSE_SENTENCE}",
        f"fwd+bwd/bf16, fwd+bwd/fp16, fwd+bwd/fp32: {compat.CPU_BACKWARD_SENTENCE}"]
    drawn: list[Case] = []
    fuzz.search(lambda case: drawn.append(case) or _pass(case), examples=30, seed=4,
                modes=inductor.modes, dtypes=inductor.dtypes)
    assert len(drawn) == 30 and {c.mode for c in drawn} == {"fwd"}
    assert {c.dtype for c in drawn} == {"bf16", "fp16", "fp32"}


def test_the_declared_cpu_refusal_is_torchs_own_sentence():
    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    with pytest.raises(Exception) as err:
        flex_attention(q, q, q).sum().backward()
    assert compat.unsupported_sentence(err.value) == compat.CPU_BACKWARD_SENTENCE
    assert compat.known_cpu_refusal("fwd+bwd", False) == compat.CPU_BACKWARD_SENTENCE
    assert compat.known_cpu_refusal("fwd+bwd", True, version=(2, 16)) is None  # unchecked: run it


def _pass(case: Case):
    from records.results import Record

    return Record(case.id, Label.PASS, case.to_json())


def test_a_case_modules_fuzz_variants_feed_the_grammar_alone_or_with_composed(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sources = fuzz_variant_sources(["my_variants"])
    assert len(sources) == 1
    seen_alone, seen_mixed = set(), set()

    @settings(max_examples=40, database=None, derandomize=True, deadline=None)
    @given(fuzz_grammar.cases(("fwd",), sources=sources, with_composed=False))
    def alone(case):
        seen_alone.add(case.variant.name)
        assert case.variant in sources[0](case.shape)

    @settings(max_examples=60, database=None, derandomize=True, deadline=None)
    @given(fuzz_grammar.cases(("fwd",), sources=sources))
    def mixed(case):
        seen_mixed.add(case.variant.name)

    alone()
    mixed()
    assert seen_alone == CUSTOM_NAMES and seen_mixed == CUSTOM_NAMES | {"composed"}


def test_a_fuzz_variants_hook_returning_other_things_is_a_one_line_error(tmp_path, monkeypatch):
    (tmp_path / "bad_hook.py").write_text(
        "def cases(profile):\n    return []\n"
        "def fuzz_variants(shape):\n    return ['sliding_window']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (source,) = fuzz_variant_sources(["bad_hook"])
    with pytest.raises(ValueError, match=r"^case module 'bad_hook': fuzz_variants returned a str; "
                                         r"return cases.model.Variant objects$"):
        source(Shape(1, 1, 1, 8, 8, 8))


def run_fuzz(tmp_path, *extra: str, backend: str = "cpu-eager") -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=f"{REPO}{os.pathsep}{EXAMPLES}")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_fuzz.py", "-p", "no:cacheprovider",
         "-v", "--backend", backend, "--report-dir", str(tmp_path / "report"),
         "--reference-cache", "none", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_each_example_is_a_placed_record_printed_as_it_goes_and_custom_fuzzes_alone(tmp_path):
    """On cpu-eager: what hypothesis draws for a seed changes with its release, and this test
    is about the records and custom variants, not about a compiler's float32."""
    proc = run_fuzz(tmp_path, "--fuzz-examples", "4", "--seed", "2", "--matrix", "custom",
                    "--cases-module", "my_variants")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = load_results(tmp_path / "report" / "results.json").records
    assert 1 <= len(records) <= 4  # hypothesis may draw one case twice: one record per id
    printed = [line.split() for line in proc.stdout.splitlines() if line.startswith("fuzz/")]
    assert {(r.case_id, r.label.value) for r in records} == {tuple(p) for p in printed}
    assert "modes fwd, fwd+lse, dtypes bf16, fp16, fp32; not drawn: fwd+bwd/bf16" in proc.stdout
    for record in records:
        origin, case_id = split_origin(record.case_id)
        case = Case.from_json(record.case)
        assert origin == "fuzz" and case.id == case_id and case.mode in ("fwd", "fwd+lse")
        assert case.variant.name in CUSTOM_NAMES
        assert record.label is Label.PASS, record.message
        assert coordinates(record).group.startswith(f"fuzz · {case.dtype} · {case.mode}")


def test_an_unsupported_reason_that_never_answers_fails_the_fuzzing_in_one_line(tmp_path):
    """The fuzzer asked the hook directly, with no budget: a hook that hangs stopped the run
    until it was killed (an outside review)."""
    proc = run_fuzz(tmp_path, "--fuzz-examples", "2", "--run-timeout", "1",
                    backend="tests.broken_plugins:HangsInUnsupportedReasonOnComposed")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("fuzzing on test-hangs-in-unsupported-reason-on-composed: setup: its "
            "unsupported_reason did not return within 1 s (the run budget)") in proc.stdout
    assert "During handling of the above exception" not in proc.stdout  # said once


@pytest.mark.slow
def test_a_case_module_that_only_gives_fuzz_variants_fuzzes_under_matrix_custom(tmp_path):
    """A run whose case modules give no case is refused, except when it fuzzes: a module may
    exist for its fuzz_variants alone (an outside review: it was refused too)."""
    (tmp_path / "fuzz_only.py").write_text(
        "from my_variants import fuzz_variants  # noqa: F401\n"
        "def cases(profile):\n    return []\n")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(EXAMPLES), str(tmp_path)]))
    proc = subprocess.run(  # the whole matrix directory: pytest's placeholder for no case
        [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",  # is none
         "--backend", "cpu-eager", "--report-dir", str(tmp_path / "report"),
         "--reference-cache", "none", "--fuzz-examples", "1", "--seed", "1", "--matrix",
         "custom", "--cases-module", "fuzz_only"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = load_results(tmp_path / "report" / "results.json")
    assert len(results.records) == 1 and results.complete, proc.stdout[-3000:]
    assert "NOTSET" not in json.dumps(results.selection)
