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
from conformance.protocol import CaseRequest, DoneEvent, ErrorEvent, Timings, label_of, observation_of
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
    assert triton_version() in ("not installed",) or triton_version()[0].isdigit()


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
