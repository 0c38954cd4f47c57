"""The release gate: each rule that blocks, the good news, and bad input (exit 0, 1, 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli import main
from records.results import Label, write_results
from tests.test_report_doctored import HOSTILE, case_id, record, run

REPO = Path(__file__).resolve().parents[1]
A, B, C = case_id(seq=128), case_id(seq=256), case_id(seq=512)


def gate(tmp_path, baseline, candidate, *extra: str, expectations: str | None = None) -> int:
    write_results(baseline, tmp_path / "old.json")
    write_results(candidate, tmp_path / "new.json")
    args = ["gate", "--baseline", str(tmp_path / "old.json"),
            "--candidate", str(tmp_path / "new.json"), *extra]
    if expectations is not None:
        (tmp_path / "known.toml").write_text(expectations)
        args += ["--expectations", str(tmp_path / "known.toml")]
    return main(args)


def known(case: str, label: str, backend: str = "neuron") -> str:
    return (f'[[failure]]\nbackend = "{backend}"\ncase = "{case}"\nlabel = "{label}"\n'
            f'reason = "tracked"\nlink = "https://example.com/1"\n')


def test_identical_passing_runs_may_ship(tmp_path, capsys):
    both = run([record(A), record(B)])
    assert gate(tmp_path, both, both) == 0
    assert capsys.readouterr().out.startswith("gate: MAY SHIP (no findings)")


def test_a_regression_blocks_even_when_the_expectations_list_it(tmp_path, capsys):
    old = run([record(A), record(B)])
    new = run([record(A), record(B, Label.COMPILE_TIMEOUT, compile_seconds=None)])
    assert gate(tmp_path, old, new, expectations=known(B, "COMPILE_TIMEOUT")) == 1
    out = capsys.readouterr().out
    assert "MAY NOT SHIP: 1 blocking finding" in out
    assert "x REGRESSION" in out and "PASS -> COMPILE_TIMEOUT" in out and B in out


def test_a_failure_blocks_unless_listed_with_that_label(tmp_path, capsys):
    old = run([record(A), record(B, Label.MISMATCH)])
    new = run([record(A), record(B, Label.MISMATCH)])
    assert gate(tmp_path, old, new) == 1
    assert "UNEXPECTED_FAILURE" in capsys.readouterr().out
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH")) == 0
    assert gate(tmp_path, old, new, expectations=known("causal/*", "MISMATCH")) == 0
    assert gate(tmp_path, old, new, expectations=known(B, "CRASH")) == 1
    assert "MISMATCH; expected CRASH (line 1)" in capsys.readouterr().out
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH", backend="cuda*")) == 1


def test_unsupported_is_not_a_failure(tmp_path):
    both = run([record(A), record(B, Label.UNSUPPORTED, compile_seconds=None)])
    assert gate(tmp_path, both, both) == 0


def test_a_missing_baseline_case_blocks_and_a_new_passing_case_does_not(tmp_path, capsys):
    assert gate(tmp_path, run([record(A), record(B)]), run([record(A), record(C)])) == 1
    out = capsys.readouterr().out
    assert "MISSING" in out and B in out and C not in out


@pytest.mark.parametrize("old_s, new_s, cache, extra, code", [
    (4.0, 5.2, "cold", (), 1),  # 30% slower, both cold
    (4.0, 4.8, "cold", (), 0),  # 20% slower: within the default budget
    (4.0, 5.2, "cold", ("--compile-time-budget", "1.5"), 0),
    (4.0, 5.2, "warm", (), 0),  # not both cold: not gated
    (0.2, 0.4, "cold", (), 0),  # doubled, but by less than the 0.5 s slack
    (0.2, 0.4, "cold", ("--compile-time-slack", "0"), 1),
])
def test_compile_time_budget(tmp_path, capsys, old_s, new_s, cache, extra, code):
    old = run([record(A, compile_seconds=old_s)], compile_cache=cache)
    new = run([record(A, compile_seconds=new_s)], compile_cache=cache)
    assert gate(tmp_path, old, new, *extra) == code
    out = capsys.readouterr().out
    assert ("COMPILE_TIME" in out) == (code == 1)
    assert ("compile times not gated" in out) == (cache == "warm")


def test_a_cache_hit_is_not_compared(tmp_path):
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=9.0, cache_hit=True)])
    assert gate(tmp_path, old, new) == 0


def test_fixes_are_good_news_and_stale_expectations_block_only_when_strict(tmp_path, capsys):
    old = run([record(A), record(B, Label.COMPILE_TIMEOUT, compile_seconds=None)])
    new = run([record(A), record(B)])
    assert gate(tmp_path, old, new, expectations=known(B, "COMPILE_TIMEOUT")) == 0
    out = capsys.readouterr().out
    assert "+ FIXED" in out and "COMPILE_TIMEOUT -> PASS" in out
    assert "+ STALE" in out and "known.toml:1" in out
    assert gate(tmp_path, old, new, "--strict-expectations",
                expectations=known(B, "COMPILE_TIMEOUT")) == 1
    assert "x STALE" in capsys.readouterr().out


def test_markdown_output_is_written_and_escaped(tmp_path):
    old = run([record(A)])
    new = run([record(A, Label.MISMATCH, message=HOSTILE)])
    assert gate(tmp_path, old, new, "--markdown", str(tmp_path / "gate.md")) == 1
    text = (tmp_path / "gate.md").read_text()
    assert text.startswith("## Release gate: ❌ MAY NOT SHIP: 1 blocking finding")
    assert f"| blocking | REGRESSION | `{A}` | PASS -&gt; MISMATCH |" in text


@pytest.mark.parametrize("change, words", [
    (dict(profile="full"), ["new.json", "profile 'full'", "baseline's 'smoke'"]),
    (dict(suite_version="0.2.0"), ["suite version '0.2.0'"]),
    (dict(backend="cuda-inductor"), ["backend 'cuda-inductor'"]),
    (dict(complete=False), ["new.json", "interrupted"]),
])
def test_runs_that_cannot_be_compared_are_bad_input(tmp_path, capsys, change, words):
    assert gate(tmp_path, run([record(A)]), run([record(A)], **change)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("flexconf gate: error: ")
    for word in words:
        assert word in err


def test_unreadable_files_are_bad_input(tmp_path, capsys):
    write_results(run([record(A)]), tmp_path / "old.json")
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["gate", "--baseline", str(tmp_path / "old.json"),
                 "--candidate", str(tmp_path / "absent.json")]) == 2
    assert "absent.json: no such file" in capsys.readouterr().err
    assert main(["gate", "--baseline", str(tmp_path / "broken.json"),
                 "--candidate", str(tmp_path / "old.json")]) == 2
    assert "broken.json: not JSON" in capsys.readouterr().err
    assert gate(tmp_path, run([record(A)]), run([record(A)]),
                expectations=known(A, "PASSED")) == 2
    assert "known.toml:1: unknown label 'PASSED'" in capsys.readouterr().err


def test_gate_as_a_subprocess_exits_1_on_a_regression(tmp_path):
    write_results(run([record(A)]), tmp_path / "old.json")
    write_results(run([record(A, Label.CRASH)]), tmp_path / "new.json")
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--baseline", str(tmp_path / "old.json"),
         "--candidate", str(tmp_path / "new.json")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("gate: MAY NOT SHIP")
