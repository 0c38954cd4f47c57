"""The executor's parts on their own: options, registry, record store, memory gate,
reference cache, and the label mapping."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cases import variants as v
from cases.model import Case, Shape, Variant
from conformance import options as opts
from conformance.backends import registry
from conformance.backends.cpu import CpuInductor
from conformance.case_file import load_case_file
from conformance.protocol import Observation, label_of
from records.store import clear_records
from records.events import RecordWriter, merge_records
from conformance.reference_cache import ReferenceCache, cache_key
from records.results import Label, Record

REPO = Path(__file__).resolve().parent.parent
TINY = Shape(1, 2, 2, 64, 64, 16)


# -- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("16G", 16 << 30), ("16GiB", 16 << 30), ("512m", 512 << 20), ("1000B", 1000),
    ("1.5k", 1536), ("0.5K", 512), ("16 GiB", 16 << 30), ("1000 b", 1000)])
def test_sizes(text, expected):
    assert opts.parse_size("--memory-budget", text) == expected


@pytest.mark.parametrize("text, line", [
    # an outside audit: taken as 16 bytes, every case then ran alone, and nothing said so
    ("16", "--memory-budget '16' has no unit; write e.g. --memory-budget 16G or 16M, or 16B for "
           "bytes"),
    ("0.5", "--memory-budget '0.5' has no unit; write e.g. --memory-budget 0.5G or 0.5M"),
    ("0", "--memory-budget '0' is not a size; write bytes with a unit (e.g. --memory-budget 16G) "
          "or a share of RAM (e.g. --memory-budget 75%)"),
    ("0.5B", "--memory-budget '0.5B' is not a size; write bytes with a unit (e.g. "
             "--memory-budget 16G) or a share of RAM (e.g. --memory-budget 75%)"),
    ("0G", "--memory-budget '0G' is not a size; write bytes with a unit (e.g. --memory-budget "
           "16G) or a share of RAM (e.g. --memory-budget 75%)"),
    # a share, but out of range: it was called "not a size" (an outside audit)
    ("200%", "--memory-budget '200%' is a share of RAM outside (0, 100]; give one in that range "
             "(e.g. --memory-budget 75%) or a size (e.g. --memory-budget 16G)"),
    ("0%", "--memory-budget '0%' is a share of RAM outside (0, 100]; give one in that range "
           "(e.g. --memory-budget 75%) or a size (e.g. --memory-budget 16G)"),
])
def test_a_size_without_a_unit_or_below_a_byte_is_one_line(text, line):
    with pytest.raises(ValueError) as raised:
        opts.parse_size("--memory-budget", text)
    assert str(raised.value) == line


@pytest.mark.parametrize("text, line", [
    ("0", "--timed-runs '0' is not an integer >= 1; write e.g. --timed-runs 1"),
    ("-3", "--timed-runs '-3' is not an integer >= 1; write e.g. --timed-runs 1"),
    ("1001", "--timed-runs '1001' is above 1000, the most this option takes; write e.g. "
             "--timed-runs 1"),
    # an outside audit: it was taken, and every case ran into its run timeout (RUN_TIMEOUT)
    ("99999999999999999999", "--timed-runs '99999999999999999999' is above 1000, the most "
                             "this option takes; write e.g. --timed-runs 1"),
])
def test_timed_runs_out_of_range_are_one_line(text, line):
    defaults = {option.flag: option.default for option in opts.OPTIONS}
    with pytest.raises(ValueError) as raised:
        opts.parse(lambda name: text if name == "--timed-runs" else defaults[name], REPO)
    assert str(raised.value) == line
    assert opts.parse(lambda name: "1000" if name == "--timed-runs" else defaults[name],
                      REPO).timed_runs == 1000


def test_size_as_share_of_ram():
    from conformance.memory_gate import machine_memory_bytes

    assert opts.parse_size("--memory-budget", "50%") == machine_memory_bytes() // 2


@pytest.mark.parametrize("parse, text, message", [
    (lambda t: opts.parse_size("--memory-budget", t), "lots",
     "--memory-budget 'lots' is not a size; write bytes with a unit (e.g. --memory-budget 16G)"),
    (lambda t: opts.parse_seconds("--compile-timeout", t), "-5",
     "--compile-timeout '-5' is not a positive number of seconds"),
    (lambda t: opts.parse_seconds("--run-timeout", t), "nan", "--run-timeout 'nan' is not"),
    (opts.parse_shard, "3/2", "--shard '3/2' is not I/N with 1 <= I <= N"),
    (opts.parse_shard, "0/2", "--shard '0/2' is not I/N"),
    (opts.parse_seed, "x", "--seed 'x' is not a non-negative integer"),
])
def test_bad_values_name_the_value_and_the_fix(parse, text, message):
    with pytest.raises(ValueError) as err:
        parse(text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_shard_is_one_based_on_the_command_line():
    assert opts.parse_shard("1/4") == (0, 4) and opts.parse_shard("4/4") == (3, 4)


def test_case_file_accepts_one_spec_or_a_list(tmp_path):
    a, b = Case(Variant("full"), TINY), Case(Variant("causal"), TINY)
    one, many = tmp_path / "one.json", tmp_path / "many.json"
    one.write_text(json.dumps(a.to_json()))
    many.write_text(json.dumps({"cases": [a.to_json(), b.to_json()]}))
    assert load_case_file(str(one)) == [a]
    assert load_case_file(str(many)) == [a, b]
    many.write_text(json.dumps([a.to_json(), a.to_json()]))
    with pytest.raises(ValueError, match="lists case .* twice"):
        load_case_file(str(many))


@pytest.mark.parametrize("args, line", [
    (["--compile-timeout", "ten"], "ERROR: --compile-timeout 'ten' is not a positive number "
     "of seconds; write e.g. --compile-timeout 600"),
    (["--backend", "nueron"], "ERROR: unknown backend 'nueron'; known: auto, "),
    (["--profile", "huge"], "ERROR: --profile 'huge' is unknown; use one of: full, smoke"),
])
def test_pytest_usage_error_is_one_line(args, line, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                           "--report-dir", str(tmp_path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4  # pytest's usage error
    errors = [l for l in proc.stderr.splitlines() if l.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(line), proc.stderr
    if "--backend" in args:
        assert "cpu-eager" in errors[0] and "cpu-inductor" in errors[0]


def test_a_bad_option_value_is_answered_before_torch_is_imported(tmp_path):
    """Option values are checked without torch (cases/names.py): a usage error takes a
    fraction of a second, not the 1.4 s of importing torch."""
    code = ("import sys, pytest\n"
            "code = pytest.main(['conformance/', '-p', 'no:cacheprovider', '--report-dir', "
            f"{str(tmp_path)!r}, '--profile', 'huge', '--matrix', 'core'])\n"
            "print('torch imported:', 'torch' in sys.modules)\n"
            "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--profile 'huge' is unknown" in proc.stderr
    assert proc.stdout.splitlines()[-1] == "torch imported: False", proc.stdout


def test_reading_a_case_file_and_judging_a_case_import_neither_dynamo_nor_sympy(tmp_path):
    """What every controller and worker does (read the case file, check the parameters,
    compute the golden, judge) needs neither: importing them cost 1.8 s and 0.9 s in each
    process, for nothing (cases/variants.py param_use, reference/verdict.py flat_place)."""
    specs = [Case(v.sliding_window(16), Shape(1, 2, 2, 64, 64, 16), "bf16"),
             Case(v.rel_bias(8), Shape(1, 2, 2, 64, 64, 16), "bf16")]
    (tmp_path / "cases.json").write_text(json.dumps([c.to_json() for c in specs]))
    code = ("import sys\n"
            "from cases.variants import registered_variants\n"
            "from conformance.case_file import load_case_file\n"
            "from cases.inputs import make_inputs\n"
            "from reference.golden import baseline_attention, golden_attention\n"
            "from reference.verdict import judge\n"
            f"for case in load_case_file({str(tmp_path / 'cases.json')!r}, "
            "registered_variants()):\n"
            "    inputs = make_inputs(case, 0)\n"
            "    wrong = baseline_attention(case, inputs) * 1.5\n"
            "    assert not judge(case, golden_attention(case, inputs),\n"
            "                     baseline_attention(case, inputs), wrong).passed\n"
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


# -- registry --------------------------------------------------------------------------------
def test_registry_finds_builtins_module_objects_and_auto(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)  # a stand-in test's import
    assert registry.load_backend("cpu-eager").name == "cpu-eager"
    assert registry.load_backend("tests.fault_backends:WrongNumbers").name == "test-wrong-numbers"
    assert isinstance(registry.resolve_backend("auto"), CpuInductor)  # best available here


def test_registry_errors_say_what_to_do():
    with pytest.raises(registry.BackendError, match="unknown backend 'nope'; known: auto, ") as err:
        registry.load_backend("nope")
    assert "cpu-eager" in str(err.value) and "package.module:object" in str(err.value)
    with pytest.raises(registry.BackendError, match="cannot import 'no_such_pkg.mod'"):
        registry.load_backend("no_such_pkg.mod:Thing")
    with pytest.raises(registry.BackendError, match="is a dict, not a"):
        registry.load_backend("conformance.backends.registry:BUILTIN")
    # a module without its object: the fix named (an outside audit: "unknown backend")
    with pytest.raises(registry.BackendError) as err:
        registry.load_backend("tests.fault_backends")
    assert str(err.value) == ("--backend 'tests.fault_backends' names a module, not a backend "
                              "in it; name the backend class or object too: "
                              "tests.fault_backends:CLASS")


def test_a_backend_spec_whose_package_fails_to_import_is_one_line(tmp_path, monkeypatch):
    """Telling a module without its :CLASS imported the parent package, whose SyntaxError was
    an INTERNALERROR (a review); a name without a dot is no module hint."""
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("broken_pkg.backends", "torch"):
        with pytest.raises(registry.BackendError, match=f"^unknown backend '{spec}'; known: "):
            registry.load_backend(spec)


def test_registry_reads_entry_points(monkeypatch):
    class FakeEntryPoint:
        name, value = "vendor-x", "tests.fault_backends:WrongNumbers"

    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [FakeEntryPoint] if group == registry.ENTRY_POINT_GROUP else [])
    assert "vendor-x" in registry.registered()
    assert registry.load_backend("vendor-x").name == "test-wrong-numbers"


# -- labels ----------------------------------------------------------------------------------
@pytest.mark.parametrize("outcome, phase, label", [
    ("timeout", "compile", Label.COMPILE_TIMEOUT), ("timeout", "warm-up", Label.COMPILE_TIMEOUT),
    ("timeout", "setup", Label.RUN_TIMEOUT), ("timeout", "run", Label.RUN_TIMEOUT),
    ("error", "compile", Label.COMPILE_ERROR), ("error", "run", Label.RUNTIME_ERROR),
    ("error", "setup", Label.RUNTIME_ERROR), ("crash", "compile", Label.CRASH),
    ("oom", "run", Label.OUT_OF_MEMORY), ("unsupported", "compile", Label.UNSUPPORTED),
    ("harness", "start", Label.HARNESS_ERROR), ("ok", "run", None)])
def test_label_of_observation(outcome, phase, label):
    assert label_of(Observation(outcome, phase)) is label


# -- record store ----------------------------------------------------------------------------
def test_merge_orders_records_and_turns_unfinished_starts_into_crash(tmp_path):
    a, b, c = (Case(Variant(n), TINY) for n in ("full", "causal", "alibi"))
    clear_records(tmp_path)
    w0, w1 = RecordWriter(tmp_path, "gw0"), RecordWriter(tmp_path, "gw1")
    w0.environment({"backend": "x"})
    for writer, case in ((w0, c), (w1, a), (w0, b)):
        writer.started(case.id, case.to_json(), writer.path.stem, "t0")
    w0.finished(Record(c.id, Label.PASS, finished_at="t1"))
    w1.finished(Record(a.id, Label.MISMATCH, finished_at="t2"))
    with open(w0.path, "a") as f:
        f.write('{"event": "finished", "rec')  # a worker killed in the middle of a write
    merged = merge_records(tmp_path, [a.id, b.id, c.id])
    assert [(r.case_id, r.label) for r in merged.records] == [
        (a.id, Label.MISMATCH), (b.id, Label.CRASH), (c.id, Label.PASS)]
    assert merged.unfinished == [b.id] and merged.environment == {"backend": "x"}
    assert "worker gw0 stopped while running this case" in merged.records[1].message
    clear_records(tmp_path)
    assert merge_records(tmp_path, [a.id]).records == []


# -- memory gate -----------------------------------------------------------------------------
_HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from conformance.memory_gate import MemoryGate
    gate = MemoryGate({dir!r}, 10)
    with gate.reserve(int(sys.argv[1])) as waited:
        print(f"granted {{time.time():.3f}} waited {{waited:.3f}}", flush=True)
        time.sleep(float(sys.argv[2]))
    print(f"released {{time.time():.3f}}", flush=True)
""")


