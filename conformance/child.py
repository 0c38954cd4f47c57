"""The child process: runs cases of one backend, one at a time, reporting each phase.

Started by ``conformance.supervisor`` as
``python -m conformance.child --backend SPEC --events-fd N`` in a session of its own (so the
watchdog can kill it with every compiler subprocess it started). Requests arrive as JSON lines
on stdin; events leave as JSON lines on fd N. stdout and stderr go to a log file, so nothing a
compiler prints can corrupt the protocol. Both are the records of ``conformance/protocol.py``:
a ``ReadyEvent`` once started, then per request ``PhaseEvent``s and one ``DoneEvent`` or
``ErrorEvent``. A compile-only request stops after the compile phase: no timed runs, no
output file. A warm-up that raised FatalSetupError makes every request a ``harness`` error
carrying that message.

The output tensors go through a file (they can be tens of MB), never through the pipe: the
first call's result, and each timed call's that differs from it bit for bit. The verdict is
not computed here: the parent compares every one of them with the reference.
"""
from __future__ import annotations

import argparse
import faulthandler
import math
import operator
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from functools import partial
from typing import Any, Callable

from conformance.process_gc import imported_for_good, warming_up
from conformance.protocol import (WORKER_PID_ENV, CaseRequest, DoneEvent, ErrorEvent, Event,
                                  Outcome, Phase, PhaseEvent, ReadyEvent, Timings, encode_event,
                                  host_result, same_result, save_output)

#: Lower case. The Neuron runtime's device allocator says "NRT allocation failed for size N
#: (OOM)" and its host one "Failed to allocate host memory" (torch-neuronx source [SRC],
#: NeuronCachingAllocator.cpp and ErrorHandler.cpp; docs/backends.md, section Neuron).

Emit = Callable[[Event], None]


def classify_exception(exc: BaseException, backend=None) -> Outcome:
    """The kind of a failure: oom, unsupported (upstream's own sentence, matched whole:
    conformance.compat.UNSUPPORTED_SENTENCES), exec-timeout (the device runtime's own
    execution timeout, as ``backend`` recognises it), exec-error (the device runtime failed
    running compiled code: a RUNTIME_ERROR even when the first call's asynchronous execution
    surfaces it in the compile phase) or error."""
    from conformance.compat import unsupported_sentence

    from records.errors import is_disk_full, is_out_of_memory

    if is_out_of_memory(exc):
        return Outcome.OOM
    if is_disk_full(exc):
        return Outcome.DISK_FULL
    if unsupported_sentence(exc):
        return Outcome.UNSUPPORTED
    if backend is not None and _recognised(backend.is_execution_timeout, exc):
        return Outcome.EXEC_TIMEOUT
    if backend is not None and _recognised(backend.is_execution_error, exc):
        return Outcome.EXEC_ERROR
    return Outcome.ERROR


