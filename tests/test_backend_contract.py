"""The backend contract of each mode (conformance/contract.py, docs/backends.md), checked by
the child: a wrong structure is the backend's error in the phase of the call that broke it,
with a message quoting the contract; a correct result of every mode passes the check."""
from __future__ import annotations

import pytest
import torch

from cases.model import Case, Shape, Variant
from conformance import child
from conformance.backends.cpu import CpuEager
from conformance.backends.registry import load_backend
from conformance.contract import CONTRACT, ContractError, check_result
from conformance.protocol import CaseRequest, DoneEvent, ErrorEvent, Outcome, Phase, Timings, label_of, observation_of
from records.results import Label
from tests.test_executor_faults import run_cases

SHAPE = Shape(2, 4, 2, 40, 24, 8)  # B=2: an unchecked ``out, lse = out`` would split the batch


def run_in_process(backend, case: Case, tmp_path):
    """The child's phases for one case, in this process: its last event."""
    events: list = []
    child.run_case(backend, CaseRequest(case.to_json(), str(tmp_path / "out.pt")), events.append)
    return events[-1]


@pytest.mark.parametrize("backend, mode, phase, problem", [
    ("OutputOnlyInLseMode", "fwd+lse", "compile", "fwd+lse: fn returned a single tensor;"),
    ("TupleInFwdMode", "fwd", "compile", "fwd: the output is a tuple, not a tensor;"),
    ("HeadsAndRowsSwapped", "fwd", "compile",
     "fwd: the output has shape [2, 40, 4, 8], expected [2, 4, 40, 8];"),
    ("Float32Output", "fwd", "compile",
     "fwd: the output has dtype torch.float32, expected torch.bfloat16 (the inputs');"),
    ("ReshapedOnLaterCalls", "fwd", "run", "fwd: the output has shape [2, 40, 4, 8]"),
    ("SparseOutput", "fwd", "compile",
     "fwd: the output has layout torch.sparse_coo, expected a dense tensor (torch.strided);"),
    ("DetachedInBackwardMode", "fwd+bwd", "compile",
     "fwd+bwd: the output does not require grad (it is not connected to q, k, v);"),
])
def test_a_broken_structure_is_the_backends_error_quoting_the_contract(
        tmp_path, backend, mode, phase, problem):
    case = Case(Variant("causal"), SHAPE, "bf16", mode)
    event = run_in_process(load_backend(f"tests.contract_fault_backends:{backend}"), case, tmp_path)
    assert isinstance(event, ErrorEvent) and event.outcome is Outcome.ERROR, event
    assert event.phase is Phase(phase)
    assert event.message.startswith("ContractError: " + problem), event.message
    assert event.message.endswith(f"the backend contract (docs/backends.md): {CONTRACT[mode]}")
    expected = Label.COMPILE_ERROR if phase == "compile" else Label.RUNTIME_ERROR
    assert label_of(observation_of(event, Timings())) is expected
    assert not (tmp_path / "out.pt").exists()  # nothing reaches the verdict


@pytest.mark.slow
def test_the_lse_split_is_a_compile_error_record_and_the_next_case_passes():
    broken = Case(Variant("causal"), SHAPE, "fp32", "fwd+lse")
    healthy = Case(Variant("full"), SHAPE, "fp32", "fwd")
    fault, after = run_cases("tests.contract_fault_backends:OutputOnlyInLseMode", [broken, healthy])
    assert fault.label is Label.COMPILE_ERROR, fault.message
    assert fault.message.startswith("compile: ContractError: fwd+lse: fn returned a single tensor")
    assert fault.metrics is None  # never judged
    assert after.label is Label.PASS, after.message


@pytest.mark.parametrize("mode", ["fwd", "fwd+lse"])
def test_a_correct_result_of_each_mode_keeps_the_contract(tmp_path, mode):
    case = Case(Variant("alibi"), SHAPE, "fp16", mode)
    event = run_in_process(CpuEager(), case, tmp_path)
    assert isinstance(event, DoneEvent), event
    saved = torch.load(tmp_path / "out.pt", weights_only=True)
    assert saved["out"].shape == (2, 4, 40, 8) and saved["out"].dtype == torch.float16
    assert ("lse" in saved) is (mode == "fwd+lse")


