"""Test-only backends that misbehave on purpose, one per label (docs/labels.md).

Each is ``cpu-eager`` except on cases of the variant ``causal``, where it fails in one
phase in one way: the call of the compile phase (the first call) or of the run phase (the
later calls). Cases of other variants compute correctly and must PASS, which proves that the
case after a fault still runs. Select one with ``--backend tests.fault_backends:NAME``.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import time

import torch

from cases.model import Case
from conformance.backends.cpu import CpuEager

FAULTY_VARIANT = "causal"
#: When set, a hanging backend writes the pid of a subprocess it started (a stand-in for a
#: compiler process) to this file, so a test can check that the watchdog killed it too.
GRANDCHILD_PID_FILE = "FLEXCONF_TEST_GRANDCHILD_PID_FILE"
#: A file in the kernel's ``oom_kill N`` form that KilledByOomKiller counts its death in, as the
#: kernel counts an OOM kill (a test adds it to conformance.supervisor.OOM_KILL_COUNTERS).
OOM_COUNTER_FILE = "FLEXCONF_TEST_OOM_COUNTER_FILE"


class _Faulty(CpuEager):
    phase = "compile"

    def prepare(self, case: Case):
        real = super().prepare(case)
        if case.variant.name != FAULTY_VARIANT:
            return real
        calls = [0]

        def faulty(q, k, v, score_mod, block_mask):
            calls[0] += 1
            if (calls[0] == 1) == (self.phase == "compile"):
                return self.misbehave(real, q, k, v, score_mod, block_mask)
            return real(q, k, v, score_mod, block_mask)

        return faulty

    def misbehave(self, real, *args):
        raise NotImplementedError


class CompileHang(_Faulty):
    name = "test-compile-hang"
    #: a compiler subprocess that starts a session of its own (outside the child's group)
    detached = False

    def misbehave(self, real, *args):
        pid_file = os.environ.get(GRANDCHILD_PID_FILE)
        if pid_file:
            helper = subprocess.Popen(["sleep", "3600"], start_new_session=self.detached)
            with open(pid_file, "w") as f:
                f.write(str(helper.pid))
        time.sleep(3600)


#: When this names a file that exists, ``HangsWhileFileExists`` hangs; otherwise it computes.
HANG_FILE = "FLEXCONF_TEST_HANG_FILE"


class HangsWhileFileExists(CompileHang):
    """Hangs in the compile call like ``CompileHang`` while the file ``$FLEXCONF_TEST_HANG_FILE``
    exists: a run killed in the hang, then resumed without the file, finishes correctly."""

    name = "test-hangs-while-file-exists"

    def misbehave(self, real, *args):
        if os.path.exists(os.environ.get(HANG_FILE, "")):
            return super().misbehave(real, *args)
        return real(*args)


class HangsOnItsFifthCaseWhileFileExists(CompileHang):
    """Hangs in the compile call of the fifth case its child prepares, whatever the variant,
    while ``$FLEXCONF_TEST_HANG_FILE`` exists (a fuzzing run, which draws no ``causal``, cut
    off at a known example); every other case it computes."""

    name = "test-hangs-on-its-fifth-case"
    prepared = 0  # in this child

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)
        type(self).prepared += 1
        if type(self).prepared != 5 or not os.path.exists(os.environ.get(HANG_FILE, "")):
            return real
        return lambda *args: self.misbehave(real, *args)


#: When this names a file that exists, ``DiskFullWhileFileExists`` finds the disk full.
DISK_FULL_FILE = "FLEXCONF_TEST_DISK_FULL_FILE"


class DiskFullWhileFileExists(_Faulty):
    """Its compile call fails as a compiler that cannot write its build does (an OSError of
    ENOSPC, as Inductor's LoweringException carried it) while ``$FLEXCONF_TEST_DISK_FULL_FILE``
    exists; otherwise it computes: a run on a full disk, resumed once there is room."""

    name = "test-disk-full-while-file-exists"

    def misbehave(self, real, *args):
        if os.path.exists(os.environ.get(DISK_FULL_FILE, "")):
            import errno

            full = OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError(f"LoweringException: OSError: {full}") from full
        return real(*args)


class DetachedCompileHang(CompileHang):
    """Hangs in the compile call after starting a subprocess in a session of its own, which
    the kill of the child's process group does not reach (an outside trial's survivor)."""
    name = "test-detached-compile-hang"
    detached = True


class RunHang(CompileHang):
    name = "test-run-hang"
    phase = "run"


class CompileError(_Faulty):
    name = "test-compile-error"

    def misbehave(self, real, *args):
        raise RuntimeError("injected compiler failure: lowering not implemented")


class CompileErrorAfterFailedWarmUp(CompileError):
    """Its warm-up raises (and the child goes on: a broken compiler shows in the cases)."""
    name = "test-compile-error-after-failed-warm-up"

    def warm_up(self):
        super().warm_up()
        raise RuntimeError("injected warm-up failure: libnrt.so.1 not found")


class CompileErrorAfterWarmUpLeak(CompileError):
    """Its warm-up leaves the default dtype at float64 (the child sets it back)."""
    name = "test-compile-error-after-warm-up-leak"

    def warm_up(self):
        super().warm_up()
        torch.set_default_dtype(torch.float64)


class RuntimeFault(_Faulty):
    name = "test-runtime-error"
    phase = "run"

    def misbehave(self, real, *args):
        raise RuntimeError("injected device fault: illegal memory access")


#: What ``HostileMessage`` raises: a lone surrogate (non-UTF-8 compiler output decoded with
#: surrogateescape), NUL, a terminal title sequence, ESC colour codes, a bidi override, backticks.
HOSTILE_TEXT = "bad byte \udc80, NUL \x00, \x1b]0;pwned\x07title, \x1b[31mred\x1b[0m, \u202eabc, `tick`"


class HostileMessage(_Faulty):
    name = "test-hostile-message"

    def misbehave(self, real, *args):
        raise RuntimeError(HOSTILE_TEXT)


class Segfault(_Faulty):
    name = "test-segfault"

    def misbehave(self, real, *args):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


class ForksThenSegfaults(_Faulty):
    """Forks a sleeper (it inherits every open descriptor, the events pipe included), then
    segfaults: the parent must notice the death, not wait for the pipe to close."""

    name = "test-forks-then-segfaults"

    def misbehave(self, real, *args):
        if os.fork() == 0:  # the forked helper: lives on, holding the pipe open
            time.sleep(60)
            os._exit(0)
        ctypes.string_at(0)


class Killed(_Faulty):
    name = "test-sigkill"
    phase = "run"

    def misbehave(self, real, *args):
        os.kill(os.getpid(), signal.SIGKILL)


class KilledByOomKiller(Killed):
    """Dies of SIGKILL after adding one to the OOM-kill count in OOM_COUNTER_FILE: what the
    kernel's OOM killer does to a child (a real one would take the host's memory with it)."""

    name = "test-oom-killed"

    def misbehave(self, real, *args):
        path = os.environ[OOM_COUNTER_FILE]
        with open(path) as f:
            count = int(f.read().split()[1])
        with open(path, "w") as f:
            f.write(f"oom_kill {count + 1}\n")
        super().misbehave(real, *args)


class OutOfMemory(_Faulty):
    """Limits the child's address space, then allocates beyond the limit: a real allocator
    failure ("can't allocate memory"), not a raised MemoryError."""

    name = "test-out-of-memory"

    def misbehave(self, real, *args):
        import torch

        with open("/proc/self/statm") as f:
            virtual = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (virtual + (256 << 20), hard))
        try:
            torch.ones(1 << 30, dtype=torch.float32)  # 4 GiB
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class WrongNumbers(_Faulty):
    """Computes correctly, except that one query row of one head is doubled."""

    name = "test-wrong-numbers"
    phase = "run"

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)
        if case.variant.name != FAULTY_VARIANT:
            return real

        def wrong(q, k, v, score_mod, block_mask):
            out = real(q, k, v, score_mod, block_mask).clone()
            out[0, 0, -1] *= 2
            return out

        return wrong


class OnePercentOff(CpuEager):
    """Every output value 1% off, on every variant (the first output of a tuple)."""

    name = "test-one-percent-off"

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)

        def wrong(*args):
            got = real(*args)
            return (got[0] * 1.01, *got[1:]) if isinstance(got, tuple) else got * 1.01

        return wrong


class _WrongOnOneCall(CpuEager):
    """Computes correctly, except that call ``wrong_call`` (the first call is 1) doubles one
    query row of one head; with ``one_buffer``, every call writes into one tensor that it
    returns, as a backend with a static output buffer does."""

    wrong_call = 1
    one_buffer = False

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)
        if case.variant.name != FAULTY_VARIANT:
            return real
        calls, buffer = [0], []

        def sometimes_wrong(q, k, v, score_mod, block_mask):
            calls[0] += 1
            out = real(q, k, v, score_mod, block_mask).clone()
            if calls[0] == self.wrong_call:
                out[0, 0, -1] *= 2
            if not self.one_buffer:
                return out
            buffer[:] = buffer or [torch.empty_like(out)]
            return buffer[0].copy_(out)

        return sometimes_wrong


class WrongFirstCall(_WrongOnOneCall):
    name = "test-wrong-first-call"


class WrongFirstCallOneBuffer(_WrongOnOneCall):
    name = "test-wrong-first-call-one-buffer"
    one_buffer = True


class WrongThirdCall(_WrongOnOneCall):
    """A race that strikes one timed call (the second of three)."""

    name = "test-wrong-third-call"
    wrong_call = 3


class WrongFifthCall(_WrongOnOneCall):
    """A race that strikes the fourth timed call: only a run of ``--timed-runs 4`` or more
    makes that call."""

    name = "test-wrong-fifth-call"
    wrong_call = 5


class LastBitNoise(CpuEager):
    """Correct, but not deterministic: each call moves one output element (another each call)
    by one unit in its last place, as an atomic accumulation's order moves a sum."""

    name = "test-last-bit-noise"

    def prepare(self, case: Case):
        real = CpuEager.prepare(self, case)
        calls = [0]

        def noisy(q, k, v, score_mod, block_mask):
            calls[0] += 1
            out = real(q, k, v, score_mod, block_mask).clone()
            one = out.view(-1)[calls[0]:calls[0] + 1]
            one.copy_(_one_ulp_towards_zero(one))
            return out

        return noisy