def _holder(tmp_path, nbytes: int, hold: float, wait_granted: bool = False) -> subprocess.Popen:
    script = _HOLDER.format(repo=str(REPO), dir=str(tmp_path / "gate"))
    proc = subprocess.Popen([sys.executable, "-c", script, str(nbytes), str(hold)],
                            stdout=subprocess.PIPE, text=True)
    if wait_granted:  # block until it holds its reservation
        proc.granted_line = proc.stdout.readline()
        assert proc.granted_line.startswith("granted")
    return proc


def _times(proc) -> dict[str, float]:
    out, _ = proc.communicate(timeout=60)
    out = getattr(proc, "granted_line", "") + out
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}


def test_memory_gate_runs_cases_together_only_while_they_fit(tmp_path):
    first = _holder(tmp_path, 6, 1.0, wait_granted=True)
    too_big = _holder(tmp_path, 6, 0)  # 6 + 6 > 10: waits for the first
    first_times, big_times = _times(first), _times(too_big)
    assert big_times["granted"] >= first_times["released"] - 0.05
    first = _holder(tmp_path, 4, 3.0, wait_granted=True)
    fits = _holder(tmp_path, 6, 0)  # 4 + 6 <= 10: runs beside it
    fit_times = _times(fits)
    first_times = _times(first)
    assert fit_times["granted"] < first_times["released"]
    alone = _holder(tmp_path, 50, 0)  # larger than the whole budget: runs, alone
    assert "granted" in _times(alone)


