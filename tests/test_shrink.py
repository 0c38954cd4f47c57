"""`flexconf shrink`: bisection over batch, heads (GQA kept valid), lengths (with length-like
parameters scaled) and head dims finds the known smallest case with the same label, with a
fake executor and end to end on a backend that is wrong only for Sq >= 65 on head 1."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cases import composed
from cases.model import Case, Shape, Variant
from conformance.cli import main
from conformance.shrink import case_from_argument, scale_lengths, shrink
from records.results import Label, Record, load_results, write_results
from conformance.run_info import KEEPS_PYTHONPATH
from tests.shape_fault_backends import MIN_FAILING_SQ

START = Case(Variant("sliding_window", (("w", 32),)), Shape(2, 4, 2, 128, 128, 32))
#: B1, two query heads sharing one kv head (GQA kept), Sq = 65, D = 8; w scaled 32 * 65/128.
SMALLEST = "sliding_window-w16/b1-h2x1-s65x65-d8/bf16/fwd"
BACKEND = "tests.shape_fault_backends:WrongOnLongHead1"
REPO = Path(__file__).resolve().parents[1]


def fake(rule):
    calls: list[Case] = []

    def execute(case: Case) -> Record:
        calls.append(case)
        return Record(case.id, rule(case), case.to_json())

    return execute, calls


def wrong_on_long_head_1(case: Case) -> Label:
    s = case.shape
    return Label.MISMATCH if s.Sq >= MIN_FAILING_SQ and s.Hq >= 2 else Label.PASS


def test_bisection_finds_the_known_smallest_case_in_few_executions():
    execute, calls = fake(wrong_on_long_head_1)
    result = shrink(START, execute)
    assert result.smallest.case_id == SMALLEST and result.smallest.label is Label.MISMATCH
    assert len(calls) == len(result.tried) == len({c.id for c in calls}) <= 25
    assert all(c.shape.Hq % c.shape.Hkv == 0 for c in calls)


def test_the_label_is_kept_not_any_failure():
    def rule(case: Case) -> Label:  # a timeout above 99 keys hides a mismatch on head 1
        if case.shape.Skv >= 100:
            return Label.COMPILE_TIMEOUT
        return Label.MISMATCH if case.shape.Hq >= 2 else Label.PASS

    execute, _ = fake(rule)
    result = shrink(START, execute)
    assert result.original.label is Label.COMPILE_TIMEOUT
    assert result.smallest.case_id == "sliding_window-w25/b1-h1x1-s100x100-d8/bf16/fwd"


def test_unequal_lengths_shrink_separately_and_the_budget_keeps_the_best_so_far():
    case = Case(Variant("full"), Shape(1, 2, 2, 80, 300, 16))
    execute, calls = fake(wrong_on_long_head_1)
    assert shrink(case, execute).smallest.case_id == "full/b1-h2x2-s65x1-d8/bf16/fwd"
    execute, calls = fake(wrong_on_long_head_1)
    limited = shrink(case, execute, max_cases=4)
    assert limited.out_of_budget and len(calls) == 4
    assert limited.smallest.label is Label.MISMATCH and limited.smallest.case_id != case.id


def test_a_passing_case_is_refused():
    execute, _ = fake(lambda case: Label.PASS)
    with pytest.raises(ValueError, match=r"is PASS on this backend; shrink takes a failing case"):
        shrink(START, execute)


def test_length_like_parameters_scale_and_others_do_not():
    assert scale_lengths(Variant("prefix_lm", (("p", 256),)), 0.5).params == (("p", 128),)
    assert scale_lengths(Variant("softcap", (("cap", 50.0),)), 0.5).params == (("cap", 50.0),)
    v = composed.variant_from_token("composed-and.causal0-and.not.win64-dil3-cap20")
    assert scale_lengths(v, 0.25).token == "composed-and.causal0-and.not.win16-dil3-cap20"


def test_a_case_module_declares_its_length_parameters(monkeypatch):
    from pathlib import Path

    from cases.custom import import_case_modules

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"
                                    / "custom_variants"))
    (my_variants,) = import_case_modules(["my_variants"])
    scaled = scale_lengths(my_variants.dilated_sliding_window(32, 4), 0.5)
    assert scaled.params == (("w", 16), ("dil", 4))


def test_case_ids_resolve_from_the_catalog_composed_tokens_and_spec_files(tmp_path):
    core = "causal/b1-h8x8-s1024x1024-d128/bf16/fwd"
    assert case_from_argument(core).id == core
    fuzzed = "composed-or.win4-prefix3-alibi8/b2-h4x2-s67x129-d24/fp16/fwd+lse/x4"
    assert case_from_argument(fuzzed).id == fuzzed
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": [START.to_json()]}))
    assert case_from_argument(str(spec)) == START
    with pytest.raises(ValueError, match=r"no case with id 'causal/b9'"):
        case_from_argument("causal/b9")


@pytest.mark.slow
def test_flexconf_shrink_end_to_end_on_a_broken_backend(tmp_path, capsys):
    spec = tmp_path / "start.json"
    spec.write_text(json.dumps(START.to_json()))
    out = tmp_path / "shrink"
    assert main(["shrink", "--backend", BACKEND, str(spec), "--out", str(out),
                 "--reference-cache", "none", "--seed", "2"]) == 0
    printed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert printed["original"] == f"{START.id}: MISMATCH"
    assert printed["smallest"] == f"{SMALLEST}: MISMATCH"
    assert printed["spec"] == str(out / "smallest.json")
    # the backend is a module:object of this checkout: both lines name where it was found
    env = f"PYTHONPATH={REPO}{KEEPS_PYTHONPATH} "
    assert printed["rerun"] == (f"{env}pytest conformance/ --backend {BACKEND} --case-file "
                                f"{out / 'smallest.json'} --seed 2 --report-dir {out / 'rerun'}")
    assert printed["repro"] == f"{env}flexconf repro {out / 'results.json'} {SMALLEST} -o repro.py"
    results = load_results(out / "results.json")
    assert results.options["seed"] == 2 and results.by_id()[SMALLEST].label is Label.MISMATCH
    assert results.options["backend_pythonpath"] == str(REPO)
    assert json.loads((out / "smallest.json").read_text())["cases"][0]["id"] == SMALLEST
    # the repro line as printed, from another directory where tests.* is not importable
    # without that PYTHONPATH (flexconf is conformance.cli)
    run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run_printed(printed["repro"], tmp_path, run_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "repro.py").is_file()


def test_a_bad_max_cases_or_out_is_one_line_before_any_case_runs(tmp_path, capsys,
                                                                  monkeypatch):
    """--max-cases -5 ran and said it stopped at -5; an --out that is a file failed with
    [Errno 17] after every case had run."""
    def no_executor(*_args, **_kwargs):
        raise AssertionError("a case ran before the arguments were checked")

    monkeypatch.setattr("conformance.executor.Executor", no_executor)
    afile = tmp_path / "afile"
    afile.write_text("")
    core = "causal/b1-h8x8-s1024x1024-d128/bf16/fwd"
    for extra, line in (
            (["--max-cases", "-5", "--out", str(tmp_path / "out")],
             "--max-cases -5 is below 1; give how many executions to allow at most, e.g. "
             "--max-cases 60"),
            (["--out", str(afile)],
             f"--out {afile}: it is a file, not a directory; give a directory this user can "
             "write, e.g. --out reports/shrink")):
        assert main(["shrink", "--backend", "cpu-eager", core, *extra]) == 2
        assert capsys.readouterr().err.splitlines() == [f"flexconf shrink: error: {line}"]
    assert afile.read_text() == ""


def test_an_out_holding_a_runs_results_is_refused_as_merge_refuses_it(tmp_path, capsys,
                                                                     monkeypatch):
    """--out of a finished run's report directory ran every try and replaced the run's
    results.json, leaving its index.html and summary.md contradicting it (report -o and
    merge -o refuse it). An earlier shrink's --out is still reused."""
    from tests.test_merge import shard_run

    def no_executor(*_args, **_kwargs):
        raise AssertionError("a case ran before the arguments were checked")

    monkeypatch.setattr("conformance.executor.Executor", no_executor)
    run_dir = tmp_path / "run"
    (run_dir / "records").mkdir(parents=True)
    (run_dir / "records" / "run.json").write_text("{}")
    write_results(shard_run(1), run_dir / "results.json")
    (run_dir / "index.html").write_text("<p>the run</p>")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    core = "causal/b1-h8x8-s1024x1024-d128/bf16/fwd"
    assert main(["shrink", "--backend", "cpu-eager", core, "--out", str(run_dir)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf shrink: error: --out {run_dir} (its results.json): it lies in the report "
        f"directory of a run ({run_dir}), where it would pass for that run's results; give "
        "shrink a directory of its own, e.g. --out reports/shrink"]
    (run_dir / "records" / "run.json").unlink()  # a run's results.json, wherever it lies
    assert main(["shrink", "--backend", "cpu-eager", core, "--out", str(run_dir)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf shrink: error: --out {run_dir} (its results.json): it is the results.json "
        "of a run, not of a shrink, which shrink would overwrite; give shrink a directory of "
        "its own, e.g. --out reports/shrink"]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before
    earlier = tmp_path / "shrink"  # an earlier shrink's results: replaced, as before
    shrunk = shard_run(1)
    write_results(replace(shrunk, options={**shrunk.options, "profile": "shrink"}),
                  earlier / "results.json")
    with pytest.raises(AssertionError, match="a case ran"):
        main(["shrink", "--backend", "cpu-eager", core, "--out", str(earlier)])
    (earlier / "smallest.json").write_text('{"cases": [{"variant": "causal"}]}')  # its own
    with pytest.raises(AssertionError, match="a case ran"):
        main(["shrink", "--backend", "cpu-eager", core, "--out", str(earlier)])
    (earlier / "smallest.json").write_text("my spec notes\n")  # not shrink's: kept (a review)
    assert main(["shrink", "--backend", "cpu-eager", core, "--out", str(earlier)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf shrink: error: --out {earlier}: its smallest.json exists and is not a spec "
        "shrink wrote (it would be overwritten); give shrink a directory of its own, e.g. --out "
        "reports/shrink"]
    (earlier / "results.json").write_text("my notes\n")  # not results: never overwritten
    assert main(["shrink", "--backend", "cpu-eager", core, "--out", str(earlier)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf shrink: error: --out {earlier} (its results.json): it exists and is not a "
        "results file shrink wrote, which it would overwrite; give shrink a directory of its "
        "own, e.g. --out reports/shrink"]


@pytest.mark.slow
def test_shrink_of_a_case_module_variant_loads_the_module_and_prints_commands_that_run(tmp_path):
    """A case module's variant reaches the child (before, every try was a HARNESS_ERROR
    'unknown variant' and shrink said so with exit 0), and the printed rerun line, pasted in
    another directory, loads the module and the backend again from where shrink found them."""
    mods = tmp_path / "mods"
    mods.mkdir()
    shutil.copy(REPO / "examples" / "custom_variants" / "my_variants.py", mods / "my_variants.py")
    start = "dilated_sliding_window-w64-dil4/b1-h8x8-s256x256-d128/bf16/fwd"  # its smoke case
    out = tmp_path / "shrink"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(mods), str(REPO)])
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "shrink", "--backend",
         "tests.shape_fault_backends:WrongOnLongHead1", start, "--cases-module", "my_variants",
         "--max-cases", "3", "--out", str(out), "--reference-cache", "none"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert printed["original"] == f"{start}: MISMATCH"
    assert printed["smallest"].endswith(": MISMATCH")
    assert "HARNESS_ERROR" not in (out / "results.json").read_text()
    words = shlex.split(printed["rerun"])
    assert words[0] == f"PYTHONPATH={REPO}{os.pathsep}{mods}{KEEPS_PYTHONPATH}"
    assert words[1:3] == ["pytest", f"{REPO}/conformance/"]
    assert "--cases-module" in words and words[words.index("--cases-module") + 1] == "my_variants"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rerun_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    rerun = run_printed(printed["rerun"] + " -p no:cacheprovider", elsewhere, rerun_env)
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    again = load_results(out / "rerun" / "results.json")
    assert [r.label for r in again.records] == [Label.MISMATCH]


def test_shrink_refuses_a_harness_error_of_the_case_itself():
    def broken(case):
        return Record(case.id, Label.HARNESS_ERROR, message="setup: unknown variant 'x'")

    with pytest.raises(ValueError, match=r"is HARNESS_ERROR \(setup: unknown variant 'x'\); "
                                         r"fix the case"):
        shrink(START, broken)


def test_shrink_takes_the_ids_it_and_the_runs_print_and_one_case_per_spec(tmp_path):
    """It refused its own smallest case's id (a catalog variant at a shape of no matrix), a
    fuzzed record's id (fuzz/...), and a --case-file run's ids; a spec file of five cases
    shrank the first without a word; a saved fuzz failure ran with seed 0, not its own."""
    from conformance.shrink import case_from_argument, spec_seed

    shrunk = case_from_argument("full/b1-h1x1-s129x129-d8/bf16/fwd")
    assert (shrunk.variant, shrunk.shape, shrunk.dtype) == (Variant("full"),
                                                            Shape(1, 1, 1, 129, 129, 8), "bf16")
    window = case_from_argument("sliding_window-w17/b2-h8x2-s200x200-d80/fp16/fwd+lse/x4")
    assert window.variant.param("w") == 17 and window.input_scale == 4
    assert window.mode == "fwd+lse" and window.shape.Hkv == 2
    fuzzed = case_from_argument("fuzz/composed/b1-h8x2-s16x16-d16/bf16/fwd")
    assert fuzzed.variant.name == composed.NAME and fuzzed.shape.Hq == 8
    with pytest.raises(ValueError, match=r"^no case with id 'nosuch-v1/b1-h1x1-s8x8-d8/bf16/fwd':"
                                         r" its variant part 'nosuch-v1' is none of the matrices'"):
        case_from_argument("nosuch-v1/b1-h1x1-s8x8-d8/bf16/fwd")
    # a known variant in an id of the wrong length: the id's form, not the variant, is wrong
    with pytest.raises(ValueError, match=r"^no case with id 'causal/b1-h8x8-s128x128-d128/bf16':"
                                         r" an id has 4 or 5 parts, VARIANT/SHAPE/DTYPE/MODE"):
        case_from_argument("causal/b1-h8x8-s128x128-d128/bf16")
    # by id, a parameter out of the catalog's range ran (w0: PASS), while its spec file was
    # refused (an outside audit); a shape beyond torch's sizes overflowed inside the case
    with pytest.raises(ValueError, match=r"^case 'sliding_window-w0/b1-h8x8-s128x128-d128/bf16/"
                                         r"fwd': variant 'sliding_window': its w is 0; give a "
                                         r"whole number from 1 to 2147483647"):
        case_from_argument("sliding_window-w0/b1-h8x8-s128x128-d128/bf16/fwd")
    with pytest.raises(ValueError, match=r"^shape D=100000000000000000000 is above 2147483647"):
        case_from_argument("full/b1-h1x1-s8x8-d100000000000000000000/bf16/fwd")
    specs = tmp_path / "five.json"
    specs.write_text(json.dumps([Case(Variant("full"), Shape(1, 1, 1, 8 * n, 8 * n, 8)).to_json()
                                 for n in range(1, 6)]))
    # a spec file given as shrink's argument is named as such, not as --case-file (an audit)
    with pytest.raises(ValueError, match=r"^case spec file .*missing.json.*: no such file"):
        case_from_argument(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=r"five.json holds 5 cases; shrink takes one"):
        case_from_argument(str(specs))
    saved = tmp_path / "fuzz.json"
    saved.write_text(json.dumps({"cases": [shrunk.to_json()], "fuzz": {"seed": 7}}))
    assert spec_seed(str(saved)) == 7 and spec_seed(str(specs)) is None
    assert spec_seed("full/b1-h1x1-s129x129-d8/bf16/fwd") is None


def run_printed(line: str, cwd, env: dict) -> subprocess.CompletedProcess:
    """A command line the suite printed, pasted into a POSIX shell: bash, with this Python's
    bin directory first on PATH (its pytest, flexconf and python)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(["bash", "-c", line], cwd=cwd, env={**env, "PATH": path},
                          capture_output=True, text=True, timeout=600)
