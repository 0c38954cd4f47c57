"""The neuron backend against the stand-in of the Neuron SDK as published (tests/standin_neuron).

Unit tests: availability (the real package, PyPI's placeholder), the environment record, a core
slice that does not fit, the device check (the rules without the stand-in, such as the release
table, core forms, the child's environment and the runtime's error texts, are in
tests/test_neuron_sdk_rules.py). End-to-end tests run real supervised children through the Executor (as pytest workers
do) with the real Neuron backend code on CPU tensors; the stand-in's compile backend models the
SDK's caches, artefacts, metrics, fallbacks and asynchronous compilation (the caches and the
compile stages are tested in tests/test_neuron_caches.py).
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from cases import variants
from cases.model import Case, Shape
from conformance.backends import device_check
from conformance.backends import neuron_sdk as sdk
from conformance.backends.base import WorkerSlot
from conformance.backends.neuron import Neuron
from conformance.backends.registry import BackendError, resolve_backend
from conformance.executor import Executor, Settings
from conformance.reference_cache import ReferenceCache
from records.results import Label
from tests.standin_neuron import PLACEHOLDER_DIR, STANDIN_BIN, STANDIN_DIR

REPO = Path(__file__).resolve().parent.parent
TINY = Shape(1, 2, 2, 64, 64, 16)
CAUSAL = Case(variants.causal(), TINY, "fp32")
ALIBI = Case(variants.alibi(), TINY, "fp32")
ON_CPU = "tests.standin_neuron:NeuronOnCpu"
#: The stand-in is torch-neuronx 2.13.3.0 of Neuron 2.33 (its wheel metadata,
#: tests/standin_neuron/*.dist-info), which pairs with torch 2.13 only ([RN] in
#: conformance/backends/neuron_sdk.py): with any other torch it is rightly "not available".
STANDIN_TORCH = (2, 13)
NEEDS_NATIVE_RELEASE = pytest.mark.skipif(
    tuple(int(p) for p in torch.__version__.split(".")[:2]) != STANDIN_TORCH,
    reason=f"torch {torch.__version__}: the stand-in is torch-neuronx 2.13.3.0, which pairs "
           "with torch 2.13 only")


def _stock_sentence(device_type: str) -> str:
    """Upstream flex_attention's rejection of ``device_type``, as the running torch's source
    writes it: the list of devices grew between releases ("CUDA, CPU or HPU" in 2.11, "CUDA,
    CPU, HPU, or MPS" in 2.13)."""
    from torch.nn.attention import flex_attention as module

    found = re.search(r'"(FlexAttention is only supported on [^"]+ devices\. )"',
                      inspect.getsource(module))
    assert found, (f"torch {torch.__version__}'s flex_attention.py no longer words its device "
                   "check as 'FlexAttention is only supported on ... devices. ': update this")
    return f"{found.group(1)}Found input tensors on {device_type} device."
_STANDIN_ENV = ("STANDIN_NEURON_FAIL_COMPILE", "STANDIN_NEURON_FALLBACK_OPS",
                "STANDIN_NEURON_EXEC_TIMEOUT_AT", "STANDIN_NEURON_NO_SYNC",
                "STANDIN_NEURON_REJECT_DEVICE", "STANDIN_NEURON_COMPILE_SECONDS",
                "STANDIN_NEURON_CORES", sdk.METRICS_ENV, sdk.CORES_PER_WORKER_ENV,
                sdk.DEVICE_CHECK_ENV, sdk.VISIBLE_CORES_ENV,
                *sdk.RECORDED_ENV)


def _without_torch_neuronx(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p not in (str(STANDIN_DIR), str(PLACEHOLDER_DIR))])
    sdk._probe.cache_clear()


@pytest.fixture
def no_standin(monkeypatch):
    _without_torch_neuronx(monkeypatch)


@pytest.fixture
def placeholder(monkeypatch):
    """PyPI's torch-neuronx 1.0 'installed' (importable here and in children)."""
    _without_torch_neuronx(monkeypatch)
    monkeypatch.syspath_prepend(str(PLACEHOLDER_DIR))


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """The stand-in importable here and in children, its host-wide /tmp moved into tmp_path;
    returns the path of its compile record."""
    _without_torch_neuronx(monkeypatch)
    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    for name in _STANDIN_ENV:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "host").mkdir()
    monkeypatch.setenv("STANDIN_NEURON_HOST_TMP", str(tmp_path / "host"))
    record = tmp_path / "compiles.jsonl"
    monkeypatch.setenv("STANDIN_NEURON_RECORD", str(record))
    return record