def test_memory_gate_drops_reservations_of_dead_processes(tmp_path):
    holder = _holder(tmp_path, 9, 3600, wait_granted=True)
    holder.kill()
    holder.wait()
    follower = _holder(tmp_path, 9, 0)
    assert "granted" in _times(follower)


# -- reference cache ---------------------------------------------------------------------------
def test_reference_cache_stores_reuses_and_stays_bounded(tmp_path):
    import torch

    case = Case(Variant("causal"), TINY)
    cache = ReferenceCache(tmp_path, max_bytes=1 << 30)
    golden, baseline = cache.get(case, 0)
    files = list(tmp_path.glob("*.pt"))
    assert len(files) == 1
    again, again_baseline = cache.get(case, 0)
    assert torch.equal(again.out, golden.out) and torch.equal(again_baseline.out, baseline.out)
    assert torch.equal(again.lse, golden.lse)
    assert golden.out.dtype == torch.float64 and baseline.out.dtype == torch.bfloat16
    assert cache_key(case.id, 0, "cpu") != cache_key(case.id, 1, "cpu")
    assert cache_key(case.id, 0, "cpu") != cache_key(case.id, 0, "cuda")
    small = ReferenceCache(tmp_path, max_bytes=files[0].stat().st_size + 1)
    small.get(Case(Variant("full"), TINY), 0)  # a second entry: the older one is evicted
    assert len(list(tmp_path.glob("*.pt"))) == 1


