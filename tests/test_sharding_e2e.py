"""A matrix run in 3 shards and merged equals the same matrix run unsharded, case for case;
the shards of a ``-k`` run record the selection and merge complete.

Real pytest runs of the conformance matrix (cpu-eager, six tiny cases of a case file):
``--shard 1/3``, ``2/3``, ``3/3`` and no shard at once; then ``flexconf merge``. Then two
shards of a ``-k`` run, one of them with two xdist workers.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cases import variants
from cases.model import Case, Shape
from conformance.cli import main
from records.results import load_results

REPO = Path(__file__).resolve().parent.parent
CASES = [
    Case(variants.full(), Shape(1, 2, 2, 64, 64, 16), "fp32"),
    Case(variants.causal(), Shape(1, 2, 2, 128, 128, 16), "fp32"),
    Case(variants.sliding_window(32), Shape(2, 2, 2, 128, 128, 16)),
    Case(variants.alibi(), Shape(1, 4, 4, 64, 64, 16)),
    Case(variants.softcap(20.0), Shape(2, 2, 2, 96, 96, 16), "fp16"),
    Case(variants.document(), Shape(1, 2, 2, 256, 256, 32)),
]


def start_matrix(case_file: Path, report_dir: Path, shard: str | None,
                 *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "pytest", "conformance/", "-q", "-p", "no:cacheprovider",
               "--backend", "cpu-eager", "--case-file", str(case_file),
               "--report-dir", str(report_dir), "--reference-cache", "none", *extra]
    if shard:
        command += ["--shard", shard]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(run: subprocess.Popen, report_dir: Path) -> Path:
    output, _ = run.communicate(timeout=300)
    assert run.returncode == 0, output[-4000:]
    return report_dir / "results.json"


@pytest.mark.slow
def test_three_shards_merged_equal_the_unsharded_run(tmp_path, capsys):
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps([c.to_json() for c in CASES]))
    # the four runs at once, as on four machines (each its own report directory)
    dirs = {shard: tmp_path / (shard.replace("/", "of") if shard else "whole")
            for shard in ("1/3", "2/3", "3/3", None)}
    runs = {shard: start_matrix(case_file, d, shard) for shard, d in dirs.items()}
    results = {shard: finish(run, dirs[shard]) for shard, run in runs.items()}
    shards = [results[s] for s in ("1/3", "2/3", "3/3")]
    whole = load_results(results[None])

    parts = [load_results(p) for p in shards]
    assert all(part.records for part in parts)  # six cases over three parts, none empty
    assert sum(len(part.records) for part in parts) == len(CASES)

    merged_path = tmp_path / "merged.json"
    assert main(["merge", *map(str, shards), "-o", str(merged_path)]) == 0, capsys.readouterr().err
    merged = load_results(merged_path)
    assert merged.complete and merged.options["merged_shards"] == ["1/3", "2/3", "3/3"]
    assert [r.case_id for r in merged.records] == [r.case_id for r in whole.records] \
        == [c.id for c in CASES]
    for got, want in zip(merged.records, whole.records):
        assert got.label == want.label, (got.case_id, got.message, want.message)
        assert got.case == want.case
        assert got.metrics == want.metrics, got.case_id  # same inputs, same numbers
    assert {r.label.value for r in whole.records} == {"PASS"}


@pytest.mark.slow
def test_the_shards_of_a_k_run_record_the_selection_and_merge_complete(tmp_path, capsys):
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps([c.to_json() for c in CASES]))
    keyword = "causal or alibi or softcap or document"  # four of the six
    selected = [c.id for c in CASES if c.variant.name in ("causal", "alibi", "softcap", "document")]
    runs = {"1/2": start_matrix(case_file, tmp_path / "one", "1/2", "-k", keyword),
            "2/2": start_matrix(case_file, tmp_path / "two", "2/2", "-k", keyword, "-n", "2")}
    shards = [finish(runs["1/2"], tmp_path / "one"), finish(runs["2/2"], tmp_path / "two")]
    for path, shard in zip(shards, ("1/2", "2/2")):
        selection = load_results(path).selection
        assert selection["case_ids"] == selected, path  # the whole run's, under xdist too
        assert (selection["keyword"], selection["shard"]) == (keyword, shard)
        assert selection["case_file"] == str(case_file)
        assert selection["case_file_sha256"] == hashlib.sha256(case_file.read_bytes()).hexdigest()
    assert sum(len(load_results(p).records) for p in shards) == len(selected)

    merged_path = tmp_path / "merged.json"
    assert main(["merge", *map(str, shards), "-o", str(merged_path)]) == 0, capsys.readouterr().err
    merged = load_results(merged_path)
    assert merged.complete and [r.case_id for r in merged.records] == selected


@pytest.mark.slow
def test_a_part_that_holds_none_of_the_selected_cases_exits_5_and_merges(tmp_path, capsys):
    """-k picks one case: the other part ran nothing. It finished all the same (exit 5,
    pytest's "no tests ran", as docs/scale-out.md tells CI to accept), with a results.json
    of no records that merges with the part that ran the case; it was a usage error (4) with
    no results.json, which failed the documented recipe."""
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps([c.to_json() for c in CASES]))
    chosen = CASES[0].id
    runs = {shard: start_matrix(case_file, tmp_path / shard.replace("/", "of"), shard,
                                "--case-id", chosen) for shard in ("1/2", "2/2")}
    outputs = {shard: run.communicate(timeout=300)[0] for shard, run in runs.items()}
    codes = {shard: run.returncode for shard, run in runs.items()}
    assert sorted(codes.values()) == [0, 5], outputs
    empty = next(shard for shard, code in codes.items() if code == 5)
    assert f"--shard {empty}: none of the 1 selected case(s) is in this part" in outputs[empty]
    parts = [tmp_path / shard.replace("/", "of") / "results.json" for shard in ("1/2", "2/2")]
    assert sorted(len(load_results(p).records) for p in parts) == [0, 1]
    merged_path = tmp_path / "merged.json"
    assert main(["merge", *map(str, parts), "-o", str(merged_path)]) == 0, capsys.readouterr().err
    merged = load_results(merged_path)
    assert merged.complete and [r.case_id for r in merged.records] == [chosen]


@pytest.mark.slow
def test_only_the_first_part_fuzzes_so_the_parts_merge_without_duplicates(tmp_path, capsys):
    """Every part drew the same examples (one seed), and the merge found each duplicated
    (exit 1); now part 1 fuzzes them all and the others deselect the fuzzing test."""
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps([c.to_json() for c in CASES[:2]]))
    fuzz = ("--fuzz-examples", "3", "--seed", "1")
    runs = {shard: start_matrix(case_file, tmp_path / shard.replace("/", "of"), shard, *fuzz)
            for shard in ("1/2", "2/2")}
    parts = [finish(runs[shard], tmp_path / shard.replace("/", "of")) for shard in runs]
    fuzzed = [[r.case_id for r in load_results(p).records if r.case_id.startswith("fuzz/")]
              for p in parts]
    assert len(fuzzed[0]) >= 1 and fuzzed[1] == [], fuzzed
    assert all(load_results(p).complete for p in parts)
    merged_path = tmp_path / "merged.json"
    assert main(["merge", *map(str, parts), "-o", str(merged_path)]) == 0, capsys.readouterr().out
    merged = load_results(merged_path)
    assert merged.complete and not merged.options.get("merged_duplicates")
    assert sorted(r.case_id for r in merged.records) == sorted([c.id for c in CASES[:2]]
                                                               + fuzzed[0])