def _compiles(record) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def _run(cases, tmp_path, spec: str = ON_CPU, slot=WorkerSlot(0, 1), **settings):
    from conformance.backends.registry import load_backend

    settings.setdefault("artifacts_dir", str(tmp_path / "report" / "artifacts"))
    settings.setdefault("warm_cache_dir", str(tmp_path / "warm"))
    executor = Executor(load_backend(spec), spec, slot,
                        Settings(compile_timeout=120.0, run_timeout=60.0, **settings),
                        ReferenceCache(None, 0), worker="test")
    try:
        return [executor.execute(case) for case in cases]
    finally:
        executor.close()


def _labels(records) -> list[Label]:
    return [r.label for r in records]


# -- availability --------------------------------------------------------------------------
def test_unavailable_without_torch_neuronx_says_how_to_install(no_standin):
    availability = Neuron().availability()
    assert not availability.available
    major, minor = torch.__version__.split(".")[:2]
    assert availability.reason.startswith("torch_neuronx is not installed; install it on a "
                                          "Trainium host (Trn2/Trn3, Python 3.12-3.14)")
    assert (f"pip install 'torch-neuronx=={major}.{minor}.*' --extra-index-url "
            "https://pip.repos.neuron.amazonaws.com") in availability.reason
    with pytest.raises(BackendError, match="'neuron' is not available here: torch_neuronx is not"):
        resolve_backend("neuron")
    assert resolve_backend("auto").name != "neuron"  # auto skips it


def test_pypi_placeholder_is_refused_with_the_fix(placeholder):
    availability = Neuron().availability()
    assert not availability.available
    assert availability.reason.startswith("the installed torch-neuronx is PyPI's placeholder (its "
                                          "import says 'ImportError: WRONG PACKAGE.")
    assert "pip uninstall torch-neuronx, then install the real one" in availability.reason
    assert "torch-neuronx==" in availability.reason and "3.12-3.14" in availability.reason
    assert resolve_backend("auto").name == "cpu-inductor"  # auto skips the placeholder


def test_flexconf_backends_with_the_placeholder_installed_says_why(placeholder):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLACEHOLDER_DIR), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "backends"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("neuron ")]
    assert "unavailable" in line and "PyPI's placeholder" in line and "WRONG PACKAGE" in line
    assert "--backend auto picks: cpu-inductor" in proc.stdout


# -- environment -----------------------------------------------------------------------------
@NEEDS_NATIVE_RELEASE
def test_environment_records_versions_tools_settings_and_sources(standin, monkeypatch):
    monkeypatch.setenv("NEURON_RT_EXEC_TIMEOUT", "120")
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type=transformer")
    assert Neuron().availability().available
    env = Neuron().environment()
    # the release is the wheel's metadata: the module's __version__ is "0.1.0", as in [SRC]
    # (asked in a subprocess: the stand-in registers its compile backend once per process)
    assert env["torch_neuronx"] == "2.13.3.0+standin"
    module_version = subprocess.run(
        [sys.executable, "-c", "import torch_neuronx; print(torch_neuronx.__version__)"],
        env={**os.environ, "PYTHONPATH": str(STANDIN_DIR)}, capture_output=True, text=True,
        timeout=120)
    assert module_version.stdout.strip() == "0.1.0", module_version.stderr[-2000:]
    assert env["neuronx_cc"] == "NeuronX Compiler version 2.28.7631.0+standin"
    # named after the two above, and the directory the children of a warm run are given
    from conformance.backends.neuron_cache import warm_neff_dir_name
    from tests.standin_neuron import NeuronOnCpu

    warm = f"neff/{warm_neff_dir_name(env)}"
    assert env["warm_neff_cache"].startswith(f"{warm} under the warm compile cache")
    given = NeuronOnCpu().process_cache_env("/cache", cold=False)[sdk.NEFF_CACHE_DIR_ENV]
    assert given == f"/cache/{warm}"
    assert env["neuron_runtime"] == "2.35.30.0-standin"
    assert env["neuron_driver"] == "2.26.5.0-standin"
    assert env["neuron_ls"].startswith("instance-type: trn2.3xlarge (stand-in)")
    assert env["NEURON_RT_EXEC_TIMEOUT"] == "120"
    assert env["NEURON_CC_FLAGS"] == "--model-type=transformer"
    assert env["NEURON_COMPILER_OPT_LEVEL"] == "not set (-O2 for torch.compile)"
    assert env["NEURON_LOGICAL_NC_CONFIG"].startswith("not set (Trn2 default: LNC=2")
    assert env["neuron_core_indices"].startswith("logical NeuronCores")
    assert env["cache_hit_source"].startswith(
        "the case's graphs (torch_neuronx.get_dynamo_metrics)")
    assert env["compile_breakdown_source"] == "torch_neuronx.get_dynamo_metrics()"
    assert env["fallback_ops_check"] == "torch_neuronx.get_fallback_ops()"
    assert env["cold_memory_cache"].startswith("cleared before each cold case")
    assert env["neuron_device_count"] == "4 (torch_neuronx.device_count(), logical NeuronCores)"
    assert env[sdk.VISIBLE_CORES_ENV].startswith("not set in the suite's environment; each "
                                                 "worker's child is pinned to its own 1 core(s)")
    # stock torch rejects 'neuron': the default is to lift that one check, and to say so
    assert env["device_check"].startswith(f"device check bypassed for neuron (torch "
                                          f"{torch.__version__}: flex_attention rejects it: "
                                          + _stock_sentence("neuron"))
    strict = Neuron(device_check_mode="strict").environment()["device_check"]
    assert strict.startswith("kept (--neuron-device-check strict)")


