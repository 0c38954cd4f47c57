"""The link between a pytest worker and its child process: requests, events, and the output file.

The worker (``conformance/supervisor.py``) writes one ``CaseRequest`` per case to the child's
stdin; the child (``conformance/child.py``) answers on its events pipe with ``PhaseEvent``s
and exactly one ``DoneEvent`` or ``ErrorEvent`` per request (after a ``ReadyEvent`` once it has
started). Each is one JSON line carrying the protocol version, so a worker and a child of
different suite versions fail with one line instead of misreading each other.

The supervisor turns what it saw into an ``Observation``; ``label_of`` maps an observation's
``Outcome`` to its ``Label``, the one place that mapping is written. The output tensors go
through a file (tens of MB, never the pipe): ``save_output`` and ``load_output`` own its format.
This is dEQP's typed executor link (``xeCommLink``), in Python.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any, Union

from records.labels import Label

PROTOCOL_VERSION = 2  # 2: Outcome.DISK_FULL
#: The environment variable through which the executor tells the child its worker's pid: the
#: child (and its compiler processes) die with that process (conformance/child.py).
WORKER_PID_ENV = "FLEXCONF_WORKER_PID"


class ProtocolError(ValueError):
    """A line that is not an event or request of this protocol version."""


class Phase(str, Enum):
    START = "start"  # the child imports Python, torch and the backend
    WARM_UP = "warm-up"  # the backend's one-time compiler start-up
    SETUP = "setup"  # inputs, mods, block mask, backend preparation
    COMPILE = "compile"  # the first call
    RUN = "run"  # the timed calls, saving the output


class Outcome(str, Enum):
    """What happened to a case, as the child or the watchdog saw it."""

    OK = "ok"  # finished; the verdict decides PASS or MISMATCH
    ERROR = "error"  # an exception in a phase
    TIMEOUT = "timeout"  # the watchdog's budget for a phase ran out
    EXEC_TIMEOUT = "exec-timeout"  # the device runtime's own execution timeout
    EXEC_ERROR = "exec-error"  # the device runtime failed running compiled code (first call too)
    CRASH = "crash"  # the child died
    OOM = "oom"
    UNSUPPORTED = "unsupported"  # upstream's or the backend's own statement
    HARNESS = "harness"  # the suite's fault
    DISK_FULL = "disk-full"  # a write a disk refused for want of room (ENOSPC, EDQUOT)


#: The outcomes that decide a label whatever the phase.
_FIXED_LABELS = {Outcome.EXEC_TIMEOUT: Label.RUN_TIMEOUT, Outcome.EXEC_ERROR: Label.RUNTIME_ERROR,
                 Outcome.CRASH: Label.CRASH,
                 Outcome.OOM: Label.OUT_OF_MEMORY, Outcome.UNSUPPORTED: Label.UNSUPPORTED,
                 Outcome.HARNESS: Label.HARNESS_ERROR, Outcome.DISK_FULL: Label.HARNESS_ERROR}


@dataclass(frozen=True)
class Timings:
    """The seconds of the phases that finished, and what the compiler said of the first call."""

    setup_seconds: float | None = None
    compile_seconds: float | None = None
    run_seconds: float | None = None
    cache_hit: bool | None = None
    compile_breakdown: dict[str, float] | None = None
    compiled_bytes: int | None = None


@dataclass(frozen=True)
class Observation:
    """What the child (or, when it hung or died, the watchdog) reported for one case."""

    outcome: Outcome
    phase: Phase
    message: str = ""  # first line: what happened; further lines: detail (traceback, log tail)
    timings: Timings = Timings()
    output_path: str | None = None  # the output file, saved by the child (outcome ok)


def label_of(obs: Observation) -> Label | None:
    """The label an observation decides by itself; None for ``ok`` (the verdict decides)."""
    outcome, phase = Outcome(obs.outcome), Phase(obs.phase)
    if outcome is Outcome.OK:
        return None
    if outcome in _FIXED_LABELS:
        return _FIXED_LABELS[outcome]
    in_case = phase in (Phase.SETUP, Phase.RUN)
    if outcome is Outcome.TIMEOUT:
        if phase in (Phase.COMPILE, Phase.WARM_UP):
            return Label.COMPILE_TIMEOUT
        return Label.RUN_TIMEOUT if in_case else Label.HARNESS_ERROR
    if phase is Phase.COMPILE:  # Outcome.ERROR
        return Label.COMPILE_ERROR
    return Label.RUNTIME_ERROR if in_case else Label.HARNESS_ERROR


# -- the worker's request -------------------------------------------------------------------
@dataclass(frozen=True)
class CaseRequest:
    case: dict[str, Any]  # Case.to_json()
    output_path: str
    seed: int = 0
    runs: int = 3  # timed calls after the first
    cold: bool = True  # no cache may serve the compile (the backend clears what it can)
    cache_dir: str | None = None  # the compile cache of this case (cold: a fresh, empty one)
    cases_modules: tuple[str, ...] = ()  # imported first: custom variants' builders
    compile_only: bool = False  # --phase compile: stop after the first call

    def encode(self) -> str:
        return _encode("request", asdict(self))

    @classmethod
    def decode(cls, line: str) -> "CaseRequest":
        kind, body = _decode(line)
        if kind != "request":
            raise ProtocolError(f"expected a request, got {kind!r}")
        body["cases_modules"] = tuple(body.get("cases_modules") or ())
        return cls(**_known(cls, body))


# -- the child's events ---------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseEvent:
    phase: Phase


@dataclass(frozen=True)
class ReadyEvent:
    pid: int
    warm_up_seconds: float
    warm_up_error: str | None = None  # the warm-up raised; cases will show it
    fatal: str | None = None  # FatalSetupError: this child can run no case


@dataclass(frozen=True)
class DoneEvent:
    timings: Timings
    output_path: str | None = None  # None in a compile-only pass


@dataclass(frozen=True)
class ErrorEvent:
    phase: Phase
    outcome: Outcome  # ERROR, OOM, UNSUPPORTED, HARNESS, EXEC_TIMEOUT, EXEC_ERROR, DISK_FULL
    message: str  # "Type: first line" (or upstream's unsupported sentence, word for word)
    detail: str = ""  # the traceback's end
    timings: Timings = field(default_factory=Timings)  # of the phases that finished


Event = Union[PhaseEvent, ReadyEvent, DoneEvent, ErrorEvent]
_EVENT_KINDS = {"phase": PhaseEvent, "ready": ReadyEvent, "done": DoneEvent, "error": ErrorEvent}
_KIND_OF = {cls: kind for kind, cls in _EVENT_KINDS.items()}


def encode_event(event: Event) -> str:
    return _encode(_KIND_OF[type(event)], asdict(event))


def decode_event(line: str | bytes) -> Event:
    kind, body = _decode(line)
    cls = _EVENT_KINDS.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown event {kind!r}")
    if "timings" in body:
        body["timings"] = Timings(**_known(Timings, body["timings"] or {}))
    if "phase" in body:
        body["phase"] = Phase(body["phase"])
    if "outcome" in body:
        body["outcome"] = Outcome(body["outcome"])
    return cls(**_known(cls, body))


def observation_of(event: DoneEvent | ErrorEvent, timings: Timings) -> Observation:
    """The observation a final event makes (``timings``: what the supervisor measured, which
    the event's own figures replace where it has them)."""
    merged = replace(timings, **{k: v for k, v in asdict(event.timings).items() if v is not None})
    if isinstance(event, DoneEvent):
        return Observation(Outcome.OK, Phase.RUN, timings=merged, output_path=event.output_path)
    message = event.message
    if event.outcome is not Outcome.UNSUPPORTED:
        message = f"{event.phase.value}: {message}\n{event.detail}".rstrip()
    return Observation(event.outcome, event.phase, message, merged)


def _encode(kind: str, body: dict[str, Any]) -> str:
    return json.dumps({"v": PROTOCOL_VERSION, "type": kind, **body}, default=_enum_value)


def _enum_value(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not part of the protocol")


def _decode(line: str | bytes) -> tuple[str, dict[str, Any]]:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not a protocol line ({exc}): {line[:200]!r}") from None
    if not isinstance(data, dict) or data.get("v") != PROTOCOL_VERSION:
        version = data.get("v") if isinstance(data, dict) else None
        raise ProtocolError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}: the "
                            "worker and the child come from different suite versions; reinstall")
    return data.pop("type", None), {k: v for k, v in data.items() if k != "v"}


