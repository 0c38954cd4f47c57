"""The worker-child link: every record survives its encoding, a foreign version is refused in
one line, and the one outcome-to-label table covers every outcome."""
from __future__ import annotations

import json

import pytest

from conformance.protocol import (PROTOCOL_VERSION, CaseRequest, DoneEvent, ErrorEvent,
                                  Observation, Outcome, Phase, PhaseEvent, ProtocolError,
                                  ReadyEvent, Timings, decode_event, encode_event, label_of,
                                  observation_of)
from records.labels import Label

EVENTS = [
    PhaseEvent(Phase.COMPILE),
    ReadyEvent(123, 1.5, None, "the suite cannot run x here"),
    DoneEvent(Timings(0.1, 2.0, 0.01, False, {"neuronx-cc": 1.5, "other": 0.5}), "/tmp/o.pt"),
    ErrorEvent(Phase.RUN, Outcome.OOM, "MemoryError: x\udc80", "Traceback ...",
               Timings(setup_seconds=0.2)),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_survives_its_encoding(event):
    line = encode_event(event)
    assert "\n" not in line and json.loads(line)["v"] == PROTOCOL_VERSION
    assert decode_event(line) == event
    assert decode_event(line.encode("ascii")) == event  # what the pipe carries: bytes


def test_a_request_survives_its_encoding():
    request = CaseRequest({"variant": "causal"}, "/tmp/out.pt", seed=7, runs=5, cold=False,
                          cache_dir="/c", cases_modules=("m1", "m2"), compile_only=True)
    assert CaseRequest.decode(request.encode()) == request


def test_another_version_or_garbage_is_refused_in_one_line():
    line = json.dumps({"v": PROTOCOL_VERSION + 1, "type": "phase", "phase": "run"})
    with pytest.raises(ProtocolError, match="different suite versions") as err:
        decode_event(line)
    assert "\n" not in str(err.value)
    with pytest.raises(ProtocolError, match="not a protocol line"):
        decode_event("Segmentation fault")
    with pytest.raises(ProtocolError, match="expected a request"):
        CaseRequest.decode(encode_event(PhaseEvent(Phase.RUN)))


@pytest.mark.parametrize("outcome", list(Outcome))
@pytest.mark.parametrize("phase", list(Phase))
def test_every_outcome_in_every_phase_has_exactly_one_label(outcome, phase):
    label = label_of(Observation(outcome, phase))
    assert (label is None) is (outcome is Outcome.OK)
    assert label is None or isinstance(label, Label)


def test_the_final_event_makes_the_observation_with_the_childs_figures_first():
    measured = Timings(setup_seconds=9.0, compile_seconds=9.0)
    error = ErrorEvent(Phase.COMPILE, Outcome.ERROR, "RuntimeError: boom", "tb",
                       Timings(setup_seconds=0.5))
    obs = observation_of(error, measured)
    assert obs.timings.setup_seconds == 0.5 and obs.timings.compile_seconds == 9.0
    assert obs.message == "compile: RuntimeError: boom\ntb"
    assert label_of(obs) is Label.COMPILE_ERROR
    unsupported = observation_of(ErrorEvent(Phase.COMPILE, Outcome.UNSUPPORTED, "words"), measured)
    assert unsupported.message == "words" and label_of(unsupported) is Label.UNSUPPORTED


def test_same_result_is_bit_for_bit():
    import torch

    from conformance.protocol import same_result

    x = torch.tensor([1.0, float("nan"), 0.0], dtype=torch.bfloat16)
    assert same_result({"out": x}, {"out": x.clone()})  # NaN equals itself, bit for bit
    assert not same_result({"out": x}, {"out": torch.tensor([1.0, float("nan"), -0.0],
                                                            dtype=torch.bfloat16)})
    other_nan = x.clone()
    other_nan.view(torch.int16)[1] += 1  # another NaN payload
    assert torch.isnan(other_nan[1]) and not same_result({"out": x}, {"out": other_nan})
    assert not same_result({"out": x}, {"out": x.float()})
    assert not same_result({"out": x}, {"out": x[:2]})
    lse = torch.zeros(3)
    assert not same_result({"out": x, "lse": lse}, {"out": x})
    grads = {"dq": x, "dk": None, "dv": x}
    assert same_result({"out": x, "grads": grads}, {"out": x, "grads": dict(grads)})
    assert not same_result({"out": x, "grads": grads}, {"out": x, "grads": {**grads, "dk": x}})
