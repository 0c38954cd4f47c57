"""The CUDA backends on a machine without a GPU: availability, environment capture, one GPU per
worker, cache directories and the error mapping, with stand-ins where a GPU would answer.

The error mapping runs the child's own ``run_case`` in this process with a CUDA backend whose
tensors stay on the CPU and whose attention call raises what CUDA, Triton and Inductor raise;
its error event becomes an Observation exactly as the supervisor builds it, and ``label_of``
gives the label.
"""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from cases import variants
from cases.model import Case, Shape
from conformance import child
from conformance.backends.base import WorkerSlot
from conformance.backends.cuda import (CudaEager, CudaInductor, gpu_for_worker, triton_version,
                                       visible_gpus)
from conformance.backends.registry import BackendError, resolve_backend
from conformance.protocol import (CaseRequest, DoneEvent, ErrorEvent, Outcome, Phase, Timings,
                                  label_of, observation_of)
from records.results import Label

TINY = Case(variants.causal(), Shape(1, 2, 2, 64, 64, 16), "fp32")
TRITON_OOR = ("out of resource: shared memory, Required: 262144, Hardware limit: 232448. "
              "Reducing block sizes or `num_stages` may help.")


class OutOfResources(Exception):
    """Stand-in for triton.runtime.errors.OutOfResources (same name, same message)."""

    def __init__(self, required, limit, name):
        super().__init__(f"out of resource: {name}, Required: {required}, Hardware limit: "
                         f"{limit}. Reducing block sizes or `num_stages` may help.")


class NoTritonConfigsError(RuntimeError):
    """Stand-in for Inductor's rewrap of a Triton failure (text only, no cause)."""