def _one_ulp_towards_zero(x):
    """``x`` (a float tensor) one unit in its last place nearer zero (0 stays 0): its bits,
    sign and magnitude, read as an integer of its size, minus one."""
    bits = x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    return torch.where(x == 0, bits, bits - 1).view(x.dtype)


class Unsupported(CpuEager):
    name = "test-unsupported"

    def unsupported_reason(self, case: Case) -> str | None:
        if case.variant.name == FAULTY_VARIANT:
            return "this test backend declares causal masks unsupported"
        return None


class UnsupportedDevice(_Faulty):
    """Raises upstream flex_attention's own error for a device type it does not list."""

    name = "test-unsupported-device"

    def misbehave(self, real, *args):
        raise ValueError("FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices. "
                         "Found input tensors on neuron device.")


class KillsWorker(_Faulty):
    """Starts a stand-in compiler process, kills the pytest worker (the child's parent) while
    compiling, then hangs: the worker's records must still yield a CRASH for the case, and the
    orphaned child and its compiler process must die too. Writes "CHILD_PID COMPILER_PID"."""

    name = "test-kills-worker"

    def misbehave(self, real, *args):
        compiler = subprocess.Popen(["sleep", "3600"])
        pid_file = os.environ.get(GRANDCHILD_PID_FILE)
        if pid_file:
            with open(pid_file, "w") as f:
                f.write(f"{os.getpid()} {compiler.pid}")
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)