def _recognised(recogniser, exc: BaseException) -> bool:
    try:
        return bool(recogniser(exc))
    except Exception:  # noqa: BLE001 - a broken recogniser leaves the error an error
        return False


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` for the unsupported mapping (exact text) and for one-line summaries.
    Where Dynamo says only "Observed exception" (the traced code raised, and Dynamo raised its
    own error from that), what the code raised joins the first line: ``Unsupported: Observed
    exception: raised exception ValueError('Expect query and key/value to have the same number
    of heads ...')``; the record's one-line summary would otherwise not say why."""
    text = str(exc).strip()
    observed = _observed_by_dynamo(exc)
    if observed and observed not in text.split("\n", 1)[0]:
        first, _, rest = text.partition("\n")
        text = (f"{first}: {observed}" if first else observed) + (f"\n{rest}" if rest else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _observed_by_dynamo(exc: BaseException) -> str:
    """The text of the first of Dynamo's ObservedException among what ``exc`` was raised from
    (its ``__cause__`` chain), "" where there is none."""
    seen = 0
    cause = exc.__cause__
    while cause is not None and seen < 8:
        kind = type(cause)
        if kind.__module__.startswith("torch._dynamo") and any(
                base.__name__ == "ObservedException" for base in kind.__mro__):
            return str(cause).strip().split("\n", 1)[0]
        cause, seen = cause.__cause__, seen + 1
    return ""


class CaseFailed(Exception):
    def __init__(self, phase: Phase, outcome: Outcome, exc: BaseException):
        super().__init__(phase.value)
        self.phase, self.outcome, self.exc = phase, outcome, exc


def _guard(phase: Phase, fn: Callable[[], Any], harness: bool = False, backend=None) -> Any:
    """``fn()``; its exception as a CaseFailed of ``phase``: the suite's fault where
    ``harness`` (the suite's own code: inputs, mods), except running out of memory, which is
    never the suite's or the mod's fault (docs/labels.md), else as classify_exception says."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a labelled event
        from records.errors import is_disk_full, is_out_of_memory

        outcome = (Outcome.OOM if harness and is_out_of_memory(exc)
                   else Outcome.DISK_FULL if harness and is_disk_full(exc)
                   else Outcome.HARNESS if harness else classify_exception(exc, backend))
        raise CaseFailed(phase, outcome, exc) from exc


def warm_up_backend(backend, pristine) -> tuple[float, str | None, str | None]:
    """The backend's warm-up, as a child runs it before its first case (a reproduction script
    too): its seconds, the error it raised (logged; the executor repeats it in the message of
    each case of the child that fails) and why no case can run (a FatalSetupError). Torch's
    global settings that loading or warming up the backend changed from ``pristine`` are set
    back, said on stderr, and count as its error."""
    from cases import torch_state
    from conformance.backends.base import FatalSetupError

    start, warm_error, fatal = time.perf_counter(), None, None
    try:
        with warming_up():  # conformance/process_gc.py
            backend.warm_up()
    except FatalSetupError as exc:  # no case can run or be timed honestly in this child
        fatal = f"the suite cannot run {backend.name} here: {describe_exception(exc)}"
        traceback.print_exc()
    except Exception as exc:  # noqa: BLE001 - a broken compiler shows up in the cases
        warm_error = describe_exception(exc)
        traceback.print_exc()
    leaked = torch_state.changes(pristine, torch_state.snapshot())
    if leaked:  # at import or warm-up: set back before any case, said in the child's log
        torch_state.restore(pristine)
        print(f"flexconf: loading and warming up the backend changed torch's global settings "
              f"({'; '.join(leaked)}); set back: every case runs under torch's defaults",
              file=sys.stderr)
        warm_error = warm_error or f"changed torch's global settings: {'; '.join(leaked)}"
    return time.perf_counter() - start, warm_error, fatal


def run_case(backend, request: CaseRequest, emit: Emit, fatal: str | None = None) -> None:
    """Run one case; emits phase events and exactly one ``DoneEvent`` or ``ErrorEvent`` (the
    error carries the seconds of the phases that finished). ``fatal``: why this child can
    run no case (a FatalSetupError at warm-up)."""
    from cases import torch_state

    timings: dict[str, Any] = {}
    if fatal:
        emit(ErrorEvent(Phase.SETUP, Outcome.HARNESS, fatal))
        return
    _import_case_modules(request)  # what they set when imported is theirs, not the backend's
    before = torch_state.snapshot()
    try:
        try:
            output_path = _run_phases(backend, request, emit, timings)
        finally:
            leaked = torch_state.changes(before, torch_state.snapshot())
            kept = torch_state.restore(before)  # the next case runs as it would alone
        if leaked:
            phase = Phase.COMPILE if request.compile_only else Phase.RUN
            raise CaseFailed(phase, Outcome.ERROR, _left_changed(leaked, kept))
        emit(DoneEvent(Timings(**timings), output_path))
    except CaseFailed as failed:
        traceback.print_exception(failed.exc)  # into the child's log, kept with the artefacts
        detail = "".join(traceback.format_exception(failed.exc)[-12:])
        message = describe_exception(failed.exc)
        if failed.outcome is Outcome.UNSUPPORTED:  # upstream's words, unwrapped from Dynamo's or Inductor's
            from conformance.compat import unsupported_sentence

            sentence = unsupported_sentence(failed.exc)
            if not str(failed.exc).strip().startswith(sentence):
                message = sentence
        emit(ErrorEvent(failed.phase, failed.outcome, message, detail, Timings(**timings)))


def _import_case_modules(request: CaseRequest) -> None:
    """Import the request's case modules before the case's settings are taken (a module that
    sets one when imported sets it for every case alike); an error is left to the setup
    phase, which imports them again and labels it."""
    from cases.custom import import_case_modules

    try:
        import_case_modules(list(request.cases_modules))
    except Exception:  # noqa: BLE001 - _run_phases meets it again and labels the case
        pass


def _left_changed(leaked: list[str], kept: list[str]) -> Exception:
    from conformance.contract import ContractError

    undone = (f"the suite set them back for the next case, all but {', '.join(kept)} (which "
              "cannot be set back from outside)" if kept
              else "the suite set them back for the next case")
    return ContractError(
        f"the backend left torch's global settings changed after the case: {'; '.join(leaked)}; "
        f"a backend sets back what it changes (docs/backends.md, 'Stateless between cases'), "
        f"and {undone}")


def _run_phases(backend, request: CaseRequest, emit: Emit, timings: dict) -> str | None:
    """The phases of one case; fills ``timings``, returns the output file (None when the
    request is compile-only)."""
    import torch

    from cases.custom import import_case_modules
    from cases.inputs import make_grad_output, make_inputs
    from cases.model import Case
    from cases.variants import build_mods
    from conformance.contract import check_result, gradients_or_zeros

    setup = Phase.SETUP
    emit(PhaseEvent(setup))
    start = time.perf_counter()
    _guard(setup, lambda: import_case_modules(list(request.cases_modules)), harness=True)
    case = _guard(setup, lambda: Case.from_json(request.case), harness=True)
    _guard(setup, _forget_earlier_cases_graphs, harness=True)
    on_device = partial(_guard, setup, backend=backend)  # a CUDA fault: EXEC_ERROR, new child
    on_device(lambda: backend.begin_case(request.cache_dir, request.cold))
    device = on_device(backend.device)
    seed = request.seed
    inputs = _guard(setup, lambda: make_inputs(case, seed), harness=True)
    mods = _guard(setup, lambda: build_mods(case.variant, case.shape, device), harness=True)
    inputs = on_device(lambda: inputs.to(device))
    backward = case.mode == "fwd+bwd"
    grad_out = on_device(lambda: make_grad_output(case, seed).to(device)) if backward else None
    mask = on_device(lambda: _block_mask(case, mods, device))
    fn = on_device(lambda: backend.prepare(case))
    timings["setup_seconds"] = time.perf_counter() - start

    def call():  # every result is checked: a wrong structure is the call's phase's error
        if not backward:
            result = fn(inputs.q, inputs.k, inputs.v, mods.score_mod, mask)
            backend.synchronize()
            return check_result(case, result, inputs.q.dtype, device)
        q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        out = check_result(case, fn(q, k, v, mods.score_mod, mask), inputs.q.dtype, device)
        grads = gradients_or_zeros(torch.autograd.grad(out, (q, k, v), grad_out,
                                                       allow_unused=True), (q, k, v))
        backend.synchronize()
        return out, dict(zip(("dq", "dk", "dv"), grads))

    emit(PhaseEvent(Phase.COMPILE))
    start = time.perf_counter()
    result = _guard(Phase.COMPILE, call, backend=backend)
    timings["compile_seconds"] = time.perf_counter() - start
    timings["cache_hit"] = _cache_hit(backend)
    timings["compile_breakdown"] = _compile_breakdown(backend, timings["compile_seconds"])
    timings["compiled_bytes"] = _compiled_bytes(backend)
    if request.compile_only:
        _refuse_fallbacks(backend, Phase.COMPILE)
        return None

    def on_host(phase: Phase, result):  # a copy: the backend may reuse its buffers
        return _guard(phase, lambda: host_result(case.mode, result), backend=backend)

    first = on_host(Phase.COMPILE, result)
    del result

    # Every call is judged, not only one: a call whose result differs from the first call's
    # bit for bit is kept too (a first call that reads uninitialised memory, a race in one
    # timed call); the copy and comparison run outside the timed window.
    emit(PhaseEvent(Phase.RUN))
    times, differing = [], []
    for number in range(2, 2 + max(1, request.runs)):
        start = time.perf_counter()
        result = _guard(Phase.RUN, call, backend=backend)
        times.append(time.perf_counter() - start)
        later = on_host(Phase.RUN, result)
        if not _guard(Phase.RUN, lambda: same_result(later, first), backend=backend):
            differing.append((number, later))
        result = later = None  # freed before the next call
    _refuse_fallbacks(backend, Phase.RUN)
    output_path = request.output_path
    calls = len(times) + 1
    _guard(Phase.RUN, lambda: save_output(output_path, first, differing, calls), harness=True)
    timings["run_seconds"] = statistics.median(times)
    return output_path


def _cache_hit(backend) -> bool | None:
    """Whether the compile hit a cache; unknown (None) when the backend cannot say, or fails
    to: a broken counter must not turn a compiled case into a crash. A numpy or torch bool
    (a comparison of counters) counts as the bool it is; anything else is not an answer."""
    try:
        hit = backend.cache_hit()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return None
    import torch

    if hit is None or isinstance(hit, bool):
        return hit
    if type(hit).__name__ in ("bool_", "bool") or (  # numpy's bool (1.x, 2.x)
            isinstance(hit, torch.Tensor) and hit.numel() == 1 and hit.dtype == torch.bool):
        return bool(hit)
    print(f"cache_hit() returned {type(hit).__name__} {str(hit)[:80]!r}, not a bool or None: "
          "recorded as unknown", file=sys.stderr)
    return None


def _compiled_bytes(backend) -> int | None:
    """The size of what the compiler made, when the backend says; a non-negative whole number
    (a numpy or torch integer counts as its value), else unknown: a broken hook must not turn
    a compiled case into a crash."""
    try:
        size = backend.compiled_bytes()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return None
    if size is None:
        return None
    try:
        whole = operator.index(size)  # int, numpy and torch integers; not bool, float or text
    except TypeError:
        whole = None
    if isinstance(size, bool) or whole is None or whole < 0:
        print(f"compiled_bytes() returned {type(size).__name__} {str(size)[:80]!r}, not a "
              "whole number of bytes: recorded as unknown", file=sys.stderr)
        return None
    return int(whole)


#: How far the stages a backend reports may sum past the compile phase (clock granularity;
#: docs/performance.md states the stages and ``other`` sum to the phase within 2%).
BREAKDOWN_TOLERANCE = 0.02


def _compile_breakdown(backend, compile_seconds: float) -> dict[str, float] | None:
    """The compiler's own stage times for the first call, plus ``other``: the rest of the
    compile phase (tracing the suite's call, the execution, waiting), so the stages always
    sum to the phase. None when the backend does not report stages, fails to, or reports
    stages that sum past the phase (beyond BREAKDOWN_TOLERANCE)."""
    try:
        stages = backend.compile_breakdown()
        if not stages:
            return None
        breakdown = {str(name): _stage_seconds(seconds) for name, seconds in stages.items()}
    except Exception:  # noqa: BLE001 - a broken counter must not fail a compiled case
        traceback.print_exc()
        return None
    stages_seconds = sum(breakdown.values())
    if not math.isfinite(stages_seconds) or \
            stages_seconds > compile_seconds * (1 + BREAKDOWN_TOLERANCE) + 0.01:
        print(f"compile_breakdown() ignored: its stages sum to {stages_seconds:.3f} s, more "
              f"than the compile phase's {compile_seconds:.3f} s", file=sys.stderr)
        return None
    breakdown["other"] = max(0.0, compile_seconds - stages_seconds)
    return breakdown


def _stage_seconds(seconds) -> float:
    """A stage's seconds: a finite number >= 0 (an int or a float, numpy's included; not a
    bool, not text); ValueError otherwise, and the breakdown is not recorded."""
    import numbers

    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) \
            or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"compile_breakdown() gave a stage {seconds!r}, not a number of "
                         "seconds >= 0: not recorded")
    return float(seconds)


def _refuse_fallbacks(backend, phase: Phase) -> None:
    """A case whose operations ran on the host instead of the device fails: its numbers and
    times are not the backend's (COMPILE_ERROR, the compiler did not take the graph)."""
    ops = _guard(phase, backend.fallback_ops)
    if ops:
        names = ", ".join(sorted(set(map(str, ops))))
        raise CaseFailed(Phase.COMPILE, Outcome.ERROR, RuntimeError(
            f"{len(ops)} operation(s) fell back to the CPU instead of running on the device: "
            f"{names}; a case that ran on the host cannot pass"))


def _forget_earlier_cases_graphs() -> None:
    """Each case is a program's first call, whatever the backend (eager flex_attention traces
    with Dynamo too): otherwise a case was a recompile of an earlier one's graph, its changed
    shapes and captured floats symbolic, and its label hung on the cases before it (torch 2.15.0
    fails that recompile when a captured float changed: docs/findings.md, finding 10)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


def _block_mask(case, mods, device):
    """The case's BlockMask, or None. Built per batch or per head only when the mask depends
    on them; per batch when key/value are broadcast over the batch (flex_attention requires a
    block mask of the query batch then, so an unmasked variant gets a no-op one)."""
    from torch.nn.attention.flex_attention import noop_mask

    from cases.pointwise import mask_dependence
    from conformance import compat
    from conformance.estimates import block_mask_batch_heads

    shape = case.shape
    mask_mod = mods.mask_mod or (noop_mask if shape.Bkv != shape.B else None)
    if mask_mod is None:
        return None
    b, h = block_mask_batch_heads(shape, mask_dependence(mask_mod, device))
    return compat.block_mask(mask_mod, b, h, shape.Sq, shape.Skv, device)


#: How often the watchdog looks at its parents (seconds).
_WATCH_SECONDS = 0.2


def _die_with_parent() -> None:
    """When the pytest worker dies (SIGKILL, the OOM killer, xdist's teardown), this child dies
    too, and so do its compiler processes. The kernel kills the child when its parent exits
    (Linux: PR_SET_PDEATHSIG with SIGKILL, which no call the child is stuck in can delay). A
    watchdog forked into the child's process group (which the child leads) kills the whole
    group as soon as the child is gone or the worker is: it is single-threaded and idle, so
    nothing the child runs can hold it up, and it also ends the compiler processes of a child
    that exits normally. Called before torch is imported: the fork must see no other thread."""
    worker = int(os.environ.get(WORKER_PID_ENV) or os.getppid())
    try:  # Linux: the kernel sends SIGKILL when the parent exits
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != worker:  # the worker was gone before the kernel was told to watch it
        os.killpg(0, signal.SIGKILL)
    child = os.getpid()
    if os.fork() == 0:
        _watch(child, worker)


def _watch(child: int, worker: int) -> None:
    """The watchdog's life: no file of the child's held open (the supervisor sees the child's
    events pipe close when the child dies), then a look every _WATCH_SECONDS."""
    try:
        os.closerange(3, min(os.sysconf("SC_OPEN_MAX"), 1 << 16))
        while os.getppid() == child and _alive(worker):
            time.sleep(_WATCH_SECONDS)
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now holds the number: ours is gone
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.child")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--events-fd", type=int, required=True)
    args = parser.parse_args(argv)
    events = os.fdopen(args.events_fd, "w", buffering=1)
    lock = threading.Lock()

    def emit(event: Event) -> None:
        with lock:
            events.write(encode_event(event) + "\n")
            events.flush()

    faulthandler.enable()  # a segfault leaves a Python traceback in the log
    _die_with_parent()
    with imported_for_good():  # conformance/process_gc.py
        import torch

        from cases import torch_state
        from conformance.backends.registry import load_backend

        threads = int(os.environ.get("FLEXCONF_NUM_THREADS", "0"))
        if threads > 0:
            torch.set_num_threads(threads)
        pristine = torch_state.snapshot()  # what every case runs under
        backend = load_backend(args.backend)
    emit(PhaseEvent(Phase.WARM_UP))
    seconds, warm_error, fatal = warm_up_backend(backend, pristine)
    emit(ReadyEvent(os.getpid(), seconds, warm_error, fatal))
    for line in sys.stdin:
        if line.strip():
            run_case(backend, CaseRequest.decode(line), emit, fatal)
            sys.stdout.flush()
            sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