def _wrapped_by_dynamo(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except Exception as exc:
            raise RuntimeError(f"backend='inductor' raised:\n{type(exc).__name__}: {exc}") from exc
    except RuntimeError as outer:
        return outer


def _raising(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc
    return fail


class CudaOnCpu(CudaInductor):
    """cuda-inductor's code, its tensors on the CPU, its compiled call replaced by ``call``."""

    device_type = "cpu"
    call = None

    def _attention_fn(self):
        return self.call

    def synchronize(self):
        pass


def _label_of_first_call(call) -> tuple[Label, str]:
    backend = CudaOnCpu()
    backend.call = call
    events = []
    child.run_case(backend, CaseRequest(TINY.to_json(), os.devnull, cold=False), events.append)
    error = next(e for e in events if isinstance(e, ErrorEvent))
    obs = observation_of(error, Timings())  # as the supervisor does
    return label_of(obs), error.message


@pytest.mark.parametrize("raised", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
                                "total capacity of 139.80 GiB of which 1.10 GiB is free."),
    _wrapped_by_dynamo(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")),
    RuntimeError("backend='inductor' raised:\nOutOfMemoryError: CUDA out of memory. Tried to "
                 "allocate 8.00 GiB"),
], ids=["direct", "wrapped-by-the-compiler", "text-only"])
def test_cuda_oom_is_out_of_memory(raised):
    label, message = _label_of_first_call(_raising(raised))
    assert label is Label.OUT_OF_MEMORY
    assert message.startswith("CudaOutOfMemory: CUDA out of memory. Tried to allocate")


@pytest.mark.parametrize("raised", [
    OutOfResources(262144, 232448, "shared memory"),
    _wrapped_by_dynamo(OutOfResources(262144, 232448, "shared memory")),
    NoTritonConfigsError(f"No valid triton configs. OutOfResources: {TRITON_OOR}"),
], ids=["triton", "wrapped-by-the-compiler", "inductor-rewrap"])
def test_triton_out_of_resources_is_a_compile_error_that_says_so(raised):
    label, message = _label_of_first_call(_raising(raised))
    assert label is Label.COMPILE_ERROR
    first = message.splitlines()[0]
    assert first.startswith("TritonOutOfResources: Triton kernel exceeds the GPU's on-chip "
                            "resources (out of resource: shared memory, Required: 262144, "
                            "Hardware limit: 232448)")
    assert "out of memory" not in message.lower()  # never mistaken for OUT_OF_MEMORY


def test_other_errors_pass_through_unchanged():
    label, message = _label_of_first_call(_raising(RuntimeError("LoweringException: no lowering")))
    assert label is Label.COMPILE_ERROR
    assert message == "RuntimeError: LoweringException: no lowering"


def test_eager_path_computes_the_case_on_a_stand_in_device(tmp_path):
    class CudaEagerOnCpu(CudaEager):
        device_type = "cpu"

        def synchronize(self):
            pass

    events = []
    child.run_case(CudaEagerOnCpu(), CaseRequest(TINY.to_json(), str(tmp_path / "o.pt")),
                   events.append)
    assert isinstance(events[-1], DoneEvent), events[-1]
    out = torch.load(tmp_path / "o.pt")["out"]
    assert out.shape == (1, 2, 64, 16) and torch.isfinite(out).all()


def test_unavailable_without_cuda_with_a_clear_reason(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for backend in (CudaEager(), CudaInductor()):
        availability = backend.availability()
        assert not availability.available
        assert "install a CUDA build of torch" in availability.reason or \
            "torch.cuda.is_available() is False" in availability.reason
    monkeypatch.setattr(torch.version, "cuda", "12.6")  # a CUDA build on a GPU-less machine
    reason = CudaInductor().availability().reason
    assert reason.startswith("torch.cuda.is_available() is False (torch ")
    assert "CUDA 12.6" in reason and "nvidia-smi" in reason
    with pytest.raises(BackendError, match="backend 'cuda-inductor' is not available here: torch.cuda"):
        resolve_backend("cuda-inductor")


def test_environment_records_device_cuda_driver_and_triton(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 565.57.01\necho 565.57.01\n")
    smi.chmod(0o755)
    site = tmp_path / "site"
    (site / "triton-3.4.0.dist-info").mkdir(parents=True)
    (site / "triton-3.4.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: triton\nVersion: 3.4.0\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        name="NVIDIA H200 (stand-in)", major=9, minor=0, total_memory=150_000_000_000))
    env = CudaInductor().environment()
    assert env["backend"] == "cuda-inductor" and env["compiler"] == "inductor"
    assert env["device"] == "cuda" and env["device_name"] == "NVIDIA H200 (stand-in)"
    assert env["cuda"] == "12.8" and env["driver"] == "565.57.01" and env["triton"] == "3.4.0"
    assert env["compute_capability"] == "9.0" and env["device_count"] == 2
    assert env["torch"] == torch.__version__


def test_versions_tolerate_absent_tools(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    env = CudaEager().environment()
    assert env["driver"] == "unknown (nvidia-smi not found)"
    from importlib.metadata import PackageNotFoundError, version

    installed = []
    for package in ("triton", "pytorch-triton", "pytorch-triton-rocm"):
        try:
            installed.append(version(package))
        except PackageNotFoundError:
            pass
    assert triton_version() == (installed[0] if installed else "not installed")


def test_triton_version_names_the_first_distribution_installed(monkeypatch):
    from importlib import metadata

    def version(package):
        if package == "pytorch-triton":
            return "3.6.0+git1234"
        raise metadata.PackageNotFoundError(package)

    monkeypatch.setattr(metadata, "version", version)
    assert triton_version() == "3.6.0+git1234"
    monkeypatch.setattr(metadata, "version", lambda p: (_ for _ in ()).throw(
        metadata.PackageNotFoundError(p)))
    assert triton_version() == "not installed"


def test_one_gpu_per_worker_from_the_visible_list():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3"})
    assert gpus == ["2", "3"]
    assert [gpu_for_worker(WorkerSlot(i, 4), gpus) for i in range(4)] == ["2", "3", "2", "3"]
    uuids = visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"})
    assert gpu_for_worker(WorkerSlot(1, 2), uuids) == "GPU-bbbb"
    with pytest.raises(ValueError, match="no GPU to give to worker children"):
        gpu_for_worker(WorkerSlot(0, 1), visible_gpus({"CUDA_VISIBLE_DEVICES": ""}))


def test_child_env_pins_a_gpu_and_the_caches(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert CudaInductor().child_env(WorkerSlot(5, 8), None) == {
        "CUDA_VISIBLE_DEVICES": "5", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    start = CudaInductor().child_env(WorkerSlot(2, 8), str(tmp_path))
    assert start == {"CUDA_VISIBLE_DEVICES": "2", "TORCHINDUCTOR_COMPILE_THREADS": "1",
                     "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
                     "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    assert CudaEager().child_env(WorkerSlot(7, 8), None) == {"CUDA_VISIBLE_DEVICES": "7"}


def test_begin_case_points_triton_and_inductor_at_the_case_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/shared/elsewhere")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/shared/elsewhere")
    CudaInductor().begin_case(str(tmp_path), cold=True)
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)


def test_warm_up_runs_the_attention_call_once():
    calls = []

    class Recording(CudaOnCpu):
        def call(self, q, k, v, score_mod=None, block_mask=None):
            calls.append((q.dtype, score_mod is not None, block_mask is not None))
            return q

        def _attention_fn(self):
            return self.call

    Recording().warm_up()
    assert calls == [(torch.bfloat16, True, True)]


def test_a_kernel_launchers_failure_is_labelled_by_what_it_says():
    """Inductor rewraps a kernel launcher's failure, Triton's OutOfResources or a
    torch.cuda.OutOfMemoryError, as "No valid triton configs. <type>: <text>" (torch 2.13
    triton_heuristics ``_make_launchers``). Said as out of resource (shared memory), it is
    the kernel's COMPILE_ERROR, whatever the type; said as out of memory (the module could
    not be loaded on a full GPU), OUT_OF_MEMORY. What a GPU's launcher really says is not
    known here: worth checking on a GPU."""
    label, message = _label_of_first_call(_raising(NoTritonConfigsError(
        f"No valid triton configs. OutOfMemoryError: {TRITON_OOR}")))
    assert label is Label.COMPILE_ERROR, message
    assert message.startswith("TritonOutOfResources: Triton kernel exceeds the GPU's on-chip "
                              "resources (out of resource: shared memory"), message
    label, message = _label_of_first_call(_raising(NoTritonConfigsError(
        "No valid triton configs. OutOfMemoryError: CUDA driver error: out of memory")))
    assert label is Label.OUT_OF_MEMORY, message


def _cuda_error(text: str) -> BaseException:
    kind = getattr(torch, "AcceleratorError", RuntimeError)  # torch >= 2.8 raises this
    try:
        return kind(text)
    except TypeError:  # its constructor may want an error code first
        return RuntimeError(text)


@pytest.mark.parametrize("raised", [
    _cuda_error("CUDA error: an illegal memory access was encountered\nCUDA kernel errors "
                "might be asynchronously reported at some other API call"),
    RuntimeError("CUDA error: device-side assert triggered"),
    _wrapped_by_dynamo(RuntimeError("CUDA error: unspecified launch failure")),
], ids=["accelerator-error", "runtime-error-text", "wrapped-by-the-compiler"])
def test_a_cuda_fault_in_the_first_call_is_a_runtime_error_and_replaces_the_child(raised):
    """A kernel's fault surfaces at the first call's synchronize, inside the compile phase: it
    was a COMPILE_ERROR, and the child kept its broken CUDA context (an outside review)."""
    backend = CudaOnCpu()
    backend.call = _raising(raised)
    events = []
    child.run_case(backend, CaseRequest(TINY.to_json(), os.devnull, cold=False), events.append)
    error = next(e for e in events if isinstance(e, ErrorEvent))
    assert error.outcome is Outcome.EXEC_ERROR  # the supervisor closes the child on it
    assert label_of(observation_of(error, Timings())) is Label.RUNTIME_ERROR


def test_a_cuda_fault_while_setting_a_case_up_replaces_the_child_too():
    """Inputs and the block mask move to the GPU in setup: a fault there left every later case
    of the worker a setup error in the same broken context."""
    class FaultyDevice(CudaOnCpu):
        def device(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    events = []
    child.run_case(FaultyDevice(), CaseRequest(TINY.to_json(), os.devnull, cold=False),
                   events.append)
    error = next(e for e in events if isinstance(e, ErrorEvent))
    assert (error.phase, error.outcome) == (Phase.SETUP, Outcome.EXEC_ERROR), error
    assert label_of(observation_of(error, Timings())) is Label.RUNTIME_ERROR


def test_each_worker_computes_its_goldens_on_its_own_gpu(monkeypatch):
    """--reference-device cuda put every worker's goldens on GPU 0, beside worker 0's timed
    runs (an outside review); now each worker's on the GPU its child runs on."""
    from conformance.backends.cuda import reference_device_for

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [reference_device_for("cuda", WorkerSlot(i, 8)) for i in range(8)] == \
        [f"cuda:{i % 4}" for i in range(8)]
    assert gpu_for_worker(WorkerSlot(5, 8), ["0", "1", "2", "3"]) == "1"  # the same GPU
    assert reference_device_for("cpu", WorkerSlot(5, 8)) == "cpu"


def test_goldens_on_gpus_this_process_does_not_see_one_for_one_are_refused(monkeypatch):
    """With MIG a process sees one instance however many CUDA_VISIBLE_DEVICES names: every
    worker's goldens would land on the first, beside its timed runs (a review)."""
    from conformance.backends.cuda import reference_gpus_problem

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = reference_gpus_problem({"CUDA_VISIBLE_DEVICES": "MIG-aaaa,MIG-bbbb"})
    assert line == ("--reference-device cuda: CUDA_VISIBLE_DEVICES lists 2 GPUs (MIG-aaaa, "
                    "MIG-bbbb) but this process sees 1 (MIG instances: one per process), so a "
                    "worker's goldens could not go to its own GPU; use --reference-device cpu")
    assert reference_gpus_problem({"CUDA_VISIBLE_DEVICES": "MIG-aaaa"}) is None


def test_the_float32_baseline_is_computed_without_tf32_and_the_setting_put_back():
    from conformance.compat import ieee_float32_matmul

    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(torch._C, "_get_fp32_precision_getter") else "allow_tf32"
    before = getattr(matmul, name)
    setattr(matmul, name, "tf32" if name == "fp32_precision" else True)
    try:
        with ieee_float32_matmul():
            assert getattr(matmul, name) in ("ieee", False)
        assert getattr(matmul, name) in ("tf32", True)
    finally:
        setattr(matmul, name, before)


def test_a_tf32_override_with_goldens_on_the_gpu_is_one_line(tmp_path):
    """TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (NGC images set it) turns TF32 on for cuBLAS
    whatever torch's flags say: the float32 baseline would not be IEEE float32."""
    from tests.test_plugin_runs import clean_env, pytest_args, run

    proc = run(pytest_args(tmp_path, "cpu-eager", [TINY], "--reference-device", "cuda",
                           "-p", "tests.cuda_claimed"),
               env=clean_env(TORCH_ALLOW_TF32_CUBLAS_OVERRIDE="1"))
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert ("--reference-device cuda: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 makes cuBLAS round "
            "float32 products to TF32") in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "report" / "results.json").exists()


def test_the_warm_up_compiles_every_stage_in_the_process():
    """As on the CPU: no cache of whole graphs may serve the warm-up, so its one-time costs
    are paid there and not by the first case whose graph misses (an outside review)."""
    from torch._inductor import config

    seen = []
    backend = CudaOnCpu()

    def call(q, k, v, score_mod=None, block_mask=None, **kwargs):
        seen.append(config.fx_graph_cache)
        return torch.zeros_like(q)

    backend.call = call
    backend.warm_up()
    assert seen == [False]
