"""What a reproduction script (``flexconf repro``) runs: one case, the way the suite runs it.

The script embeds this module with the suite modules it uses, so the inputs (cases/inputs.py),
the mods, the child's warm-up (the compiler's one-time start-up, paid before the case and
printed apart, so the compile seconds compare with the run's) and phases (conformance/child.py
``run_case``: setup, block mask, the backend's callable, the first call as the compile phase,
the timed runs), the reference
(conformance/reference_cache.py ``compute_reference``) and the verdict are the suite's own code.
Only torch (and the backend's own package) must be installed. A backend that cannot be loaded
is one line and exit status 1. There is no watchdog: a hang hangs, a crash kills the script.
The script's working directory (in the temporary directory) is removed when it ends, except
a failed case's compile artefacts, whose place it prints; a crash leaves it whole.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path


def reproduce(case_spec: dict, backend_spec: str, seed: int, runs: int = 3,
              case_modules: tuple[str, ...] = (), recorded: str = "",
              save_outputs: str | None = None, compare: str | None = None) -> int:
    """Run the case, print the phases, the error metrics and the label; 0 when it passes.

    ``save_outputs``: write the inputs, the output, the golden and the baseline there (the
    format of ``--keep-outputs``, reference/outputs.py). ``compare``: a file kept by the run
    (``<report-dir>/outputs/...pt``); print how far this output is from the run's."""
    backend = _load_backend(backend_spec)
    workdir = Path(tempfile.mkdtemp(prefix="flexconf-repro-"))
    label = "HARNESS_ERROR"  # until the case has one: an exception keeps the artefacts
    try:
        label, message = _reproduce(backend, backend_spec, case_spec, seed, runs, case_modules,
                                    recorded, save_outputs, compare, workdir)
    finally:
        _remove_workdir(workdir, keep_artifacts=label != "PASS")
    return _finish(label, message)


def _remove_workdir(workdir: Path, keep_artifacts: bool) -> None:
    """Remove the script's working directory (the case's output, the compile caches); a failed
    case's compile artefacts stay, as a run keeps them, and their place is printed."""
    import shutil

    artifacts = workdir / "artifacts"
    if keep_artifacts and artifacts.is_dir() and any(artifacts.iterdir()):
        for entry in workdir.iterdir():
            if entry.is_dir() and entry != artifacts:
                shutil.rmtree(entry, ignore_errors=True)
            elif not entry.is_dir():
                entry.unlink(missing_ok=True)
        print(f"artefacts {artifacts} (kept: the case did not pass)")
        return
    shutil.rmtree(workdir, ignore_errors=True)


def _reproduce(backend, backend_spec: str, case_spec: dict, seed: int, runs: int,
               case_modules: tuple[str, ...], recorded: str, save_outputs: str | None,
               compare: str | None, workdir: Path) -> tuple[str, str]:
    """The body of ``reproduce`` in ``workdir``: the label and message to finish with."""
    from conformance.backends.base import WorkerSlot

    # the warm-up's own directory, as the executor gives a child; the case gets its own
    os.environ.update(backend.child_env(WorkerSlot(0, 1),
                                        str(workdir / "compile-cache-warm-up")))
    # as the executor starts a child of a cold run: no process-wide cache (neuron's default is
    # the host's /tmp/neff_cache) may serve the compile, and artefacts stay in the workdir
    os.environ.update(backend.process_cache_env(str(workdir / "process-cache"), True))
    os.environ.update(backend.artifact_env(str(workdir / "artifacts")))
    import torch

    from cases.model import Case

    case = Case.from_json(case_spec)
    print(f"case      {case.id}")
    print(f"backend   {backend.name} ({backend_spec}), torch {torch.__version__}, seed {seed}")
    if recorded:
        print(f"recorded  {recorded}")
    for name in case_modules:  # what they set when imported is theirs, as in a child
        importlib.import_module(name)
    from conformance.backends.registry import unsupported_reason_of

    reason, failure = unsupported_reason_of(backend, case)
    if failure:
        return "RUNTIME_ERROR", failure
    if reason:
        return "UNSUPPORTED", reason
    kept = None
    if compare:
        from reference.outputs import load_case_outputs

        try:
            kept = load_case_outputs(compare)
        except ValueError as exc:  # one line, as the other mistakes: no traceback
            raise SystemExit(f"repro: error: --compare {exc}") from None
        if kept.case.id != case.id or kept.seed != seed:
            raise SystemExit(f"{compare} holds {kept.case.id} seed {kept.seed}, not this case "
                             f"({case.id} seed {seed}); pass the file kept for this case")
    from cases import torch_state

    # the warm-up, as a child pays it before its first case (a case the controller finds
    # unsupported never reaches a child: above, before it)
    fatal = _warm_up(backend, torch_state.snapshot())
    label, message, metrics, tensors = _run(backend, case, seed, runs, workdir, fatal)
    if metrics:
        print("metrics   " + json.dumps(metrics, indent=None, default=str))
    if tensors is not None and save_outputs:
        from reference.outputs import save_case_outputs

        print(f"saved     {save_outputs}")
        save_case_outputs(_case_outputs(case, seed, label, message, tensors), save_outputs)
    if kept is not None:
        print(f"compared  {compare}: {_difference(tensors, kept)}")
    return label, message


