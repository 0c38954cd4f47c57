"""The oracle on mods its authors did not write (tests/gym_variants.py, written from the docs
alone by an outside trial): the golden is eager flex_attention's float64 answer, correct
backends pass on three seeds, and every deliberately broken output that changes a case's
answer is caught."""
from __future__ import annotations

import pytest
import torch

from cases.inputs import make_inputs
from reference.faults import FAULTS
from reference.golden import baseline_attention, golden_attention
from reference.verdict import judge
from records.results import Label
from tests import gym_variants, realworld_variants
from tests.eager_flex import REFUSAL, refuses_score_mutation
from tests.test_backends_cpu import execute
from tests.test_pointwise_mods import assert_golden_equals_eager_flex

CASES = gym_variants.cases("smoke")  # lengths 256 and 200, MHA and GQA, bf16 and fp32
MODULES = ("tests.gym_variants",)
SEEDS = range(3)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_golden_equals_eager_flex_attention_in_float64(case):
    assert_golden_equals_eager_flex(case)


@pytest.mark.slow
def test_cpu_eager_passes_every_third_party_case_on_three_seeds():
    records = execute("cpu-eager", CASES, seeds=SEEDS, cases_modules=MODULES)
    assert len(records) == len(CASES) * len(SEEDS)
    failed = [(r.case_id, r.label, r.message) for r in records if r.label is not Label.PASS]
    assert not failed, failed


@pytest.mark.slow
def test_cpu_inductor_passes_the_third_party_and_realworld_cases_torch_compiles_right(tmp_path):
    """One child for both (its warm-up compile alone takes 20 CPU-seconds here). Of the
    attention-gym styles, one length of each mask-and-score style (each compile takes 10-15 s
    here), not head_block_bias, which torch gets wrong when compiled (finding 3): a test must
    not depend on an upstream bug staying unfixed, in either direction. Of the real-world
    mods: Hugging Face's 4-D mask read flat (the chained read crashes torch: finding 2) after
    a soft-cap, and Gemma's float32 soft-cap: the golden keeps its float64 through
    ``score.float()`` (REFERENCE_VERSION 25)."""
    gym = [case for case in CASES if case.shape.Sq == 256
           and case.variant.name in ("natten2d", "t5_bias", "prefix_doc")]
    assert len(gym) == 3
    wanted = {("rw_gemma2_softcap", "fp32"), ("rw_gemma_float_softcap", "fp32")}
    chained = [c for c in REALWORLD if c.variant.name == "rw_gemma2_softcap"
               and not dict(c.variant.params).get("flat")]
    realworld = [c for c in REALWORLD if (c.variant.name, c.dtype) in wanted
                 and c.mode == "fwd" and c not in chained]
    assert len(realworld) == 2
    assert_compiled_cases_pass(gym + realworld, MODULES + REALWORLD_MODULES, tmp_path)


def assert_compiled_cases_pass(cases, modules, tmp_path) -> None:
    records = execute("cpu-inductor", cases, seed=1, cases_modules=modules,
                      compile_cache="warm", warm_cache_dir=str(tmp_path / "inductor-cache"))
    failed = [(r.case_id, r.label, r.message) for r in records if r.label is not Label.PASS]
    assert not failed, failed


@pytest.mark.slow
@pytest.mark.parametrize("fault_name", sorted(FAULTS))
def test_every_fault_is_caught_on_the_third_party_cases(fault_name):
    fault, applies = FAULTS[fault_name]
    caught, missed = [], []
    for case in CASES:
        if not applies(case):
            continue
        inputs = make_inputs(case, 11)
        base = baseline_attention(case, inputs)
        verdict = judge(case, golden_attention(case, inputs), base, fault(case, inputs, base))
        (missed if verdict.passed else caught).append(case.id)
    assert caught and not missed, f"{fault_name} missed on {missed}"


# -- real-world mods (tests/realworld_variants.py: Hugging Face, Gemma, vLLM, torchtune, ...) --
REALWORLD = realworld_variants.cases("smoke")
REALWORLD_MODULES = ("tests.realworld_variants",)
#: Mods that read ``score.dtype`` or convert the score to float32: eager flex_attention on
#: float64 inputs traces them in float64 (a table keyed by dtype has no float64 entry, and its
#: ``score.float()`` rounds), which no case of theirs does; the eager runs below judge them.
_DTYPE_BOUND = ("rw_gemma2_softcap", "rw_gemma_float_softcap", "rw_clamp_cap")


def _one_per_golden(cases):
    """One case per (variant, shape, input scale): the float64 golden of a mod that reads no
    dtype is the same for every dtype and mode."""
    seen: dict = {}
    for case in cases:
        seen.setdefault((case.variant, case.shape, case.input_scale), case)
    return list(seen.values())


@pytest.mark.parametrize("case", _one_per_golden(
    c for c in REALWORLD if c.variant.name not in _DTYPE_BOUND), ids=lambda case: case.id)
def test_golden_equals_eager_flex_attention_in_float64_on_the_realworld_mods(case):
    assert_golden_equals_eager_flex(case)


#: ``score.float().clamp_(-c, c)`` changes a float32 score in place (``float()`` returns the
#: score itself), which torch 2.15.0's eager flex_attention refuses (tests/eager_flex.py)
_CHANGES_A_FLOAT32_SCORE_IN_PLACE = "rw_clamp_cap"


def _label_on_cpu_eager(case_id: str) -> Label:
    variant, _, dtype, mode = case_id.split("/")[:4]
    if mode == "fwd+bwd":
        return Label.UNSUPPORTED
    if (refuses_score_mutation() and dtype == "fp32"
            and variant.startswith(_CHANGES_A_FLOAT32_SCORE_IN_PLACE)):
        return Label.COMPILE_ERROR
    return Label.PASS


@pytest.mark.slow
def test_cpu_eager_passes_every_realworld_case_it_runs_on_two_seeds():
    """Every case but those torch refuses: backward on the CPU, and on 2.15 the float32 mod
    that changes its score in place (the refusal in torch's words)."""
    records = execute("cpu-eager", REALWORLD, seeds=range(2), cases_modules=REALWORLD_MODULES)
    assert len(records) == 2 * len(REALWORLD)
    wrong = [(r.case_id, r.label, r.message) for r in records
             if r.label is not _label_on_cpu_eager(r.case_id)
             or (r.label is Label.COMPILE_ERROR and REFUSAL not in r.message)]
    assert not wrong, wrong


@pytest.mark.slow
def test_every_fault_that_changes_a_realworld_answer_is_caught():
    """Each fault on each forward case; a fault that leaves a case's answer as it was (the
    mask it breaks does not reach that far) has nothing to catch there."""
    caught, missed = set(), []
    for case in (c for c in REALWORLD if c.mode == "fwd"):
        inputs = make_inputs(case, 11)
        golden, base = golden_attention(case, inputs), baseline_attention(case, inputs)
        for name, (fault, applies) in sorted(FAULTS.items()):
            broken = fault(case, inputs, base) if applies(case) else base
            if torch.equal(broken, base):
                continue
            if judge(case, golden, base, broken).passed:
                missed.append((name, case.id))
            else:
                caught.add(name)
    assert not missed, missed
    assert caught == set(FAULTS)
