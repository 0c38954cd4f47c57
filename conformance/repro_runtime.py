"""What a reproduction script (``flexconf repro``) runs: one case, the way the suite runs it.

The script embeds this module with the suite modules it uses, so the inputs (cases/inputs.py),
the mods, the child's phases (conformance/child.py ``run_case``: setup, block mask, the
backend's callable, the first call as the compile phase, the timed runs), the reference
(conformance/reference_cache.py ``compute_reference``) and the verdict are the suite's own code.
Only torch (and the backend's own package) must be installed. There is no watchdog: a hang
hangs, a crash kills the script.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path


def reproduce(case_spec: dict, backend_spec: str, seed: int, runs: int = 3,
              case_modules: tuple[str, ...] = (), recorded: str = "") -> int:
    """Run the case, print the phases, the error metrics and the label; 0 when it passes."""
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import load_backend

    backend = load_backend(backend_spec)
    workdir = Path(tempfile.mkdtemp(prefix="flexconf-repro-"))
    os.environ.update(backend.child_env(WorkerSlot(0, 1), str(workdir / "compile-cache")))
    import torch

    for name in case_modules:
        importlib.import_module(name)
    from cases.model import Case

    case = Case.from_json(case_spec)
    print(f"case      {case.id}")
    print(f"backend   {backend.name} ({backend_spec}), torch {torch.__version__}, seed {seed}")
    if recorded:
        print(f"recorded  {recorded}")
    reason = backend.unsupported_reason(case)
    if reason:
        return _finish("UNSUPPORTED", reason)
    label, message, metrics = _run(backend, case, seed, runs, workdir)
    if metrics:
        print("metrics   " + json.dumps(metrics, indent=None, default=str))
    return _finish(label, message)


def _run(backend, case, seed: int, runs: int, workdir: Path) -> tuple[str, str, dict]:
    import torch

    from conformance.child import run_case
    from conformance.observation import Observation, label_of
    from conformance.reference_cache import compute_reference
    from reference.golden import Reference
    from reference.verdict import judge

    events: list[dict] = []

    def emit(**event) -> None:
        events.append(event)
        if event.get("event") == "phase":
            print(f"phase     {event['phase']}", file=sys.stderr, flush=True)

    request = {"case": case.to_json(), "seed": seed, "runs": runs, "cold": True,
               "output_path": str(workdir / "output.pt"),
               "cache_dir": str(workdir / "compile-cache")}
    run_case(backend, request, emit)
    final = events[-1]
    seconds = ", ".join(f"{phase} {final[f'{phase}_seconds']:.3g} s"
                        for phase in ("setup", "compile", "run")
                        if final.get(f"{phase}_seconds") is not None)
    print(f"seconds   {seconds}")
    if final["event"] == "error":
        observation = Observation(final["kind"], final["phase"], final["message"])
        return label_of(observation).value, final["message"], {}
    golden, baseline = compute_reference(case, seed, "cpu")
    observed = torch.load(final["output_path"], weights_only=True)
    if isinstance(observed, dict) and "out" in observed:  # an output with lse or gradients
        observed = Reference(observed["out"], observed.get("lse"), observed.get("grads"))
    verdict = judge(case, golden, baseline, observed)
    return ("PASS" if verdict.passed else "MISMATCH"), verdict.summary, verdict.metrics


def _finish(label: str, message: str) -> int:
    if message:
        print(f"message   {message}")
    print(f"label: {label}")
    return 0 if label == "PASS" else 1
