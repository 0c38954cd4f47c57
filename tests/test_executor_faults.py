"""Every label from a misbehaving test backend, and the case after each fault still passes.

Each backend of tests/fault_backends.py is cpu-eager except on the ``causal`` case, where it
fails in one phase in one way. The run is [causal, full] in one Executor: the fault, then a
correct case in the same executor (a fresh child when the fault killed the old one).
"""
from __future__ import annotations

import time

import pytest
import torch

from cases.model import Case, Shape, Variant
from conformance.backends.base import WorkerSlot
from conformance.backends.registry import load_backend
from conformance.executor import Executor, Settings
from conformance.reference_cache import ReferenceCache
from records.results import Label
from tests import fault_backends

TINY = Shape(1, 2, 2, 64, 64, 16)
FAULTY = Case(Variant("causal"), TINY)
HEALTHY = Case(Variant("full"), TINY)


def run_cases(spec: str, cases, compile_timeout=60.0, run_timeout=60.0):
    executor = Executor(load_backend(spec), spec, WorkerSlot(0, 1),
                        Settings(compile_timeout=compile_timeout, run_timeout=run_timeout),
                        ReferenceCache(None, 0), worker="test")
    try:
        return [executor.execute(case) for case in cases]
    finally:
        executor.close()


@pytest.mark.parametrize("backend, label, first_line", [
    ("CompileError", Label.COMPILE_ERROR, "compile: RuntimeError: injected compiler failure"),
    ("RuntimeFault", Label.RUNTIME_ERROR, "run: RuntimeError: injected device fault"),
    ("Segfault", Label.CRASH, "the child process was killed by SIGSEGV during compile"),
    ("Killed", Label.CRASH, "the child process was killed by SIGKILL during run"),
    ("OutOfMemory", Label.OUT_OF_MEMORY, "compile: RuntimeError: [enforce fail"),
    ("WrongNumbers", Label.MISMATCH, ""),
    ("Unsupported", Label.UNSUPPORTED, "this test backend declares causal masks unsupported"),
    ("UnsupportedDevice", Label.UNSUPPORTED,
     "ValueError: FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices. "
     "Found input tensors on neuron device."),
])
@pytest.mark.slow
def test_fault_gets_its_label_and_the_next_case_passes(backend, label, first_line):
    fault, after = run_cases(f"tests.fault_backends:{backend}", [FAULTY, HEALTHY])
    assert fault.label is label, fault.message
    assert fault.message.startswith(first_line)
    assert fault.case_id == FAULTY.id and fault.case == FAULTY.to_json()
    if label is Label.MISMATCH:  # the verdict's numbers and its one-line summary
        assert fault.metrics and fault.message and "\n" not in fault.message
    if label is Label.COMPILE_ERROR:  # the seconds the compiler ran before it failed
        assert fault.compile_seconds is not None and fault.compile_seconds >= 0
    assert after.label is Label.PASS, after.message
    assert after.compile_seconds is not None and after.run_seconds is not None
    assert after.metrics  # a PASS keeps the verdict's numbers too


def test_a_global_setting_left_changed_is_its_cases_fault_and_is_set_back():
    """A backend that left the default dtype at float64 after a passing causal case made the
    next case (rel_bias, whose table the child draws with torch.randn) a MISMATCH 421x the
    baseline's error, and that case's own rerun passed (an outside trial)."""
    biased = Case(Variant("rel_bias", (("nb", 32),)), TINY)
    leak, after, last = run_cases("tests.fault_backends:LeaksDefaultDtype",
                                  [FAULTY, biased, HEALTHY])
    assert leak.label is Label.RUNTIME_ERROR, leak.message
    assert leak.message.splitlines()[0] == (
        "run: ContractError: the backend left torch's global settings changed after the case: "
        "default dtype torch.float32 -> torch.float64; a backend sets back what it changes "
        "(docs/backends.md, 'Stateless between cases'), and the suite set them back for the "
        "next case")
    assert leak.compile_seconds is not None and leak.run_seconds is not None
    assert after.label is Label.PASS and last.label is Label.PASS, after.message


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"),
                    reason="this torch has no fp32_precision API (it came in 2.9)")
