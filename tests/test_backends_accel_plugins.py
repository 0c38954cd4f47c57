"""flexconf backends and third-party plugins (entry point group flexattention_conformance.backends).

A plugin is "installed" here by putting a distribution record with an entry_points.txt on
sys.path, which is what pip leaves behind; the example package's source is put beside it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import pytest

from cases import variants
from cases.model import Case, Shape
from conformance import child
from conformance.protocol import CaseRequest, DoneEvent
from conformance.backends.registry import load_backend, registered
from conformance.cli import main
from conformance.cmd_backends import backend_statuses

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flexconf-example-backend"


def install_entry_points(site: Path, dist: str, version: str, entries: dict[str, str]) -> None:
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[flexattention_conformance.backends]"] + [f"{k} = {v}" for k, v in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def example_installed(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_entry_points(site, "flexconf-example-backend", "0.1.0",
                         {"example-eager": "flexconf_example_backend:ExampleEager"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return site


def _by_name():
    return {s.name: s for s in backend_statuses()}


def test_this_machine_lists_every_backend_with_an_honest_reason(capsys, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)  # a stand-in test's import
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("standin_neuron")])
    statuses = _by_name()
    assert statuses["cpu-eager"].available and statuses["cpu-inductor"].available
    assert statuses["cpu-eager"].origin == "built-in"
    for name in ("cuda-eager", "cuda-inductor"):
        if not statuses[name].available:
            assert "CUDA" in statuses[name].detail and "install" in statuses[name].detail \
                or "torch.cuda.is_available() is False" in statuses[name].detail
    assert not statuses["neuron"].available
    assert "torch-neuronx==" in statuses["neuron"].detail and "--extra-index-url" in statuses["neuron"].detail
    example = statuses["example-eager"]
    if example.origin.startswith("plugin "):  # installed here (as .ci/run does after the tests)
        assert example.available
    else:
        assert not example.available and example.origin == "example plugin"
        assert example.detail.startswith(
            "not installed; pip install ./examples/flexconf-example-backend")
    assert main(["backends"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("cpu-eager ")
    assert "--backend auto picks: " in table


def test_installed_plugin_is_listed_available_and_loads(example_installed, capsys):
    assert registered()["example-eager"] == "flexconf_example_backend:ExampleEager"
    status = _by_name()["example-eager"]
    assert status.available and status.origin == "plugin flexconf-example-backend 0.1.0"
    assert main(["backends", "--json"]) == 0
    listed = {b["name"]: b for b in json.loads(capsys.readouterr().out)["backends"]}
    assert listed["example-eager"]["available"] is True
    assert listed["cpu-eager"]["available"] is True


def test_the_example_plugin_computes_a_case(example_installed, tmp_path):
    backend = load_backend("example-eager")
    assert backend.environment()["plugin"] == "flexconf-example-backend"
    case = Case(variants.causal(), Shape(1, 4, 2, 64, 64, 16), "fp32")  # GQA as well
    events = []
    child.run_case(backend, CaseRequest(case.to_json(), str(tmp_path / "out.pt")), events.append)
    assert isinstance(events[-1], DoneEvent), events[-1]
    assert os.path.getsize(tmp_path / "out.pt") > 0


def test_a_broken_plugin_is_unavailable_and_hides_nothing(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_entry_points(site, "vendor-broken", "1.0", {"vendor-x": "vendor_x_missing:Backend"})
    monkeypatch.syspath_prepend(str(site))
    statuses = _by_name()
    broken = statuses["vendor-x"]
    assert not broken.available and broken.origin == "plugin vendor-broken 1.0"
    assert "cannot import 'vendor_x_missing'" in broken.detail
    assert statuses["cpu-eager"].available


@pytest.mark.parametrize("target, expected", [
    ("RaisesInInit", "backend 'tests.broken_plugins:RaisesInInit': constructing 'RaisesInInit' "
                     "raised RuntimeError: driver handle not found; fix the plugin"),
    ("RaisesInAvailability", "backend 'tests.broken_plugins:RaisesInAvailability' is not "
                             "available here: its availability() raised KeyError: 'NEURON_RT_ROOT'"),
    ("AvailabilityABool", "backend 'tests.broken_plugins:AvailabilityABool' is not available "
                          "here: its availability() returned bool True, not an Availability; "
                          "return Availability(True) or Availability(False, 'why') "
                          "(docs/backends.md)"),
    ("ChildEnvNotText", "backend 'tests.broken_plugins:ChildEnvNotText': its child_env() gives "
                        "'ZAP_CORES': 1 (str: int); environment variables are str to str; fix "
                        "the plugin"),
    ("RaisesInEnvironment", "backend 'tests.broken_plugins:RaisesInEnvironment': its "
                            "environment() raised FileNotFoundError: /opt/vendor/version.txt; "
                            "fix the plugin"),
    ("EnvironmentNotADict", "backend 'tests.broken_plugins:EnvironmentNotADict': its "
                            "environment() returned a str, not a dict; extend "
                            "super().environment() (docs/backends.md)"),
])
def test_a_plugin_that_raises_is_a_one_line_usage_error_not_an_internal_error(
        tmp_path, target, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
         "--backend", f"tests.broken_plugins:{target}", "--report-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR:")]
    assert errors == [f"ERROR: {expected}"]


def test_flexconf_backends_lists_raising_plugins_as_unavailable_with_the_first_line(
        tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_entry_points(site, "vendor-raising", "1.0", {
        "raises-in-init": "tests.broken_plugins:RaisesInInit",
        "raises-in-availability": "tests.broken_plugins:RaisesInAvailability",
        "availability-a-bool": "tests.broken_plugins:AvailabilityABool"})
    monkeypatch.syspath_prepend(str(site))
    statuses = _by_name()
    assert not statuses["raises-in-init"].available
    assert statuses["raises-in-init"].detail.endswith(
        "raised RuntimeError: driver handle not found; fix the plugin")
    assert statuses["raises-in-availability"].detail == \
        "its availability() raised KeyError: 'NEURON_RT_ROOT'"
    assert not statuses["availability-a-bool"].available  # it was a traceback, listing none
    assert statuses["cpu-eager"].available


def test_a_plugin_named_like_a_built_in_is_said_to_be_unused(tmp_path, monkeypatch, capsys):
    """It used to be ignored without a word in favour of the built-in."""
    from conformance.backends.registry import load_backend, shadowed
    from conformance.cli import main

    site = tmp_path / "site"
    install_entry_points(site, "vendor-clash", "1.0",
                         {"cpu-eager": "tests.broken_plugins:RaisesInEnvironment"})
    monkeypatch.syspath_prepend(str(site))
    assert type(load_backend("cpu-eager")).__name__ == "CpuEager"  # the built-in holds it
    assert shadowed() == [
        "plugin entry point cpu-eager = 'tests.broken_plugins:RaisesInEnvironment' is not used: "
        "'cpu-eager' is the built-in; rename it, or run it as --backend "
        "tests.broken_plugins:RaisesInEnvironment"]
    assert main(["backends"]) == 0
    assert f"note: {shadowed()[0]}" in capsys.readouterr().out.splitlines()


def test_the_env_hooks_are_checked_in_a_directory_of_their_own():
    """They were called with /nonexistent/...: a hook that makes its cache directory failed
    the run as another user, and as root left that directory behind."""
    from conformance.backends.cpu import CpuEager
    from conformance.backends.registry import check_env_hooks

    made = []

    class MakesItsCacheDirectory(CpuEager):
        def process_cache_env(self, cache_dir, cold):
            os.makedirs(cache_dir)
            made.append(cache_dir)
            return {"ZAP_CACHE": cache_dir}

    check_env_hooks(MakesItsCacheDirectory(), "zap:Backend", 2)
    assert made and not os.path.exists(made[0])


def test_a_plugin_whose_entry_point_has_another_name_is_rerun_and_reproduced_by_it(tmp_path):
    """A plugin registered as ``vendor-ep`` whose backend calls itself ``example-eager`` (an
    outside audit): the rerun command and ``flexconf repro`` named ``example-eager``, which
    no registry knows, and failed."""
    from records.results import load_results
    from reports.summary import rerun_command
    from tests.test_plugin_runs import CASES, clean_env, pytest_args, run

    site = tmp_path / "site"
    install_entry_points(site, "vendor-ep", "1.0",
                         {"vendor-ep": "flexconf_example_backend:ExampleEager"})
    env = clean_env(PYTHONPATH=os.pathsep.join([str(site), str(EXAMPLE)]))
    ran = run(pytest_args(tmp_path, "vendor-ep", CASES[:1]), env=env)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    results = load_results(tmp_path / "report" / "results.json")
    assert results.options["backend"] == "example-eager"
    assert " --backend vendor-ep " in rerun_command(results, [CASES[0].id])
    script = tmp_path / "repro.py"
    made = run([sys.executable, "-m", "conformance.cli", "repro",
                str(tmp_path / "report" / "results.json"), CASES[0].id, "-o", str(script)], env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    reproduced = run([sys.executable, str(script)], env=env)
    assert reproduced.returncode == 0, reproduced.stdout[-2000:] + reproduced.stderr[-2000:]
    assert "PASS" in reproduced.stdout
