"""`flexconf repro`: the written script reproduces a run's label and numbers on its backend,
runs where only torch is importable (the suite is embedded), and carries custom variants."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cases.model import Case, Shape, Variant
from conformance.backends.base import WorkerSlot
from conformance.backends.registry import load_backend
from conformance.cli import main
from conformance.executor import Executor, Settings
from conformance.run_info import KEEPS_PYTHONPATH
from conformance.reference_cache import ReferenceCache
from records.results import Label, Record, RunResults, load_results, write_results

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "custom_variants"
TINY = Shape(1, 2, 2, 64, 64, 16)
BROKEN = Case(Variant("causal"), TINY)  # tests.fault_backends.WrongNumbers doubles a row
WRONG = "tests.fault_backends:WrongNumbers"
SEED = 5


def write_run(path: Path, records, backend: str, requested: str, seed: int = SEED,
              **more_options) -> Path:
    options = {"backend": backend, "backend_requested": requested, "profile": "full", "seed": seed,
               **more_options}
    write_results(RunResults({"backend": backend, "host": "test"}, options, tuple(records),
                             "0.1.0"), path)
    return path


def run_script(script: Path, cwd: Path, pythonpath: str | None,
               **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_CURRENT_TEST")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else proc.stderr[-2000:]


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory) -> Path:
    executor = Executor(load_backend(WRONG), WRONG, WorkerSlot(0, 1), Settings(seed=SEED),
                        ReferenceCache(None, 0), worker="test")
    try:
        record = executor.execute(BROKEN)
    finally:
        executor.close()
    assert record.label is Label.MISMATCH, record.message
    return write_run(tmp_path_factory.mktemp("run") / "results.json", [record],
                     "test-wrong-numbers", WRONG)


def test_script_reproduces_the_mismatch_and_its_numbers(broken_run, tmp_path, capsys):
    script = tmp_path / "new dir" / "repro.py"  # -o into a directory not made yet
    assert main(["repro", str(broken_run), BROKEN.id, "-o", str(script)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {script}" in out
    # the module:object backend is not embedded: the printed command says where it is
    assert out.rstrip().endswith(f"run it with: PYTHONPATH={REPO}{KEEPS_PYTHONPATH} python "
                                 f"'{script}'")
    text = script.read_text()
    assert f"BACKEND = {WRONG!r}" in text and f"SEED = {SEED}" in text
    proc = run_script(script, tmp_path, str(REPO))  # the module:object backend is imported
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert last_line(proc) == "label: MISMATCH"
    # the backend warmed up first, as a run's child: the compile seconds are the case's own
    starts = [line.split()[0] for line in proc.stdout.splitlines()]
    assert starts.index("warm-up") < starts.index("seconds"), proc.stdout
    recorded = json.loads(broken_run.read_text())["records"][0]["metrics"]
    metrics = json.loads(next(line[len("metrics   "):] for line in proc.stdout.splitlines()
                              if line.startswith("metrics   ")))
    assert metrics["failed_rules"] == recorded["failed_rules"]
    assert metrics["worst_place"] == recorded["worst_place"]  # the same row of the same head
    assert metrics["error_ratio"] == pytest.approx(recorded["error_ratio"], rel=1e-2)


def test_script_on_a_correct_backend_passes_with_only_torch_importable(broken_run, tmp_path):
    script = tmp_path / "repro.py"
    assert main(["repro", str(broken_run), BROKEN.id, "-o", str(script),
                 "--backend", "cpu-eager"]) == 0
    proc = run_script(script, tmp_path, None)  # no suite on the path: all of it is embedded
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert last_line(proc) == "label: PASS"
    assert "backend   cpu-eager (cpu-eager)" in proc.stdout
    # the MISMATCH was the run's backend's, not this one's (it read as cpu-eager's)
    assert f"recorded  MISMATCH on {WRONG}, the run's backend: " in proc.stdout
    assert f"recorded   MISMATCH on {WRONG}, the run's backend: " in script.read_text()


def test_script_makes_as_many_timed_calls_as_the_run(tmp_path):
    """A failure of the fourth timed call, seen by a run of --timed-runs 4, is reproduced: the
    script makes the run's number of calls, not the default's 3."""
    spec = "tests.fault_backends:WrongFifthCall"
    case = Case(Variant("causal"), TINY)
    executor = Executor(load_backend(spec), spec, WorkerSlot(0, 1),
                        Settings(seed=SEED, timed_runs=4), ReferenceCache(None, 0), worker="test")
    try:
        record = executor.execute(case)
    finally:
        executor.close()
    assert record.label is Label.MISMATCH, record.message
    assert "call 5 of 5 failed" in record.message
    results = write_run(tmp_path / "results.json", [record], "test-wrong-fifth-call", spec,
                        timed_runs=4)
    script = tmp_path / "repro.py"
    assert main(["repro", str(results), case.id, "-o", str(script)]) == 0
    assert "RUNS = 4  #" in script.read_text()
    proc = run_script(script, tmp_path, str(REPO))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert last_line(proc) == "label: MISMATCH"


def test_script_starts_with_no_process_wide_cache_as_a_cold_run_does(tmp_path):
    """The script applied only child_env: on neuron its compile used, and filled, the host's
    /tmp/neff_cache, and a second run of it was a cache hit called cold."""
    spec = "tests.contract_fault_backends:ShowsItsCacheEnv"
    case = Case(Variant("causal"), TINY)
    results = write_run(tmp_path / "results.json", [Record(case.id, Label.PASS, case.to_json())],
                        "test-shows-its-cache-env", spec)
    script = tmp_path / "repro.py"
    assert main(["repro", str(results), case.id, "-o", str(script)]) == 0
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    proc = run_script(script, tmp_path, str(REPO), TMPDIR=str(temporary))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("process cache "))
    assert line.startswith(f"process cache off; artefacts {temporary}/flexconf-repro-")
    # its working directory (the output, the compile caches) went with it: every run of a
    # script left one behind (torch's own inductor cache directory may be there)
    assert not list(temporary.glob("flexconf-*"))


def test_the_scripts_working_directory_keeps_only_a_failed_cases_artefacts(tmp_path, capsys):
    from conformance.repro_runtime import _remove_workdir

    for passed in (True, False):
        workdir = tmp_path / f"flexconf-repro-{passed}"
        (workdir / "compile-cache" / "graph").mkdir(parents=True)
        (workdir / "output.pt").write_text("tensors")
        (workdir / "artifacts" / "neff").mkdir(parents=True)
        (workdir / "artifacts" / "neff" / "model.neff").write_text("a compiled graph")
        _remove_workdir(workdir, keep_artifacts=not passed)
        if passed:
            assert not workdir.exists()
        else:
            assert [p.name for p in workdir.iterdir()] == ["artifacts"]
            assert (workdir / "artifacts" / "neff" / "model.neff").exists()
            assert capsys.readouterr().out == (f"artefacts {workdir / 'artifacts'} (kept: the "
                                               "case did not pass)\n")
    empty = tmp_path / "flexconf-repro-empty"
    (empty / "artifacts").mkdir(parents=True)
    _remove_workdir(empty, keep_artifacts=True)  # no artefact to keep: nothing is left
    assert not empty.exists()


def test_script_embeds_the_case_module_of_a_custom_variant(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from cases.custom import import_case_modules

    (my_variants,) = import_case_modules(["my_variants"])
    case = Case(my_variants.global_window(8, 3), Shape(1, 2, 2, 48, 48, 16))
    results = write_run(tmp_path / "results.json",
                        [Record(case.id, Label.PASS, case.to_json())], "cpu-eager", "cpu-eager")
    script = tmp_path / "repro.py"
    assert main(["repro", str(results), case.id, "-o", str(script),
                 "--cases-module", "my_variants"]) == 0
    assert "CASE_MODULES = ['my_variants']" in script.read_text()
    proc = run_script(script, tmp_path, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert last_line(proc) == "label: PASS"


def test_unknown_case_is_a_one_line_error(broken_run, tmp_path, capsys):
    assert main(["repro", str(broken_run), "causal/nope", "-o", str(tmp_path / "r.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("flexconf repro: error: case 'causal/nope' is not in ")
    assert "\n" not in err and not (tmp_path / "r.py").exists()


def test_a_cases_module_that_cannot_be_found_is_refused_for_a_built_in_case_too(tmp_path,
                                                                               capsys):
    """It wrote the script and exited 0 where the case's variant is the suite's own, while
    pytest, list and shrink refuse the same --cases-module (an outside audit)."""
    out = tmp_path / "r.py"
    assert main(["repro", str(recorded_run(tmp_path)), BROKEN.id, "-o", str(out),
                 "--cases-module", "nope_mod"]) == 2
    assert capsys.readouterr().err.strip() == ("flexconf repro: error: case module 'nope_mod' "
                                               "cannot be found; install it or put its "
                                               "directory on PYTHONPATH")
    assert not out.exists()


def recorded_run(tmp_path: Path) -> Path:
    """A run of BROKEN on WRONG as results.json records it (no execution needed)."""
    return write_run(tmp_path / "results.json",
                     [Record(BROKEN.id, Label.MISMATCH, BROKEN.to_json())],
                     "test-wrong-numbers", WRONG)


def test_values_of_a_hostile_results_file_never_become_code_of_the_script(tmp_path):
    """A case id, torch version or git revision holding triple quotes closed the script's
    docstring, so `python repro.py --help` ran the code after them (an outside trial); a case
    parameter of true or null was no Python (NameError)."""
    import ast

    payload = '"""; import os; os.system("touch PWNED"); """'
    case = {**BROKEN.to_json(), "extra": [True, None, float("inf"), payload]}
    hostile = f"fuzz/x{payload}"
    path = tmp_path / "results.json"
    write_results(RunResults({"backend": "cpu-eager", "host": "h\n" + payload,
                              "torch": "2.13" + payload, "git_revision": payload},
                             {"backend": "cpu-eager", "profile": "full", "seed": SEED},
                             (Record(hostile, Label.MISMATCH, case, message=payload),), "0.1.0"),
                  path)
    script = tmp_path / "repro.py"
    assert main(["repro", str(path), hostile, "-o", str(script)]) == 0
    tree = ast.parse(script.read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "system"]
    assert not calls  # the payload is text of the docstring and of string literals only
    assert "os.system(" in ast.get_docstring(tree)
    assigned = {node.targets[0].id: node.value for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    recorded = load_results(path).records[0].case  # as the file holds it
    assert json.loads(ast.literal_eval(assigned["CASE"].args[0])) == recorded
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (tmp_path / "PWNED").exists()


def test_an_output_that_is_not_a_repro_script_is_never_overwritten(tmp_path, capsys):
    """`repro RESULTS ID -o RESULTS` replaced the results with the script, and a -o through a
    symlink chmod-ed its target 0755 (an outside trial)."""
    results = recorded_run(tmp_path)
    before = results.read_bytes()
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    mine.chmod(0o600)
    link = tmp_path / "link.py"
    link.symlink_to(mine)
    for output in (results, mine, link):
        assert main(["repro", str(results), BROKEN.id, "-o", str(output)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"flexconf repro: error: -o {output}: it exists and is not a script flexconf repro "
            "wrote (it would be overwritten); give another path, e.g. -o repro.py")
    assert results.read_bytes() == before and mine.read_text() == "mine"
    assert mine.stat().st_mode & 0o777 == 0o600
    script = tmp_path / "repro.py"
    assert main(["repro", str(results), BROKEN.id, "-o", str(script)]) == 0
    assert main(["repro", str(results), BROKEN.id, "-o", str(script)]) == 0  # its own: again


@pytest.mark.parametrize("backend, words", [
    ("nosuch", "unknown backend 'nosuch'; name the backend the script runs on: cpu-eager, "),
    ("auto", "unknown backend 'auto'; "),
    ("nosuch_pkg.backends:Mine", "backend 'nosuch_pkg.backends:Mine': cannot import "
                                 "'nosuch_pkg.backends' here, so the script would lack the suite "
                                 "modules it needs; put its directory on PYTHONPATH"),
])
def test_a_backend_the_script_could_not_load_is_refused_before_writing(tmp_path, capsys,
                                                                        backend, words):
    """An unknown name wrote a script that died of BackendError; a module:object not
    importable here (tests/ off the path) wrote one without the suite modules it needs."""
    script = tmp_path / "r.py"
    assert main(["repro", str(recorded_run(tmp_path)), BROKEN.id, "-o", str(script),
                 "--backend", backend]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flexconf repro: error: {words}") and "\n" not in err, err
    assert not script.exists()


def test_a_plugin_not_importable_here_is_named_with_where_the_run_found_it(tmp_path, capsys):
    path = write_run(tmp_path / "results.json", [Record(BROKEN.id, Label.MISMATCH,
                                                        BROKEN.to_json())],
                     "mine", "nosuch_pkg.backends:Mine")
    data = json.loads(path.read_text())
    data["options"]["backend_pythonpath"] = "/src/plugins"
    path.write_text(json.dumps(data))
    assert main(["repro", str(path), BROKEN.id, "-o", str(tmp_path / "r.py")]) == 2
    assert ("put its directory on PYTHONPATH (PYTHONPATH=/src/plugins, where the run imported it "
            "from) and run flexconf repro again") in capsys.readouterr().err


def test_a_script_whose_backend_cannot_be_loaded_where_it_runs_says_so_in_one_line(tmp_path):
    script = tmp_path / "repro.py"
    assert main(["repro", str(recorded_run(tmp_path)), BROKEN.id, "-o", str(script)]) == 0
    proc = run_script(script, tmp_path, None)  # tests/ is not importable there
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"repro: error: backend {WRONG!r}: cannot import 'tests.fault_backends' "
        "(ModuleNotFoundError: No module named 'tests'); install it or fix PYTHONPATH"]


@pytest.mark.parametrize("change, problem", [
    ({"variant": None}, "its case: variant is null (a JSON null); give a string"),
    ({"shape": {**BROKEN.to_json()["shape"], "B": -1}},
     "its case is not a valid case spec (shape B=-1 must be >= 1); write the fields of "
     "Case.to_json (docs/cases.md)"),
    ({"dtype": "fp8"}, "its case is not a valid case spec (unknown dtype 'fp8'; use one of bf16, "
                       "fp16, fp32); write the fields of Case.to_json (docs/cases.md)"),
    ({"variant": "sliding_window", "params": {"w": -5}, "id": None},
     "its case: variant 'sliding_window': its w is -5; give a whole number from 1 to "
     "2147483647 (the window's length in keys)"),
])
def test_a_record_whose_case_spec_is_broken_is_refused_before_writing(tmp_path, capsys, change,
                                                                      problem):
    """A record without a variant gave `error: variant`; one of batch -1 or dtype fp8 gave a
    script that failed with a traceback (an outside audit)."""
    path = tmp_path / "results.json"
    case = {k: v for k, v in {**BROKEN.to_json(), **change}.items() if v is not None
            or k != "id"}  # no id: a spec's fields make it
    write_results(RunResults({"backend": "cpu-eager"},
                             {"backend": "cpu-eager", "profile": "full", "seed": SEED},
                             (Record(BROKEN.id, Label.MISMATCH, case),), "0.1.0"), path)
    assert main(["repro", str(path), BROKEN.id, "-o", str(tmp_path / "repro.py")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf repro: error: the record of {BROKEN.id!r} in {path}: {problem}"]
    assert not (tmp_path / "repro.py").exists()


def test_the_scripts_warm_up_is_a_childs_its_error_said_its_leak_set_back(capsys):
    """conformance.child.warm_up_backend, shared with the child: an error is printed and the
    case still runs; a FatalSetupError makes the case the harness's; a setting the warm-up
    left changed is set back."""
    import torch

    from cases import torch_state
    from conformance.backends.base import FatalSetupError
    from conformance.repro_runtime import _warm_up

    class Fails:
        name = "test-fails"

        def warm_up(self):
            raise RuntimeError("injected warm-up failure")

    class Fatal(Fails):
        def warm_up(self):
            raise FatalSetupError("no synchronize function")

    class Leaks(Fails):
        def warm_up(self):
            torch.set_default_dtype(torch.float64)

    pristine = torch_state.snapshot()
    try:
        assert _warm_up(Fails(), pristine) is None
        assert "; it failed: RuntimeError: injected warm-up failure" in capsys.readouterr().out
        assert _warm_up(Fatal(), pristine).startswith("the suite cannot run test-fails here: ")
        assert _warm_up(Leaks(), pristine) is None
        assert torch.get_default_dtype() == torch.float32
        assert "changed torch's global settings" in capsys.readouterr().out
    finally:
        torch_state.restore(pristine)  # whatever failed above, later tests run under defaults