def test_settings_of_torchs_newer_precision_api_are_checked_and_set_back_too():
    """Once fp32_precision was set, torch refuses to read the legacy allow_tf32 switch: the
    snapshot raised, and every case of such a backend was a CRASH (an outside review)."""
    polite = run_cases("tests.fault_backends:SavesAndRestoresPrecision", [FAULTY, HEALTHY])
    assert [r.label for r in polite] == [Label.PASS, Label.PASS], [r.message for r in polite]
    warmed = run_cases("tests.fault_backends:SetsFp32PrecisionAtWarmUp", [FAULTY, HEALTHY])
    assert [r.label for r in warmed] == [Label.PASS, Label.PASS], [r.message for r in warmed]
    leak, after = run_cases("tests.fault_backends:LeaksFp32Precision", [FAULTY, HEALTHY])
    assert leak.label is Label.RUNTIME_ERROR, leak.message
    assert "the backend left torch's global settings changed after the case: fp32_precision " \
        "none -> tf32; " in leak.message
    assert after.label is Label.PASS, after.message


@pytest.mark.parametrize("backend, said", [
    ("CompileErrorAfterFailedWarmUp", "RuntimeError: injected warm-up failure: libnrt.so.1 not "
                                      "found"),
    ("CompileErrorAfterWarmUpLeak", "changed torch's global settings: default dtype "
                                    "torch.float32 -> torch.float64"),
])
def test_a_failed_case_says_what_went_wrong_in_its_childs_warm_up(backend, said):
    """A warm-up that raised, or changed torch's settings (set back), was said only in the
    child's log; a failure it may explain now says it on its second line."""
    failed, passed = run_cases(f"tests.fault_backends:{backend}", [FAULTY, HEALTHY])
    assert failed.label is Label.COMPILE_ERROR, failed.message
    lines = failed.message.splitlines()
    assert lines[0] == ("compile: RuntimeError: injected compiler failure: lowering not "
                        "implemented"), lines
    assert lines[1] == f"(the warm-up of this case's backend child: {said})", lines
    assert len(lines) > 2  # the traceback still follows
    assert passed.label is Label.PASS and "warm-up" not in passed.message, passed.message


def test_a_setting_a_case_module_makes_when_imported_is_not_the_backends_leak():
    """A case module setting a torch switch at import failed every case as the backend's
    RUNTIME_ERROR (the child imported it after the settings' snapshot)."""
    from tests import settings_variants
    from tests.test_backends_cpu import execute

    first, second = execute("cpu-eager", [settings_variants.CASE] * 2,
                            cases_modules=("tests.settings_variants",))
    assert first.label is Label.PASS and second.label is Label.PASS, first.message


def test_a_setting_a_variants_builder_leaves_changed_is_the_cases_fault_not_the_backends():
    """A builder that switched the default dtype and never back was the backend's
    RUNTIME_ERROR ("the backend left torch's global settings changed"), and in the worker it
    changed the dtype every later reference was computed in."""
    from tests import settings_variants
    from tests.test_backends_cpu import execute

    leaking, after = execute("cpu-eager", [settings_variants.LEAKING_CASE, settings_variants.CASE],
                             cases_modules=("tests.settings_variants",))
    assert leaking.label is Label.HARNESS_ERROR, leaking.message
    assert leaking.message.splitlines()[0].endswith(
        "the builder of variant 'settings_leaking_builder' left torch's global settings "
        "changed: default dtype torch.float32 -> torch.float64; a builder sets back what it "
        "changes (or sets them when its case module is imported, where they hold for every "
        "case)"), leaking.message
    assert torch.get_default_dtype() is torch.float32  # the worker's, where references run
    assert after.label is Label.PASS, after.message


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie is dead
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("backend, label, phase", [
    ("CompileHang", Label.COMPILE_TIMEOUT, "compile"),
    ("DetachedCompileHang", Label.COMPILE_TIMEOUT, "compile"),
    ("RunHang", Label.RUN_TIMEOUT, "run"),
])
@pytest.mark.slow
def test_hang_is_killed_with_its_process_group(backend, label, phase, tmp_path, monkeypatch):
    pid_file = tmp_path / "grandchild.pid"
    monkeypatch.setenv(fault_backends.GRANDCHILD_PID_FILE, str(pid_file))
    start = time.monotonic()
    fault, after = run_cases(f"tests.fault_backends:{backend}", [FAULTY, HEALTHY],
                             compile_timeout=6.0, run_timeout=6.0)
    assert time.monotonic() - start < 120  # the hang (an hour) was cut short
    assert fault.label is label, fault.message
    assert fault.message.startswith(f"the {phase} phase did not finish within 6 s")
    assert getattr(fault, f"{phase}_seconds") >= 6.0
    assert fault.setup_seconds is not None  # the phases that finished keep their times
    if phase == "run":
        assert fault.compile_seconds is not None and fault.compile_seconds < 6.0
        assert fault.performance is None  # seconds until the kill are no throughput
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(grandchild), "the hung child's own subprocess survived the kill"
    assert after.label is Label.PASS, after.message


