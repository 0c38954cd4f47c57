"""--keep-outputs: a failing case's tensors land in <report-dir>/outputs/ in the one format that
reference.load_case_outputs reads, with the inputs the backend got and the output it returned;
the cap skips a case with a note; a repro script saves the same format and compares with it."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cases.inputs import make_inputs
from cases.model import Case, Shape, Variant
from conformance.backends.base import WorkerSlot
from conformance.backends.registry import load_backend
from conformance.cli import main
from conformance.executor import Executor, Settings
from conformance.kept_outputs import KeepPolicy, outputs_path
from conformance.reference_cache import ReferenceCache
from reference import load_case_outputs
from reference.golden import Reference
from reference.outputs import CaseOutputs, save_case_outputs
from records.results import Label, load_results
from tests.test_plugin_runs import REPO, clean_env, pytest_args
from tests.test_repro import run_script, write_run

TINY = Shape(1, 2, 2, 64, 64, 16)
BROKEN = Case(Variant("causal"), TINY)  # tests.fault_backends.WrongNumbers doubles its last row
HEALTHY = Case(Variant("full"), TINY)
WRONG = "tests.fault_backends:WrongNumbers"


@pytest.mark.slow
def test_a_failed_case_is_kept_and_loads_with_what_the_backend_returned(tmp_path):
    proc = subprocess.run(pytest_args(tmp_path, WRONG, [HEALTHY, BROKEN], "--seed", "3"),
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = tmp_path / "report"
    kept = outputs_path(report, BROKEN.id)
    assert sorted(p.name for p in (report / "outputs").iterdir()) == [kept.name]  # failed only
    record = load_results(report / "results.json").by_id()[BROKEN.id]
    assert record.label is Label.MISMATCH and record.message.endswith(f"outputs kept: {kept}")
    assert f"outputs: 1 file kept in {report / 'outputs'}" in proc.stdout
    outputs = load_case_outputs(kept)
    assert outputs.case == BROKEN and outputs.seed == 3 and outputs.label == "MISMATCH"
    inputs = make_inputs(BROKEN, 3)
    assert torch.equal(outputs.inputs.q, inputs.q) and torch.equal(outputs.inputs.v, inputs.v)
    observed, golden = outputs.observed.out.double(), outputs.golden.out
    assert golden.dtype == torch.float64 and outputs.baseline.out.dtype == torch.bfloat16
    assert torch.allclose(observed[0, 0, -1], 2 * golden[0, 0, -1], rtol=0.02, atol=0.02)
    assert torch.allclose(observed[0, 0, :-1], golden[0, 0, :-1], atol=0.02)  # only that row


def test_the_cap_skips_a_large_case_with_a_note_and_keeps_a_small_one(tmp_path):
    large = Case(Variant("full"), Shape(1, 2, 2, 256, 256, 16))
    policy = KeepPolicy("all", 100 << 10, str(tmp_path))  # ~40 KiB fits, ~160 KiB does not
    executor = Executor(load_backend("cpu-eager"), "cpu-eager", WorkerSlot(0, 1),
                        Settings(keep=policy), ReferenceCache(None, 0), worker="test")
    try:
        small_record, large_record = executor.execute(HEALTHY), executor.execute(large)
    finally:
        executor.close()
    assert small_record.label is large_record.label is Label.PASS
    assert small_record.message == "" and outputs_path(tmp_path, HEALTHY.id).exists()
    assert not outputs_path(tmp_path, large.id).exists()
    assert large_record.message.startswith("outputs not kept: 1")  # one line, with the size
    assert " KiB is over --keep-outputs-cap (100 KiB)" in large_record.message
    assert "\n" not in large_record.message


def test_the_format_round_trips_gradients_and_refuses_other_files(tmp_path):
    case = Case(Variant("full"), Shape(1, 1, 1, 8, 8, 8), "fp32", "fwd+bwd")
    inputs = make_inputs(case)
    grads = {name: torch.randn(1, 1, 8, 8) for name in ("dq", "dk", "dv")}
    ref = Reference(torch.randn(1, 1, 8, 8), None, grads)
    saved = CaseOutputs(case, 0, "PASS", "", inputs, torch.ones(1, 1, 8, 8), ref, ref, ref)
    loaded = load_case_outputs(save_case_outputs(saved, tmp_path / "x.pt"))
    assert loaded.case == case and torch.equal(loaded.golden.grads["dk"], grads["dk"])
    assert torch.equal(loaded.grad_out, saved.grad_out) and loaded.observed.lse is None
    torch.save({"out": torch.zeros(1)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match=r"foreign.pt: not a case outputs file \(no format"):
        load_case_outputs(tmp_path / "foreign.pt")


@pytest.mark.slow
def test_a_repro_script_saves_the_same_format_and_compares_with_the_kept_file(tmp_path, capsys):
    policy = KeepPolicy("failed", 1 << 30, str(tmp_path / "report"))
    executor = Executor(load_backend(WRONG), WRONG, WorkerSlot(0, 1), Settings(seed=2, keep=policy),
                        ReferenceCache(None, 0), worker="test")
    try:
        record = executor.execute(BROKEN)
    finally:
        executor.close()
    results = write_run(tmp_path / "report" / "results.json", [record], "test-wrong-numbers",
                        WRONG, seed=2)
    kept = outputs_path(tmp_path / "report", BROKEN.id)
    script = tmp_path / "repro.py"
    assert main(["repro", str(results), BROKEN.id, "-o", str(script)]) == 0
    assert f"--compare {kept}" in capsys.readouterr().out
    proc = subprocess.run([sys.executable, str(script), "--compare", str(kept), "--save-outputs",
                           str(tmp_path / "again.pt")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**clean_env(), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"compared  {kept}: the output is bit-identical to the run's" in proc.stdout
    again, first = load_case_outputs(tmp_path / "again.pt"), load_case_outputs(kept)
    assert again.label == "MISMATCH" and torch.equal(again.observed.out, first.observed.out)
    assert torch.equal(again.golden.out, first.golden.out)
    eager = tmp_path / "eager.py"
    assert main(["repro", str(results), BROKEN.id, "-o", str(eager), "--backend", "cpu-eager"]) == 0
    proc = run_script(eager, tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, str(eager), "--compare", str(kept)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert "the output differs from the run's: max |diff|" in proc.stdout
    assert "at (0, 0, 63, " in proc.stdout  # the doubled row: batch 0, head 0, the last query
    not_kept = tmp_path / "report" / "results.json"  # not outputs: one line, no traceback
    for wrong, says in ((tmp_path / "gone.pt", "no such file"),
                        (not_kept, "not a case outputs file")):
        proc = subprocess.run([sys.executable, str(eager), "--compare", str(wrong)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=clean_env())
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(
            f"repro: error: --compare {wrong}: {says}"), proc.stderr