def _known(cls, body: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in body.items() if k in names}


# -- the output file ------------------------------------------------------------------------
#: A case's result as the child keeps it on the host: {"out"}, plus "lse" (``fwd+lse``) or
#: "grads" {"dq", "dk", "dv"} (``fwd+bwd``), each tensor a copy of its own.
HostResult = dict


def host_result(mode: str, result) -> HostResult:
    """``result`` as ``conformance.contract.check_result`` left it, copied to the CPU (a copy
    even where it is there already: a backend that writes every call into one buffer must not
    change an earlier call's result)."""
    def copy(tensor):
        return None if tensor is None else tensor.detach().to("cpu", copy=True)

    if mode == "fwd+bwd":
        out, grads = result
        return {"out": copy(out), "grads": {k: copy(g) for k, g in grads.items()}}
    if mode == "fwd+lse":
        out, lse = result
        return {"out": copy(out), "lse": copy(lse)}
    return {"out": copy(result)}


def same_result(a: HostResult, b: HostResult) -> bool:
    """Whether two calls' results are the same bit for bit (NaN payloads and the sign of
    zero included): then one verdict judges both."""
    import torch

    bits_of_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def same(x, y) -> bool:
        if x is None or y is None:
            return x is y
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        bits = bits_of_size[x.element_size()]
        return torch.equal(x.contiguous().view(bits), y.contiguous().view(bits))

    if a.keys() != b.keys() or not all(same(a[k], b[k]) for k in ("out", "lse") if k in a):
        return False
    grads_a, grads_b = a.get("grads"), b.get("grads")
    if grads_a is None or grads_b is None:
        return grads_a is grads_b
    return grads_a.keys() == grads_b.keys() and all(same(grads_a[k], grads_b[k])
                                                    for k in grads_a)


def save_output(path: str, first: HostResult, differing: list[tuple[int, HostResult]],
                calls: int) -> None:
    """Write the result of a case's first call to ``path``, with the results of the later
    calls that differ from it bit for bit (``differing``: (call number, result), the first call
    being call 1, of ``calls`` in all): each is judged (``conformance.decision``)."""
    from reference.outputs import save_whole

    save_whole({**first, "calls": calls,
                "differing_calls": [{"call": n, **r} for n, r in differing]}, path)


@dataclass(frozen=True)
class CallResults:
    """What ``save_output`` wrote, read back: results as ``reference.golden.Reference``."""

    first: Any
    differing: list  # [(call number, Reference)]
    calls: int


def load_output(path: str) -> CallResults:
    import torch

    from reference.golden import Reference

    def reference(saved: dict):
        return Reference(saved["out"], saved.get("lse"), saved.get("grads"))

    saved = torch.load(path, weights_only=True)
    differing = [(int(d["call"]), reference(d)) for d in saved.get("differing_calls", [])]
    return CallResults(reference(saved), differing, int(saved.get("calls", 1)))
