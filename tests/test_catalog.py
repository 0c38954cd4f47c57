"""The case catalog: stable ids, the 96-case matrices, mask mods equal to independent dense
masks, and `flexconf list`."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from cases import variants as v
from cases.catalog import core_matrix, find_case
from cases.model import Case, Shape, Variant
from cases.variants import build_mods, document_lengths, relative_buckets
from conformance.cli import main
from tests.dense_reference import _t5_bucket, dense_mask


def test_full_and_smoke_profiles_hold_96_distinct_cases_each():
    full, smoke = core_matrix("full"), core_matrix("smoke")
    assert len(full) == len({c.id for c in full}) == 96
    assert len(smoke) == len({c.id for c in smoke}) == 96
    assert {c.id for c in full} != {c.id for c in smoke}
    assert {c.variant.name for c in full} == {
        "full", "causal", "sliding_window", "prefix_lm", "document", "alibi", "softcap",
        "rel_bias"}
    assert {(c.shape.B, c.shape.Sq) for c in full} == {
        (b, s) for b in (1, 2, 4) for s in (1024, 2048, 4096, 8192)}
    assert all((c.shape.Hq, c.shape.Hkv, c.shape.D, c.dtype, c.mode) == (8, 8, 128, "bf16", "fwd")
               for c in full)


def test_smoke_divides_lengths_and_length_parameters_by_eight():
    full = {(c.variant.name, c.shape.B, c.shape.Sq): c for c in core_matrix("full")}
    for case in core_matrix("smoke"):
        twin = full[(case.variant.name, case.shape.B, case.shape.Sq * 8)]
        assert case.shape.D == twin.shape.D and case.shape.Hq == twin.shape.Hq
        for (key, value), (_, big) in zip(case.variant.params, twin.variant.params):
            if key in ("w", "p"):
                assert value * 8 == big
            else:
                assert value == big


def test_ids_are_readable_stable_and_round_trip():
    ids = [c.id for c in core_matrix("full")]
    assert "sliding_window-w1000/b4-h8x8-s8192x8192-d128/bf16/fwd" in ids
    assert "prefix_lm-p2048/b1-h8x8-s8192x8192-d128/bf16/fwd" in ids
    assert "causal/b2-h8x8-s4096x4096-d128/bf16/fwd" in ids
    for case in core_matrix("smoke"):
        again = Case.from_json(case.to_json())
        assert again == case and again.id == case.id
        assert find_case(case.id) == case
    assert Shape.parse("b4x1-h8x2-s1x4096-d80") == Shape(4, 8, 2, 1, 4096, 80, 1)


def test_bad_case_data_is_refused_with_the_value_named():
    with pytest.raises(ValueError, match="Hq=6 must be a multiple of Hkv=4"):
        Shape(1, 6, 4, 8, 8, 8)
    with pytest.raises(ValueError, match="unknown dtype 'bf61'"):
        Case(Variant("full"), Shape(1, 1, 1, 8, 8, 8), "bf61")
    with pytest.raises(ValueError, match="bad shape token"):
        Shape.parse("b4-h8-s8192")
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        build_mods(Variant("nope"), Shape(1, 1, 1, 8, 8, 8))
    with pytest.raises(KeyError, match="no case with id"):
        find_case("causal/b9-h8x8-s1x1-d1/bf16/fwd")


@pytest.mark.parametrize("profile", ["smoke", "full"])
def test_every_mask_mod_equals_an_independent_dense_mask(profile):
    seen = set()
    for case in core_matrix(profile):
        if case.shape.Sq > 2048 or (case.variant.token, case.shape.Sq) in seen:
            continue
        seen.add((case.variant.token, case.shape.Sq))
        mods = build_mods(case.variant, case.shape)
        want = dense_mask(case)
        if mods.mask_mod is None:
            assert want.all()
            continue
        s = case.shape
        got = mods.mask_mod(torch.tensor(0), torch.arange(s.Hq).view(-1, 1, 1),
                            torch.arange(s.Sq).view(-1, 1), torch.arange(s.Skv))
        got = np.broadcast_to(got.numpy(), want.shape)
        assert np.array_equal(got, want), case.id


def test_documents_tile_the_sequence_and_relative_buckets_match_t5():
    for seq in (128, 1000, 1024, 8192):
        lengths = document_lengths(seq)
        assert sum(lengths) == seq and all(n > 0 for n in lengths)
    assert document_lengths(1024) == [80, 176, 48, 272, 128, 208, 112]
    buckets = relative_buckets(8192, 32)
    assert buckets == [_t5_bucket(d, 32) for d in range(8192)]
    assert buckets[:16] == list(range(16)) and max(buckets) == 31


def test_relative_buckets_are_defined_for_every_bucket_count():
    """Two and three buckets: distance 1 is the first past e = 1, whose octave's upper half
    starts at 1.5 (the bucket rule once shifted by -1 bits there: 'negative shift count').
    T5's log-spaced rule is the same as the variant's where e = nb // 2 is a power of two."""
    for nb in (2, 3, 4, 5, 8, 9, 16, 17):
        assert relative_buckets(300, nb) == [_t5_bucket(d, nb) for d in range(300)], nb
    assert relative_buckets(300, 1) == [0] * 300  # one bucket holds every distance
    for nb in (1, 2, 3):
        mods = build_mods(v.rel_bias(nb), Shape(1, 2, 2, 5, 5, 8))
        assert mods.score_mod is not None