def test_environment_tolerates_absent_tools(no_standin, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no neuronx-cc, neuron-ls, dpkg-query, rpm
    env = Neuron().environment()
    assert env["torch_neuronx"] == "not installed"
    assert env["neuronx_cc"] == "not installed (neuronx-cc not on PATH)"
    assert env["neuron_ls"] == "not installed (neuron-ls not on PATH)"
    assert env["neuron_runtime"].startswith("unknown (aws-neuronx-runtime-lib not found")
    assert env["neuron_driver"].startswith("unknown (")
    assert env["cache_hit_source"].startswith("none: ")
    assert env["neuron_device_count"] == env["cold_memory_cache"] == \
        "unknown (torch_neuronx is not installed)"


# -- cores ------------------------------------------------------------------------------------------
def _two_workers_refused(tmp_path, cores_per_worker: int, **env_vars: str) -> str:
    """Start ``pytest -n 2`` on the stand-in with ``env_vars``; it must stop with exit 4
    before any case ran. Returns its stderr."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k != "NEURON_RT_VISIBLE_CORES"}
    env.update(PYTHONPATH=os.pathsep.join([str(STANDIN_DIR), str(REPO)]), **env_vars)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider", "-n", "2",
         "--backend", ON_CPU, "--neuron-cores-per-worker", str(cores_per_worker),
         "--profile", "smoke", "-k", "causal/b1-", "--report-dir", str(tmp_path / "report")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (tmp_path / "report" / "results.json").exists()  # nothing ran
    return proc.stderr


@NEEDS_NATIVE_RELEASE
def test_a_core_slice_that_does_not_fit_is_a_usage_error(tmp_path):
    stderr = _two_workers_refused(tmp_path, 4, NEURON_RT_VISIBLE_CORES="0-3")
    assert ("ERROR: worker 1 of 2 needs NeuronCores 4..7 of NEURON_RT_VISIBLE_CORES='0-3', "
            "which has 4; use fewer workers") in stderr


@NEEDS_NATIVE_RELEASE
def test_more_workers_than_the_cores_torch_neuronx_sees_is_a_usage_error(tmp_path):
    stderr = _two_workers_refused(tmp_path, 2, STANDIN_NEURON_CORES="3")
    assert ("ERROR: 2 worker(s) of 2 NeuronCore(s) each need 4, and "
            "torch_neuronx.device_count() sees 3 here") in stderr


@NEEDS_NATIVE_RELEASE
def test_a_host_whose_sdk_sees_no_neuroncore_has_no_neuron_backend(standin, monkeypatch):
    """[SRC] torch.neuron.is_available() is device_count() > 0; [SDK] the native backend needs
    a Trn2/Trn3 instance: the SDK installed on another host must not win --backend auto."""
    monkeypatch.setenv("STANDIN_NEURON_CORES", "0")
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "backends"], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDIN_DIR),
                                                                          str(REPO)])))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("neuron ")]
    assert line.split()[1] == "unavailable"
    assert "torch_neuronx sees no NeuronCore here (torch_neuronx.device_count() is 0)" in line
    assert "--backend auto picks: cpu-inductor" in proc.stdout


# -- the device check ----------------------------------------------------------------------------
def test_stock_torch_rejects_neuron_and_the_bypass_lifts_only_that(monkeypatch):
    from types import SimpleNamespace

    from torch.nn.attention import flex_attention as module

    monkeypatch.setattr(module, "_validate_device", module._validate_device)  # restored after
    found = device_check.probe("neuron")
    assert found == device_check.Probe("rejected", _stock_sentence("neuron"))
    assert device_check.probe("cuda").verdict == "accepted"
    assert device_check.apply("neuron", "strict").startswith("kept (--neuron-device-check strict)")
    with pytest.raises(ValueError, match="Found input tensors on neuron device"):
        module._validate_device(*[SimpleNamespace(device=SimpleNamespace(type="neuron"),
                                                  requires_grad=False)] * 3)
    sentence = device_check.apply("neuron", "bypass")
    assert sentence.startswith(f"device check bypassed for neuron (torch {torch.__version__}")
    assert device_check.apply("neuron", "bypass") == sentence  # idempotent
    neuron = SimpleNamespace(device=SimpleNamespace(type="neuron"), requires_grad=True)
    assert module._validate_device(neuron, neuron, neuron) is None
    meta = torch.empty(1, 1, 4, 4, device="meta")
    with pytest.raises(ValueError, match="Found input tensors on meta device"):
        module._validate_device(meta, meta, meta)  # every other device keeps the check
    grad = torch.empty(1, 1, 4, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        module._validate_device(grad, grad, grad)  # and every other rule of it
    with pytest.raises(ValueError, match="--neuron-device-check 'loose' is unknown; use one of: "
                                         "bypass, strict"):
        device_check.apply("neuron", "loose")


@pytest.mark.slow
def test_bypassed_device_check_runs_the_cases_and_strict_gives_upstreams_sentence(
        standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_REJECT_DEVICE", "1")  # CPU rejected as stock torch rejects neuron
    from tests.standin_neuron import NeuronOnCpu

    assert NeuronOnCpu().environment()["device_check"].startswith("device check bypassed for cpu")
    records = _run([CAUSAL, ALIBI], tmp_path)
    assert _labels(records) == [Label.PASS, Label.PASS], [r.message for r in records]
    monkeypatch.setenv(sdk.DEVICE_CHECK_ENV, "strict")
    records = _run([CAUSAL, ALIBI], tmp_path)
    assert _labels(records) == [Label.UNSUPPORTED, Label.UNSUPPORTED]
    assert {r.message for r in records} == {"ValueError: " + _stock_sentence("cpu")}


def test_a_device_flex_attention_rejects_is_unsupported_in_strict_mode(standin, tmp_path, monkeypatch):
    monkeypatch.setenv(sdk.DEVICE_CHECK_ENV, "strict")
    (record,) = _run([CAUSAL], tmp_path, spec="tests.standin_neuron:NeuronOnRejectedDevice")
    assert record.label is Label.UNSUPPORTED
    assert record.message == "ValueError: " + _stock_sentence("meta")
    assert [c for c in _compiles(standin)] == []  # rejected before any compile


def test_without_synchronize_every_case_is_a_harness_error(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_NO_SYNC", "1")
    records = _run([CAUSAL, ALIBI], tmp_path)
    assert _labels(records) == [Label.HARNESS_ERROR, Label.HARNESS_ERROR]
    assert "neither torch.neuron.synchronize nor torch.accelerator.synchronize" in records[0].message


def test_the_placeholder_in_the_child_is_a_harness_error_not_a_backend_label(placeholder, tmp_path):
    records = _run([CAUSAL, ALIBI], tmp_path)
    assert _labels(records) == [Label.HARNESS_ERROR, Label.HARNESS_ERROR]
    assert "the child cannot import torch_neuronx: the installed torch-neuronx is PyPI's " \
           "placeholder" in records[0].message


# -- artefacts, fallbacks, runtime timeouts --------------------------------------------------------
def test_failed_cases_keep_their_artifacts_in_the_report_dir(standin, tmp_path, monkeypatch):
    monkeypatch.setenv(sdk.FALLBACK_ENV, "0")
    monkeypatch.setenv("STANDIN_NEURON_FAIL_COMPILE", "1")
    (failed,) = _run([CAUSAL], tmp_path)
    assert failed.label is Label.COMPILE_ERROR, failed.message
    assert "Compilation error occurred on Neuron for operation=torch_compile" in failed.message
    assert 'COMPILATION FAILED: neuronx-cc (stand-in): injected failure' in failed.message
    kept = tmp_path / "report" / failed.artifacts
    assert failed.artifacts.startswith("artifacts/causal__b1-h2x2-s64x64-d16__fp32__fwd-")
    names = {p.relative_to(kept).parts[0] for p in kept.rglob("*") if p.is_file()}
    assert names == {"fx_graphs", "stablehlo", "raw", "neff", "child.log"}
    assert "injected failure" in (kept / "child.log").read_text()


@pytest.mark.slow
def test_passing_cases_leave_no_artifacts_unless_kept(standin, tmp_path):
    (passed,) = _run([CAUSAL], tmp_path)
    assert passed.label is Label.PASS and passed.artifacts is None
    assert not (tmp_path / "report" / "artifacts").exists()
    (kept,) = _run([ALIBI], tmp_path, keep_artifacts=True)
    files = list((tmp_path / "report" / kept.artifacts).rglob("*.stablehlo.mlir"))
    assert kept.label is Label.PASS and len(files) == 1


def test_a_timed_out_compile_keeps_its_artifacts(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_COMPILE_SECONDS", "120")
    monkeypatch.setenv("STANDIN_NEURON_SLOW_FROM", "2")  # the warm-up compiles at once
    from conformance.backends.registry import load_backend

    executor = Executor(load_backend(ON_CPU), ON_CPU, WorkerSlot(0, 1),
                        Settings(compile_timeout=3.0, run_timeout=60.0,
                                 artifacts_dir=str(tmp_path / "report" / "artifacts")),
                        ReferenceCache(None, 0), worker="test")
    try:
        record = executor.execute(CAUSAL)
    finally:
        executor.close()
    assert record.label is Label.COMPILE_TIMEOUT, record.message
    assert record.artifacts and list((tmp_path / "report" / record.artifacts).rglob("*.fx.txt"))


def test_an_op_that_fell_back_to_the_cpu_fails_the_case(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_FALLBACK_OPS", "aten::_safe_softmax,aten::where")
    (record,) = _run([CAUSAL], tmp_path)
    assert record.label is Label.COMPILE_ERROR
    assert "fell back to the CPU instead of running on the device: aten::_safe_softmax, " \
           "aten::where" in record.message


def test_a_runtime_execution_timeout_is_a_run_timeout(standin, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_NEURON_EXEC_TIMEOUT_AT", "3")  # warm-up, first call, then a run
    (record,) = _run([CAUSAL], tmp_path)
    assert record.label is Label.RUN_TIMEOUT, record.message
    assert "Operation timed out" in record.message


# -- the fallback guard ---------------------------------------------------------------------------
def test_prepare_refuses_to_run_with_fallback_allowed(standin, monkeypatch):
    from tests.standin_neuron import NeuronOnCpu

    monkeypatch.setenv(sdk.FALLBACK_ENV, "0")
    with pytest.raises(RuntimeError, match="TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION is '0' in "
                                           "the child; it must be 1"):
        NeuronOnCpu().prepare(CAUSAL)


def test_without_the_guard_a_failed_compile_passes_silently(standin, monkeypatch):
    """The trap the guard closes: the stand-in, like SDKs before 2.33, falls back to eager."""
    import torch_neuronx
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setenv("STANDIN_NEURON_FAIL_COMPILE", "1")
    monkeypatch.delenv(sdk.FALLBACK_ENV, raising=False)
    q = torch.randn(1, 2, 64, 16)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(flex_attention, backend="neuron", fullgraph=True)(q, q, q)
    torch._dynamo.reset()
    torch.testing.assert_close(out, flex_attention(q, q, q))  # right numbers, nothing compiled
    assert any("falling back to eager" in str(w.message) for w in caught)
    assert torch_neuronx.STANDIN and _compiles(standin)[0]["failing"]


def test_a_failed_compile_is_a_compile_error_even_if_the_caller_allows_fallback(
        standin, tmp_path, monkeypatch):
    monkeypatch.setenv(sdk.FALLBACK_ENV, "0")
    monkeypatch.setenv("STANDIN_NEURON_FAIL_COMPILE", "1")
    (record,) = _run([CAUSAL], tmp_path)
    assert record.label is Label.COMPILE_ERROR, record.message
    seen = _compiles(standin)
    assert seen and all(c["fallback_disabled"] and c["env"][sdk.FALLBACK_ENV] == "1" for c in seen)