def _warm_up(backend, pristine) -> str | None:
    """The backend's warm-up, as a run's child pays it before its first case, so that the
    compile seconds printed are the case's own, comparable with the run's; its seconds and
    any error are printed. Returns why no case can run (a FatalSetupError), or None."""
    from conformance.child import warm_up_backend

    print("phase     warm-up", file=sys.stderr, flush=True)
    seconds, error, fatal = warm_up_backend(backend, pristine)
    print(f"warm-up   {seconds:.3g} s, the compiler's one-time start-up (not in the compile "
          "seconds below)" + (f"; it failed: {error}" if error else ""))
    return fatal


def _load_backend(spec: str):
    """The backend, or SystemExit with the registry's one-line reason (exit status 1): a
    backend this machine cannot load is the user's to fix, not a traceback."""
    from conformance.backends.registry import BackendError, load_backend

    try:
        return load_backend(spec)
    except BackendError as exc:
        raise SystemExit(f"repro: error: {exc}") from None


def _case_outputs(case, seed: int, label: str, message: str, tensors):
    from cases.inputs import make_grad_output, make_inputs
    from reference.outputs import CaseOutputs

    observed, golden, baseline = tensors
    return CaseOutputs(case=case, seed=seed, label=label, message=message,
                       inputs=make_inputs(case, seed),
                       grad_out=make_grad_output(case, seed) if case.mode == "fwd+bwd" else None,
                       observed=observed, golden=golden, baseline=baseline)


def _difference(tensors, kept) -> str:
    """How this run's output compares with the kept one (bit-identical, or the largest gap)."""
    import torch

    from reference.verdict import flat_place

    if tensors is None:
        return f"no output here to compare (the run's was {kept.label})"
    out, theirs = tensors[0].out.double(), kept.observed.out.double()
    if torch.equal(tensors[0].out, kept.observed.out):
        return "the output is bit-identical to the run's"
    gap = (out - theirs).abs().nan_to_num(float("inf"))
    where = flat_place(int(gap.argmax()), gap.shape)
    return f"the output differs from the run's: max |diff| {gap.max().item():.3g} at {where}"


def _run(backend, case, seed: int, runs: int, workdir: Path,
         fatal: str | None) -> tuple[str, str, dict, tuple | None]:
    """The case through the child's ``run_case`` in this process, then the suite's own
    decision (``conformance.decision.decide``) against the reference."""
    from conformance.child import run_case
    from conformance.decision import decide
    from conformance.protocol import (CaseRequest, DoneEvent, ErrorEvent, PhaseEvent, Timings,
                                      observation_of)
    from conformance.reference_cache import compute_reference

    final: list = []

    def emit(event) -> None:
        if isinstance(event, PhaseEvent):
            print(f"phase     {event.phase.value}", file=sys.stderr, flush=True)
        elif isinstance(event, DoneEvent | ErrorEvent):
            final.append(event)

    request = CaseRequest(case=case.to_json(), output_path=str(workdir / "output.pt"),
                          seed=seed, runs=runs, cold=True,
                          cache_dir=str(workdir / "compile-cache"))
    run_case(backend, request, emit, fatal)
    obs = observation_of(final[-1], Timings())
    seconds = ", ".join(f"{phase} {value:.3g} s" for phase, value in (
        ("setup", obs.timings.setup_seconds), ("compile", obs.timings.compile_seconds),
        ("run", obs.timings.run_seconds)) if value is not None)
    print(f"seconds   {seconds}")
    reference = compute_reference(case, seed, "cpu") if isinstance(final[-1], DoneEvent) else None
    decision = decide(case, obs, reference)
    tensors = (decision.observed, *reference) if decision.observed is not None else None
    return decision.label.value, decision.message, decision.metrics or {}, tensors


def _finish(label: str, message: str) -> int:
    if message:
        print(f"message   {message}")
    print(f"label: {label}")
    return 0 if label == "PASS" else 1