class LeaksDefaultDtype(_Faulty):
    """Leaves torch's default dtype at float64 after its first causal call, as a backend that
    switches it for a computation of its own and forgets to set it back. A later case whose
    mods make a captured tensor with torch.randn (rel_bias's table) was a false MISMATCH."""
    name = "test-leaks-default-dtype"
    phase = "compile"

    def misbehave(self, real, *args):
        out = real(*args)
        torch.set_default_dtype(torch.float64)
        return out


class SetsFp32PrecisionAtWarmUp(CpuEager):
    """Switches float32 matmuls to TF32 through torch's fp32_precision API in its warm-up and
    never back (after which torch refuses to read the legacy allow_tf32 switch: the settings'
    snapshot raised, and every case was a CRASH). The child sets it back before the first
    case, so its cases PASS."""
    name = "test-sets-fp32-precision-at-warm-up"

    def warm_up(self):
        super().warm_up()
        torch.backends.cuda.matmul.fp32_precision = "tf32"


class LeaksFp32Precision(LeaksDefaultDtype):
    """Leaves the fp32_precision API at TF32 after its first causal call."""
    name = "test-leaks-fp32-precision"

    def misbehave(self, real, *args):
        out = real(*args)
        torch.backends.fp32_precision = "tf32"
        return out


class SavesAndRestoresPrecision(CpuEager):
    """Raises float32 matmul precision for its own calls and sets it back, through the legacy
    switch, as torch's own code does: a correct backend. Writing the legacy switch turns the
    fp32_precision settings from "none" into "ieee", which compute alike: it must PASS."""
    name = "test-saves-and-restores-precision"

    def prepare(self, case: Case):
        real = super().prepare(case)

        def polite(*args):
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision("high")
            try:
                return real(*args)
            finally:
                torch.set_float32_matmul_precision(before)
        return polite