def test_a_differentiable_output_keeps_the_backward_contract():
    q, k, v = (torch.randn(2, 4, 40, 8, requires_grad=True) for _ in range(3))
    out = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    case = Case(Variant("full"), Shape(2, 4, 4, 40, 40, 8), "fp32", "fwd+bwd")
    assert check_result(case, out, torch.float32, "cpu") is out
    with pytest.raises(ContractError, match=r"fwd\+bwd: the output is on device meta, expected cpu"):
        check_result(case, out.to("meta"), torch.float32, "cpu")
    with pytest.raises(ContractError, match=r"fwd\+lse: fn returned a tuple of 3 items;"):
        check_result(Case(Variant("full"), case.shape, "fp32", "fwd+lse"), (out, out, out),
                     torch.float32, "cpu")


def test_what_a_backend_reports_about_its_compile_never_costs_the_case(tmp_path):
    """A numpy bool from cache_hit() was a CRASH (the child could not write it), an int was
    written into a results.json that the suite's own reader then refused, and stages given
    as text were a CRASH; stages summing past the compile phase were kept, with other = 0.
    Each reporting backend's report on a case of its own, in one child (ReportsByCase)."""
    from records.results import RunResults, load_results, write_results

    from tests.contract_fault_backends import REPORTERS, reporter_length
    from tests.test_backends_cpu import execute

    expected = {"NumpyCacheHit": (True, None), "TensorCacheHit": (False, None),
                "NumpySize": (None, 4096)}  # the others: (None, None)
    cases = [Case(Variant("causal"), Shape(1, 2, 2, reporter_length(i), reporter_length(i), 16))
             for i in range(len(REPORTERS))]
    records = execute("tests.contract_fault_backends:ReportsByCase", cases)
    options = {"backend": "test-reports-by-case", "profile": "smoke", "seed": 0}
    write_results(RunResults({"backend": "test-reports-by-case"}, options, tuple(records),
                             "0.1.0"), tmp_path / "results.json")
    loaded = load_results(tmp_path / "results.json").records
    for reporter, record, read in zip(REPORTERS, records, loaded, strict=True):
        cache_hit, size = expected.get(reporter.__name__, (None, None))
        assert record.label is Label.PASS, (reporter.__name__, record.message)
        assert record.cache_hit is cache_hit, reporter.__name__
        assert record.compile_breakdown is None, reporter.__name__
        assert record.compiled_bytes == size and type(record.compiled_bytes) is type(size), \
            reporter.__name__
        assert read.cache_hit is cache_hit and read.compiled_bytes == size, reporter.__name__


def test_torchs_out_of_memory_error_is_out_of_memory_whatever_its_text():
    """A plugin raising torch.OutOfMemoryError("zap HBM exhausted ...") was a RUNTIME_ERROR:
    the class is a RuntimeError, and only its text was read."""
    from conformance.protocol import Outcome

    class VendorOutOfMemory(torch.OutOfMemoryError):
        pass

    backend = CpuEager()
    for exc in (torch.OutOfMemoryError("zap HBM exhausted (tried to allocate 8 GiB)"),
                VendorOutOfMemory("pool 3 is full"), MemoryError()):
        assert child.classify_exception(exc, backend) is Outcome.OOM, exc
    assert child.classify_exception(RuntimeError("zap HBM exhausted"), backend) \
        is not Outcome.OOM


@pytest.mark.parametrize("backend, warmed", [("PrepareLog", True),
                                             ("PrepareLogDecliningCausal", False)])