def test_a_restarted_worker_takes_the_dead_workers_slot_not_a_live_one(tmp_path):
    from conformance.backends.base import WorkerSlot
    from conformance.runner import claim_slot, worker_slot

    gw0, lock0 = claim_slot(tmp_path, worker_slot({"workerid": "gw0", "workercount": 2})[0])
    gw1, lock1 = claim_slot(tmp_path, worker_slot({"workerid": "gw1", "workercount": 2})[0])
    assert (gw0.index, gw1.index) == (0, 1)
    lock1.close()  # gw1 dies; xdist starts gw2, whose number points at gw0's slot
    gw2, _ = claim_slot(tmp_path, worker_slot({"workerid": "gw2", "workercount": 2})[0])
    assert gw2 == WorkerSlot(1, 2)
    lock0.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_a_workers_thread_share_counts_the_cores_it_may_use_and_keeps_the_users_cap():
    """Each worker gets its share of the cores in its affinity (taskset, a container's cpuset),
    not of the machine's, and never more than a positive OMP_NUM_THREADS the user set. Asked
    in fresh processes, so this test worker's own settings do not count."""
    def share(count: int, cores: set[int] | None = None, cap: str | None = None) -> int:
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        if cap is not None:
            env["OMP_NUM_THREADS"] = cap
        code = ("import os, sys\n"
                f"{'os.sched_setaffinity(0, ' + repr(cores) + ')' if cores else ''}\n"
                "from conformance.backends.base import WorkerSlot, threads_per_worker\n"
                f"print(threads_per_worker(WorkerSlot(0, {count})))")
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True)
        return int(proc.stdout)

    cores = len(os.sched_getaffinity(0))
    assert share(1) == cores
    assert share(2) == max(1, cores // 2)
    assert share(1, cores={min(os.sched_getaffinity(0))}) == 1  # pinned to one core
    assert share(1, cap="1") == 1  # the user's cap is kept
    assert share(1, cap=str(cores + 4)) == cores  # and never raises the share
    assert share(1, cap=" 1 ") == 1
    for ignored in ("0", "-2", "many", "", "4,2", "2.0", "\u00b2"):  # "²" is a digit, not a number
        assert share(1, cap=ignored) == cores


def test_every_option_is_declared_once_and_docs_show_the_declaration():
    flags = [option.flag for option in opts.OPTIONS]
    assert len(flags) == len(set(flags))
    text = (Path(__file__).resolve().parents[1] / "docs" / "execution.md").read_text()
    begin = text.index("\n", text.index("<!-- options:begin")) + 1
    assert text[begin:text.index("<!-- options:end -->")].strip() == opts.options_markdown(), \
        "docs/execution.md's options table is stale: paste options_markdown() there"
    fields = set(opts.RunOptions.__dataclass_fields__)
    assert {option.name for option in opts.OPTIONS} == fields  # one field per option, no other


def test_settings_defaults_are_the_options_defaults():
    from conformance.executor import Settings

    settings = Settings()
    assert settings.compile_timeout == opts.default_value("--compile-timeout")
    assert settings.run_timeout == opts.default_value("--run-timeout")
    assert settings.timed_runs == opts.default_value("--timed-runs")
    assert settings.seed == opts.default_value("--seed")


def test_a_stopped_process_is_told_apart_from_a_slow_one():
    """A child stopped with SIGSTOP ran out of its budget as a slow compiler does; the label
    stays a timeout, its message now says the process was stopped (an outside audit)."""
    import signal
    import subprocess
    import time

    from conformance.supervisor import _stopped

    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert not _stopped(proc.pid)
        proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not _stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # the event: the kernel has stopped it
        assert _stopped(proc.pid)
        proc.send_signal(signal.SIGCONT)
        while _stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not _stopped(proc.pid)  # gone: /proc cannot say
