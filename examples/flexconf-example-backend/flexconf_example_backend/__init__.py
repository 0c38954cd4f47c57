"""An example third-party backend: flex_attention called eagerly on the CPU, under its own name.

A vendor's backend is the same few methods (docs/backends.md, "The interface"):
say whether it can run here and why not, what to record about the environment, which cases
it cannot run, what each worker's child process needs in its environment, which device the
tensors go to, and the callable that computes a case. Everything else (processes, budgets,
labels, the reference, the verdict, the report) is the suite's.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from conformance.backends.base import Availability, Backend, WorkerSlot, threads_per_worker

__version__ = "0.1.0"


class ExampleEager(Backend):
    name = "example-eager"
    description = "example plugin: flex_attention called eagerly on the CPU"
    device_type = "cpu"
    compiled = False  # the first call does not compile: its seconds are not a compile time

    def availability(self) -> Availability:
        # A real plugin checks for its SDK and device here, and says how to get them.
        if importlib.util.find_spec("torch") is None:
            return Availability(False, "torch is not installed; pip install torch")
        return Availability(True)

    def environment(self) -> dict[str, Any]:
        env = super().environment()  # backend, torch, python, host, platform
        env.update(device="cpu", plugin="flexconf-example-backend", plugin_version=__version__)
        return env

    def unsupported_reason(self, case) -> str | None:
        # Each mode's true reason: what this backend's callable cannot return (the contract
        # of each mode is in docs/backends.md), or what torch refuses on this device.
        if case.mode == "fwd+lse":
            return ("example-eager returns the output only, not the log-sum-exp that fwd+lse "
                    "checks (a backend that does returns (out, lse): docs/backends.md)")
        if case.mode == "fwd+bwd":
            return "FlexAttention does not support backward on CPU (torch raises for it)"
        return None

    def child_env(self, slot: WorkerSlot, cache_dir: str | None) -> dict[str, str]:
        # A device plugin pins each worker's child to its slice of the devices here.
        return {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads_per_worker(slot))}

    def prepare(self, case):
        from torch.nn.attention.flex_attention import flex_attention

        gqa = case.shape.Hq != case.shape.Hkv

        def example(q, k, v, score_mod, block_mask):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                  enable_gqa=gqa)

        return example