def test_rel_bias_without_buckets_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^rel_bias needs nb >= 1 buckets, got 0$"):
        build_mods(v.rel_bias(0), Shape(1, 2, 2, 5, 5, 8))


def test_flexconf_list_prints_exactly_the_ids(capsys):
    assert main(["list", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [c.id for c in core_matrix("smoke")]


def test_flexconf_list_rejects_an_unknown_profile_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "conformance.cli", "list", "--profile", "huge"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("flexconf list: error: unknown profile 'huge'; "
                                   "use one of: full, smoke")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_core_soft_cap_cases_catch_a_backend_that_drops_the_score_mod(seed):
    """At N(0, 1) inputs soft-capping at 50 barely acts: a backend that dropped the score mod
    passed 5 to 7 of the 12 core cases, which ones by the seed (an outside audit). The core
    soft-cap cases run at x2: eager flex_attention passes them, the dropped mod is caught at
    each length (smoke sizes, batch 1)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cases.inputs import make_inputs
    from cases.variants import build_mods
    from reference.faults import FAULTS
    from reference.golden import Reference, reference_pair
    from reference.verdict import judge

    dropped, _ = FAULTS["score_mod_ignored"]
    cases = [c for c in core_matrix("smoke") if c.variant.name == "softcap"]
    assert len(cases) == 12 and {c.input_scale for c in cases} == {2}
    assert all(c.id.endswith("/bf16/fwd/x2") for c in cases)
    for case in (c for c in cases if c.shape.B == 1):
        inputs = make_inputs(case, seed)
        golden, baseline = reference_pair(case, inputs)
        mods = build_mods(case.variant, case.shape)  # causal, soft-capped
        mask = create_block_mask(mods.mask_mod, None, None, case.shape.Sq, case.shape.Skv,
                                 device="cpu")
        eager = flex_attention(inputs.q, inputs.k, inputs.v, score_mod=mods.score_mod,
                               block_mask=mask)
        assert judge(case, golden, baseline, Reference(eager)).passed, case.id
        verdict = judge(case, golden, baseline, dropped(case, inputs, baseline.out))
        assert not verdict.passed and verdict.metrics["global_margin"] > 2, case.id


def test_the_suite_version_is_the_checkouts_not_an_editable_installs_last(monkeypatch, tmp_path):
    """An editable install's metadata keeps the version of its install: after a pull that
    changed the matrix, runs said the old version, and the gate compared two catalogs as
    one. The pyproject.toml beside the code says which suite runs."""
    import tomllib

    from conformance import run_info

    with open(run_info.REPO_ROOT / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    run_info.suite_version.cache_clear()
    assert run_info.suite_version() == version
    monkeypatch.setattr(run_info, "REPO_ROOT", tmp_path)  # installed, no checkout beside it
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "another"\nversion = "9"\n')
    run_info.suite_version.cache_clear()
    try:
        from importlib.metadata import PackageNotFoundError, version as installed

        try:
            expected = installed("flexattention-conformance")
        except PackageNotFoundError:
            expected = "unknown"
        assert run_info.suite_version() == expected
    finally:
        run_info.suite_version.cache_clear()


def test_every_core_sliding_window_binds_and_a_window_one_key_too_wide_is_caught():
    """At w = S (1024 at S1024, 128 at smoke's S128) the window never bound: those cases were
    causal ones, and a backend whose window was one key too wide passed them bit for bit (an
    outside mutation test). The window is shorter than every core length and ends inside key
    blocks; one key too wide is caught at the shortest length, on two seeds."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cases.inputs import make_inputs
    from reference.golden import Reference, reference_pair
    from reference.verdict import judge

    for profile in ("full", "smoke"):
        windows = [c for c in core_matrix(profile) if c.variant.name == "sliding_window"]
        assert all(c.variant.param("w") < c.shape.Skv and c.variant.param("w") % 128
                   for c in windows), profile
    shortest = min((c for c in core_matrix("smoke") if c.variant.name == "sliding_window"),
                   key=lambda c: (c.shape.Skv, c.shape.B))
    w, s = int(shortest.variant.param("w")), shortest.shape.Skv
    wide = create_block_mask(lambda b, h, q, kv: (kv <= q) & (q - kv <= w), None, None, s, s,
                             device="cpu")
    for seed in (0, 1):
        inputs = make_inputs(shortest, seed)
        golden, baseline = reference_pair(shortest, inputs)
        out = flex_attention(inputs.q, inputs.k, inputs.v, block_mask=wide)
        assert not judge(shortest, golden, baseline, Reference(out)).passed, seed
