"""Point-by-point mods through the real executor: correct backends pass them on five seeds, the
block mask and the memory estimate follow what the mask depends on, and a mod that vmap cannot
run is one HARNESS_ERROR, in one line, while the run goes on."""
from __future__ import annotations

import contextlib

import pytest
import torch

from cases import variants as v
from cases.inputs import make_inputs
from cases.model import Case, Shape, Variant
from cases.pointwise import PointwiseModError, mask_dependence
from cases.variants import Mods, build_mods
from conformance.child import _block_mask
from conformance.estimates import case_peak_bytes
from conformance.executor import _mask_dependence
from reference.golden import golden_attention
from records.results import Label
from tests import pointwise_variants as pv
from tests.test_backends_cpu import execute

SEEDS = range(5)
SHAPE = Shape(2, 4, 2, 256, 256, 16)  # 2 x 2 blocks of 128
MODULES = ("tests.pointwise_variants",)


def run_on_seeds(spec: str, names, **settings) -> list:
    cases = [Case(pv.variant(name), SHAPE) for name in names]
    return execute(spec, cases, seeds=SEEDS, cases_modules=MODULES, **settings)


def assert_all_pass(records) -> None:
    failed = [(r.case_id, r.label, r.message) for r in records if r.label is not Label.PASS]
    assert not failed, failed


@pytest.mark.slow
def test_cpu_eager_passes_every_pointwise_mod_on_five_seeds():
    records = run_on_seeds("cpu-eager", pv.NAMES)
    assert len(records) == len(pv.NAMES) * len(SEEDS)
    assert_all_pass(records)
    # one executor ran every seed: each seed made its own inputs, so its own error
    for case_id in {r.case_id for r in records}:
        errors = {r.metrics["baseline_mean_abs_err"] for r in records if r.case_id == case_id}
        assert len(errors) == len(SEEDS), (case_id, errors)


@pytest.mark.slow
def test_cpu_inductor_passes_the_mods_it_compiles_on_five_seeds(tmp_path):
    records = run_on_seeds("cpu-inductor", pv.COMPILABLE, compile_cache="warm",
                           warm_cache_dir=str(tmp_path / "inductor-cache"))
    assert_all_pass(records)


def test_the_block_mask_is_per_batch_or_per_head_as_the_mask_depends_on_them():
    def block_mask_of(name: str, shape: Shape = SHAPE):
        case = Case(pv.variant(name) if name in pv.NAMES else Variant(name), shape)
        return _block_mask(case, build_mods(case.variant, shape), "cpu")

    per_batch = block_mask_of("tiles_per_batch", Shape(2, 4, 2, 512, 512, 16))
    assert per_batch.shape[:2] == (2, 1)
    # the batches' block layouts differ: one mask shared by both would skip blocks of one
    assert not torch.equal(per_batch.to_dense()[0], per_batch.to_dense()[1])
    assert block_mask_of("tiles_per_head").shape[:2] == (1, SHAPE.Hq)
    assert block_mask_of("per_head_prefix").shape[:2] == (1, SHAPE.Hq)
    assert block_mask_of("causal").shape[:2] == (1, 1)
    broadcast = Shape(2, 4, 2, 64, 64, 16, Bkv=1)
    assert block_mask_of("causal", broadcast).shape[:2] == (2, 1)  # flex's Bkv = 1 rule
    assert block_mask_of("full", broadcast).shape[:2] == (2, 1)  # a no-op mask then
    assert block_mask_of("full") is None


def test_the_memory_estimate_follows_what_the_mask_depends_on():
    big = Shape(4, 8, 8, 8192, 8192, 128)
    grid = 8192 * 8192 * 10  # bytes of create_block_mask's [Sq, Skv] grid (~10 per element)

    def estimate(variant: Variant) -> int:
        case = Case(variant, big)
        return case_peak_bytes(case, True, _mask_dependence(case), 3)

    causal = estimate(v.causal())
    assert estimate(pv.variant("tiles_per_head")) - causal == (8 - 1) * grid  # [H, Sq, Skv]
    assert estimate(pv.variant("tiles_per_batch")) - causal == (4 - 1) * grid  # [B, Sq, Skv]
    assert estimate(v.alibi()) == causal  # a score mod that reads h: no per-head grid