@pytest.mark.slow
def test_a_crash_is_a_crash_even_when_a_forked_process_holds_the_pipe():
    """A fork-based helper (compile pool, runtime daemon) inherits the events pipe; the
    child's death must still be seen at once, not as a compile timeout."""
    start = time.monotonic()
    fault, after = run_cases("tests.fault_backends:ForksThenSegfaults", [FAULTY, HEALTHY],
                             compile_timeout=30.0)
    assert fault.label is Label.CRASH, fault.message
    assert "SIGSEGV" in fault.message
    assert time.monotonic() - start < 25  # well before the compile budget ran out
    assert after.label is Label.PASS, after.message


@pytest.mark.parametrize("counted", [True, False])
def test_a_child_the_oom_killer_took_is_out_of_memory_where_any_counter_grew(
        counted, tmp_path, monkeypatch):
    """The kernel's count may be in a file other than the cgroup v2 one (a cgroup v1 host's
    global OOM killer counts only in /proc/vmstat): each counter is read, and a SIGKILL while
    any grew is OUT_OF_MEMORY; a SIGKILL while none did stays a CRASH."""
    from conformance import supervisor

    counter, unread = tmp_path / "vmstat", tmp_path / "absent"
    counter.write_text("oom_kill 7\n")
    monkeypatch.setattr(supervisor, "OOM_KILL_COUNTERS", (str(unread), str(counter)))
    # the test backend counts its own death in a copy nobody reads when it is not counted
    monkeypatch.setenv(fault_backends.OOM_COUNTER_FILE,
                       str(counter if counted else tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").write_text("oom_kill 0\n")
    fault, after = run_cases("tests.fault_backends:KilledByOomKiller", [FAULTY, HEALTHY])
    if counted:
        assert fault.label is Label.OUT_OF_MEMORY, fault.message
        assert fault.message.startswith("the child was killed by the kernel's OOM killer "
                                        "during run")
    else:
        assert fault.label is Label.CRASH, fault.message
        assert fault.message.startswith("the child process was killed by SIGKILL during run")
    assert after.label is Label.PASS, after.message


def test_an_oom_kill_before_the_case_began_does_not_make_its_sigkill_out_of_memory(
        tmp_path, monkeypatch):
    """The counts are read before each case, not when the child started: another process's
    OOM kill during an earlier case of the same child (a sibling worker's, on the host's
    count) does not relabel a later plain SIGKILL (an outside review found it did)."""
    from conformance import supervisor

    counter = tmp_path / "vmstat"
    counter.write_text("oom_kill 7\n")
    monkeypatch.setattr(supervisor, "OOM_KILL_COUNTERS", (str(counter),))
    spec = "tests.fault_backends:Killed"
    executor = Executor(load_backend(spec), spec, WorkerSlot(0, 1),
                        Settings(compile_timeout=60.0, run_timeout=60.0),
                        ReferenceCache(None, 0), worker="test")
    try:
        assert executor.execute(HEALTHY).label is Label.PASS  # the child starts, counts read
        counter.write_text("oom_kill 8\n")  # a kill elsewhere, between the cases
        fault = executor.execute(FAULTY)
    finally:
        executor.close()
    assert fault.label is Label.CRASH, fault.message
    assert fault.message.startswith("the child process was killed by SIGKILL during run")


@pytest.mark.parametrize("backend, failing, differing", [
    ("WrongFirstCall", [1], [2, 3, 4]),
    ("WrongFirstCallOneBuffer", [1], [2, 3, 4]),  # later calls overwrite the returned tensor
    ("WrongThirdCall", [3], [3]),
])
@pytest.mark.slow
def test_every_call_is_judged_so_one_wrong_call_is_a_mismatch(backend, failing, differing):
    fault, after = run_cases(f"tests.fault_backends:{backend}", [FAULTY, HEALTHY])
    assert fault.label is Label.MISMATCH, fault.message
    assert fault.metrics["failing_calls"] == failing, fault.metrics
    assert fault.metrics["differing_calls"] == differing
    passing = ", ".join(str(n) for n in range(1, 5) if n not in failing)
    assert fault.message.startswith(f"call {failing[0]} of 4 failed, {passing} passed")
    assert fault.performance is None  # a wrong answer's speed says nothing
    assert after.label is Label.PASS and "differing_calls" not in after.metrics
    assert after.performance is not None


@pytest.mark.slow
def test_results_that_differ_from_call_to_call_but_are_right_pass():
    """One element one unit in its last place off, another each call: every call is judged
    on its own, and each passes."""
    noisy = Case(Variant("causal"), TINY, "fp32")
    records = run_cases("tests.fault_backends:LastBitNoise", [FAULTY, noisy])
    for record in records:
        assert record.label is Label.PASS, record.message
        assert record.metrics["differing_calls"] == [2, 3, 4]
        assert record.metrics["failing_calls"] == []


def test_an_unsupported_reason_that_never_answers_is_a_timeout_and_the_run_goes_on():
    """It stopped the whole run until the run was interrupted (an outside trial): the hook runs
    in the worker, where no watchdog kills it."""
    from tests import broken_plugins

    alibi = Case(Variant("alibi"), TINY)
    try:
        hung, after = run_cases("tests.broken_plugins:HangsInUnsupportedReason",
                                [alibi, HEALTHY], run_timeout=1.0)
    finally:
        broken_plugins.RELEASE_HUNG_HOOK.set()
    assert hung.label is Label.RUN_TIMEOUT, hung.message
    assert hung.message == (
        "setup: its unsupported_reason did not return within 1 s (the run budget); it runs in "
        "the worker before the case starts, so it must answer at once (docs/backends.md)")
    assert after.label is Label.PASS, after.message


def test_an_unsupported_reason_that_raises_is_the_backends_runtime_error():
    """Not HARNESS_ERROR ("fix the suite"): the backend's own code raised."""
    fault, after = run_cases("tests.broken_plugins:RaisesInUnsupportedReason",
                             [FAULTY, HEALTHY])
    assert fault.label is Label.RUNTIME_ERROR, fault.message
    first, *detail = fault.message.splitlines()
    assert first == ("setup: its unsupported_reason raised KeyError: "
                     "'no support entry for causal'")
    assert any("unsupported_reason" in line for line in detail)  # the traceback's end
    assert after.label is Label.PASS, after.message


def test_each_cold_child_gets_a_process_cache_of_its_own(tmp_path, monkeypatch):
    """A compiler that reads its cache settings once per process gets them per child: after a
    COMPILE_ERROR, a cold run's next child starts with a new directory, so it finds nothing of
    the child before it even where the compiler ignored the cold switch (an outside review:
    one directory per worker, where docs/backends.md promised one per child)."""
    log = tmp_path / "cache.log"
    monkeypatch.setenv("FLEXCONF_TEST_CACHE_LOG", str(log))  # the children inherit it
    records = run_cases("tests.contract_fault_backends:FailsCausalAndShowsItsCache",
                        [HEALTHY, FAULTY, HEALTHY])
    assert [r.label for r in records] == [Label.PASS, Label.COMPILE_ERROR, Label.PASS], \
        [r.message for r in records]
    settings = [line.split()[1] for line in log.read_text().splitlines()]
    assert len(settings) == 3 and all(s.startswith("cold:") for s in settings), settings
    assert settings[0] == settings[1] != settings[2]  # one child until the failure, then a new