def test_a_backend_without_its_own_warm_up_warms_up_through_its_prepare(
        tmp_path, monkeypatch, backend, warmed):
    """docs/execution.md promises a warm-up compile in every new child; a plugin that did not
    override warm_up() got none, and its first case's compile paid the start-up (1.44 s
    against 0.14-0.33 s in an outside trial)."""
    from conformance.backends.base import WARM_UP_CASE
    from tests.test_backends_cpu import execute

    log = tmp_path / "prepared.txt"
    monkeypatch.setenv("FLEXCONF_TEST_PREPARE_LOG", str(log))
    case = Case(Variant("full"), Shape(1, 2, 2, 64, 64, 16))
    (record,) = execute(f"tests.contract_fault_backends:{backend}", [case])
    assert record.label is Label.PASS, record.message
    calls = log.read_text().split()
    assert calls[0] == (WARM_UP_CASE.id if warmed else case.id)
    assert calls[-1] == case.id and len(calls) == (5 if warmed else 4)  # 1 + 3 timed calls


@pytest.mark.parametrize("answer, reason", [
    (None, None), (False, None), ("", None), ("fwd only", "fwd only"),
    (True, "unsupported_reason returned bool True; it should return a str that says why"),
])
def test_what_unsupported_reason_answers_is_read_as_the_docs_say(answer, reason):
    """True was recorded as the reason "True"."""
    from conformance.backends.registry import unsupported_reason_of

    class Answers(CpuEager):
        def unsupported_reason(self, case):
            return answer

    case = Case(Variant("causal"), Shape(1, 2, 2, 64, 64, 16))
    assert unsupported_reason_of(Answers(), case) == (reason, None)


class _WithoutGqa(CpuEager):
    """The docs' first backend as once written: flex_attention compiled without enable_gqa."""

    name = "without-gqa"

    def prepare(self, case):
        from torch.nn.attention.flex_attention import flex_attention

        compiled = torch.compile(flex_attention, backend="eager", fullgraph=True)
        return lambda q, k, v, score_mod, block_mask: compiled(
            q, k, v, score_mod=score_mod, block_mask=block_mask)


def test_what_the_traced_code_raised_is_on_the_first_line_of_dynamos_observed_exception(tmp_path):
    """Dynamo's error says "Observed exception" on its first line, and what flex_attention
    raised only further down: the record's one-line summary did not say why (an outside
    walkthrough of docs/backends.md)."""
    torch._dynamo.reset()
    event = run_in_process(_WithoutGqa(), Case(Variant("full"), SHAPE, "fp32"), tmp_path)
    assert isinstance(event, ErrorEvent), event
    first = event.message.splitlines()[0]
    assert "Observed exception: raised exception ValueError(" in first, first
    assert "Try setting enable_gqa=True" in first, first


def test_inputs_too_large_for_the_host_are_out_of_memory_not_the_suites_fault(tmp_path):
    """Building the inputs is the suite's code, but running out of memory there is the host's
    limit, not a bug to fix in the suite (docs/labels.md): an outside audit found such a case
    labelled HARNESS_ERROR. q here needs 2^49 bytes, beyond any x86-64 or arm64 process's
    address space, so the allocation fails at once whatever the machine's overcommit policy."""
    huge = Case(Variant("causal"), Shape(1, 8, 8, 2 ** 30, 64, 2 ** 14), "fp32", "fwd")
    last = run_in_process(CpuEager(), huge, tmp_path)
    assert isinstance(last, ErrorEvent)
    assert (last.phase, last.outcome) == (Phase.SETUP, Outcome.OOM), last
    assert label_of(last) is Label.OUT_OF_MEMORY


@pytest.mark.parametrize("error, outcome", [
    (MemoryError(), Outcome.OOM),  # a mod's builder allocating its tables, saving the output
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB"),
     Outcome.OOM),
    (IndexError("index 9 is out of bounds"), Outcome.HARNESS)])
def test_the_suites_own_steps_are_its_fault_unless_memory_ran_out(error, outcome):
    def step():
        raise error

    with pytest.raises(child.CaseFailed) as caught:
        child._guard(Phase.SETUP, step, harness=True)
    assert (caught.value.phase, caught.value.outcome) == (Phase.SETUP, outcome)