def test_the_memory_estimate_counts_the_results_a_nondeterministic_backend_keeps():
    """Every timed call whose result differs from the first is kept (child) and loaded
    (parent) to be judged: the estimate counts them at worst, and none in a compile-only pass."""
    from conformance.estimates import result_bytes

    case = Case(v.causal(), Shape(4, 8, 8, 8192, 8192, 128), "bf16", "fwd+bwd")
    assert result_bytes(case) == 4 * 64 << 20  # output, dQ, dK, dV: 64 MiB each
    assert result_bytes(Case(v.causal(), case.shape, "bf16", "fwd")) == 64 << 20
    assert result_bytes(Case(v.causal(), case.shape, "bf16", "fwd+lse")) == (64 + 1) << 20
    three = case_peak_bytes(case, True, frozenset({"q_idx", "kv_idx"}), timed_runs=3)
    five = case_peak_bytes(case, True, frozenset({"q_idx", "kv_idx"}), timed_runs=5)
    compile_only = case_peak_bytes(case, True, frozenset({"q_idx", "kv_idx"}), timed_runs=0)
    assert five - three == 2 * 2 * result_bytes(case)
    assert three - compile_only == 7 * result_bytes(case)


class RecordingGate:
    def __init__(self):
        self.reserved: list[int] = []

    @contextlib.contextmanager
    def reserve(self, nbytes: int, what: str = ""):
        self.reserved.append(nbytes)
        yield 0.0


def test_the_executor_reserves_the_estimate_of_what_the_mask_depends_on():
    from conformance.backends.base import WorkerSlot
    from conformance.backends.registry import load_backend
    from conformance.executor import Executor, Settings
    from conformance.reference_cache import ReferenceCache

    case = Case(pv.variant("tiles_per_head"), SHAPE)
    depends_on = frozenset({"h", "q_idx", "kv_idx"})
    for settings, label, kept_for in ((Settings(cases_modules=MODULES, timed_runs=5),
                                       Label.PASS, 5),
                                      (Settings(cases_modules=MODULES, compile_only=True),
                                       Label.COMPILED, 0)):
        gate = RecordingGate()
        executor = Executor(load_backend("cpu-eager"), "cpu-eager", WorkerSlot(0, 1),
                            settings, ReferenceCache(None, 0), gate, "test")
        try:
            record = executor.execute(case)
        finally:
            executor.close()
        assert record.label is label, record.message
        assert gate.reserved == [case_peak_bytes(case, False, depends_on, kept_for)]


