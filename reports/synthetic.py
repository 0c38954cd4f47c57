"""Synthetic runs with realistic ids, labels, times and messages, for the report benchmark,
the tests and demonstrations. Deterministic for a given seed; no torch."""
from __future__ import annotations

import itertools
import random

from cases.model import Case, Shape, Variant
from records.results import Label, Record, RunResults

_VARIANTS = (
    Variant("full"), Variant("causal"), Variant("sliding_window", (("w", 1024),)),
    Variant("prefix_lm", (("p", 256),)), Variant("document"), Variant("alibi"),
    Variant("softcap", (("cap", 50),)), Variant("rel_bias", (("nb", 32),)),
    Variant("dilated_window", (("w", 512), ("d", 2))), Variant("natten2d", (("k", 7),)),
)
_FAILURE_MESSAGES = {
    Label.MISMATCH: "error ratio 3.1 over rule mean<=1.1*baseline; worst row b0 h3 q1021",
    Label.COMPILE_TIMEOUT: "compile ran past 600 s (neuronx-cc still running: <hlo module 'flex'>)",
    Label.RUN_TIMEOUT: "run ran past 120 s after a finished compile",
    Label.COMPILE_ERROR: "neuronx-cc: error: unsupported op 'stablehlo.custom_call' & friends",
    Label.RUNTIME_ERROR: "RuntimeError: NRT_EXEC failed with status 1003",
    Label.CRASH: "worker process died with signal 11 (SIGSEGV)",
    Label.OUT_OF_MEMORY: "RuntimeError: out of device memory allocating 4.0 GiB",
    Label.UNSUPPORTED: "flex_attention: device type 'neuron' is not one of cuda, cpu, xpu, hpu",
    Label.HARNESS_ERROR: "reference cache unreadable: permission denied",
}


def synthetic_cases(count: int) -> list[Case]:
    """``count`` distinct cases over variants, batches, lengths, dtypes, modes, heads, dims."""
    axes = itertools.product(("bf16", "fp16", "fp32"), ("fwd", "fwd+bwd"), ((8, 8), (8, 2), (16, 4)),
                             (64, 128, 256), _VARIANTS, (1, 2, 4, 8), (512, 1024, 2048, 4096, 8192))
    cases = []
    for dtype, mode, (hq, hkv), dim, variant, batch, seq in axes:
        cases.append(Case(variant, Shape(batch, hq, hkv, seq, seq, dim), dtype, mode))
        if len(cases) == count:
            return cases
    raise ValueError(f"count={count} exceeds the {len(cases)} synthetic cases; ask for fewer")


def synthetic_run(count: int, seed: int = 0, failure_rate: float = 0.08,
                  backend: str = "neuron", profile: str = "full",
                  compile_cache: str = "cold") -> RunResults:
    """A run of ``count`` cases; about ``failure_rate`` of them fail, with every label."""
    rng = random.Random(seed)
    failing = [label for label in Label if label not in (Label.PASS, Label.COMPILED)]
    records = []
    for i, case in enumerate(synthetic_cases(count)):
        label = rng.choice(failing) if rng.random() < failure_rate else Label.PASS
        compile_s = round(rng.lognormvariate(1.5, 0.6) * case.shape.Sq / 2048, 3)
        metrics = None
        if label in (Label.PASS, Label.MISMATCH):
            ratio = rng.uniform(0.8, 1.05) if label is Label.PASS else rng.uniform(2, 40)
            metrics = {"error_ratio": ratio, "max_abs_err": ratio * 3e-3,
                       "mean_abs_err": ratio * 2e-4, "baseline_mean_abs_err": 2e-4,
                       "worst_row_ratio": ratio * 1.7, "worst_head_ratio": ratio * 1.2,
                       "worst_place": {"b": 0, "h": i % 8, "q": i % case.shape.Sq},
                       "nan_count": 0, "inf_count": 0,
                       "failed_rules": [] if label is Label.PASS else ["mean", "worst_row"]}
        records.append(Record(
            case_id=case.id, label=label, case=case.to_json(),
            message=_FAILURE_MESSAGES.get(label, ""),
            setup_seconds=0.05,
            compile_seconds=None if label is Label.COMPILE_TIMEOUT else compile_s,
            run_seconds=round(compile_s / 50, 4), cache_hit=False, metrics=metrics,
            worker=f"gw{i % 8}"))
    return RunResults(
        environment={"backend": backend, "device": "trn3 (synthetic)", "torch": "2.13.0",
                     "neuronx_cc": "2.99.0 (synthetic)", "host": "synthetic-host",
                     "git_revision": "0000000"},
        options={"backend": backend, "profile": profile, "seed": seed,
                 "compile_timeout": 600.0, "run_timeout": 120.0, "compile_cache": compile_cache},
        records=tuple(records), suite_version="0.1.0",
        started_at="2025-01-01T00:00:00Z", finished_at="2025-01-01T01:00:00Z")