# -- bad input: mods that vmap (and so flex_attention) cannot run ---------------------------
def _mask_with_item(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx.item()


def _score_with_python_if(score, b, h, q_idx, kv_idx):
    if q_idx > kv_idx:
        return score * 2
    return score


BAD = {"mask_calls_item": Mods(_mask_with_item, None),
       "score_branches_in_python": Mods(None, _score_with_python_if)}


@pytest.fixture
def bad_variants(monkeypatch):
    for name, mods in BAD.items():
        monkeypatch.setitem(v._BUILDERS, name, lambda variant, shape, device, m=mods: m)
    return [Case(Variant(name), SHAPE) for name in BAD]


def test_a_mod_vmap_cannot_run_is_one_harness_error_and_the_run_goes_on(bad_variants):
    good = Case(v.causal(), SHAPE)
    records = execute("cpu-eager", [*bad_variants, good])
    assert [r.label for r in records] == [Label.HARNESS_ERROR, Label.HARNESS_ERROR, Label.PASS]
    for record, name, mod in zip(records, BAD, ("mask_mod", "score_mod")):
        assert "\n" not in record.message
        assert record.message.startswith(f"variant {name!r}: its {mod} cannot be evaluated "
                                         "point by point under torch.vmap (")
        assert "torch.where(...) instead of a Python if" in record.message
        assert record.message.endswith("flex_attention applies the same rule")
    assert ".item()" in records[0].message  # vmap's own reason is quoted


def test_a_builder_that_returns_no_mods_is_told_what_to_return(monkeypatch):
    monkeypatch.setitem(v._BUILDERS, "bare", lambda variant, shape, device: _mask_with_item)
    with pytest.raises(TypeError, match=r"^the builder of variant 'bare' returned function; "
                                        r"return cases.variants.Mods\(mask_mod, score_mod\)"):
        build_mods(Variant("bare"), SHAPE)


def test_the_golden_refuses_such_a_mod_with_the_same_sentence(bad_variants):
    case = bad_variants[0]
    with pytest.raises(PointwiseModError, match=r"^variant 'mask_calls_item': its mask_mod "):
        golden_attention(case, make_inputs(case))


def test_mask_dependence_of_a_mask_vmap_cannot_evaluate_is_everything():
    def converts_an_index(b, h, q_idx, kv_idx):
        return kv_idx <= int(q_idx)

    def branches_on_a_captured_value(b, h, q_idx, kv_idx):  # the same branch at every point
        return kv_idx <= q_idx if table.sum() > 0 else kv_idx >= q_idx

    table = torch.ones(3)
    assert mask_dependence(converts_an_index) == {"b", "h", "q_idx", "kv_idx"}
    assert mask_dependence(branches_on_a_captured_value) == {"q_idx", "kv_idx"}


@pytest.mark.parametrize("backend", ["cpu-eager", "cpu-inductor"])
def test_a_mod_that_fails_at_some_points_is_the_cases_fault_not_the_backends(backend):
    """A bias table or document ids too short for the shape: flex_attention fails (eager and
    compiled, at setup or in the first call) and so does the golden; the label was the
    backend's COMPILE_ERROR or RUNTIME_ERROR, which the gate counts against the backend."""
    from cases.custom import load_case_modules

    cases = load_case_modules(["tests.broken_mod_variants"], "smoke")
    records = execute(backend, cases, cases_modules=("tests.broken_mod_variants",))
    assert [r.label for r in records] == [Label.HARNESS_ERROR] * 3, [r.message for r in records]
    for record, mod in zip(records, ("score_mod", "mask_mod")):
        assert record.message.startswith(
            f"the case's own mods fail in the float64 reference: its {mod} raised IndexError: "
            ), record.message
    # out of bounds only where the mask hides: the golden never meets it, flex_attention does
    assert records[2].message.startswith(
        "the case's own score_mod fails where flex_attention evaluates it: its score_mod raised "
        "IndexError: "), records[2].message
    assert "applies the score mod at every point, masked or not" in records[2].message
    for record in records:
        assert "fix the variant, not the backend (the backend: " in record.message


def test_only_what_the_mod_itself_raises_is_the_mods_fault(monkeypatch):
    """Running out of memory while a mod is evaluated, and a failure of the suite's own code
    around it (here: asking torch's indexing rule), must not read 'fix the mod'."""
    import cases.pointwise as pointwise
    from cases.pointwise import ModRaised, evaluate_mask

    point = torch.zeros(1, dtype=torch.int64)

    def allocates(b, h, q_idx, kv_idx):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")

    with pytest.raises(RuntimeError, match="can't allocate memory") as caught:
        evaluate_mask(allocates, point, point, point, point)
    assert not isinstance(caught.value, ModRaised)

    def suite_fails():
        raise ModuleNotFoundError("torch._dynamo._trace_wrapped_higher_order_op moved")

    table = torch.tensor([True, False])
    monkeypatch.setattr(pointwise, "_takes_ints", None)
    monkeypatch.setattr(pointwise, "_rule_takes_ints", suite_fails)
    with pytest.raises(ModuleNotFoundError) as caught:
        evaluate_mask(lambda b, h, q_idx, kv_idx: table[0] | (kv_idx <= q_idx),
                      point, point, point, point)
    assert not isinstance(caught.value, ModRaised)
    with pytest.raises(ModRaised, match="^its mask_mod raised IndexError"):
        evaluate_mask(lambda b, h, q_idx, kv_idx: table[q_idx + 2], point, point, point, point)


def test_the_score_mod_is_looked_at_everywhere_within_its_budget():
    """score_mod_raises finds an out-of-bounds index at one point of one head of one batch,
    on every point's score, and stops at its budget; a mod that only fails for the suite's
    reasons (vmap) is not reported as the mod's."""
    from cases.pointwise import score_mod_raises

    shape = Shape(2, 3, 3, 40, 24, 8)
    rows = torch.zeros(3, 40)

    def last_point_of_the_last_head(score, b, h, q_idx, kv_idx):  # out of bounds at one point
        return score + rows[h + (b * (h == 2) * (q_idx == 39) * (kv_idx == 23)), q_idx]

    raised = score_mod_raises(last_point_of_the_last_head, shape)
    assert raised is not None and str(raised).startswith("its score_mod raised IndexError")
    assert score_mod_raises(last_point_of_the_last_head, shape, max_points=40 * 24 * 4) is None
    assert score_mod_raises(lambda score, b, h, q_idx, kv_idx: score + rows[h, q_idx],
                            shape) is None
    assert score_mod_raises(lambda score, b, h, q_idx, kv_idx: score * float(q_idx),
                            shape) is None  # vmap refuses float(): not the mod's own error


def test_a_backend_error_on_a_sound_score_mod_stays_the_backends():
    from conformance.decision import decide
    from conformance.protocol import Observation

    decision = decide(Case(v.alibi(), SHAPE), Observation("error", "compile", "it failed"), None)
    assert decision.label is Label.COMPILE_ERROR and decision.message == "it failed"


@pytest.mark.parametrize("phase, label", [("setup", Label.HARNESS_ERROR),
                                          ("compile", Label.HARNESS_ERROR),
                                          ("run", Label.RUNTIME_ERROR)])
def test_a_score_mod_failing_where_masked_explains_only_errors_before_the_first_call_returned(
        phase, label):
    """Once the first call returned, the backend evaluated the mod without an error: a later
    error is its own (a review: a device fault on call 3 read 'fix the variant')."""
    from cases.custom import load_case_modules
    from conformance.decision import decide
    from conformance.protocol import Observation

    (case,) = [c for c in load_case_modules(["tests.broken_mod_variants"], "smoke")
               if c.variant.name == "table_short_where_masked"]
    decision = decide(case, Observation("error", phase, "NRT: device fault"), None)
    assert decision.label is label, decision.message


@pytest.mark.parametrize("outcome, phase, label", [
    ("error", "compile", Label.HARNESS_ERROR),  # the same error met by both: the case's
    ("error", "setup", Label.HARNESS_ERROR),
    ("crash", "run", Label.CRASH),  # the backend's own label stands
    ("oom", "compile", Label.OUT_OF_MEMORY),
    ("timeout", "compile", Label.COMPILE_TIMEOUT),
])
def test_a_mod_failing_in_the_reference_takes_over_only_the_backends_errors(outcome, phase,
                                                                            label):
    from cases.pointwise import ModRaised
    from conformance.decision import decide
    from conformance.protocol import Observation

    reference = ModRaised("mask_mod", IndexError("index 32 is out of bounds"))
    decision = decide(Case(v.causal(), SHAPE), Observation(outcome, phase, "it failed"),
                      reference)
    assert decision.label is label
