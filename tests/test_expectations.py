"""The expectations file: parsing with errors that name the line, lookup, xfail, update."""
from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cli import main
from reports.expectations import (ExpectationsError, expected_label, load_expectations,
                                  known_failure_reason, parse_expectations)
from reports.expectations_update import TRIAGE_HEADING, toml_string, update_expectations
from reports.junit import junit_properties
from records.results import Label, write_results
from tests.test_report_doctored import case_id, record, run

A, B, C = case_id(seq=128), case_id(seq=256), case_id("alibi", seq=128)

GOOD = f"""\
version = 1

# compile timeouts at the longest length
[[failure]]
backend = "neuron"
case = "causal/*"
label = "COMPILE_TIMEOUT"
reason = "neuronx-cc takes too long"
link = "https://example.com/1"

[[failure]]
backend = "neuron"
case = "{A}"
label = "MISMATCH"
reason = "softmax rounding"

[[failure]]
backend = "*"
case = "{C}"
label = "CRASH"
reason = "everywhere"
link = ""
"""


def test_exact_id_wins_over_glob_and_backends_are_globs():
    known = parse_expectations(GOOD, "known.toml")
    assert [e.line for e in known.entries] == [4, 11, 17]
    assert expected_label(known, "neuron", A) == (Label.MISMATCH, "softmax rounding")
    assert expected_label(known, "neuron", B) == (Label.COMPILE_TIMEOUT, "neuronx-cc takes too long")
    assert expected_label(known, "cuda-inductor", B) is None
    assert expected_label(known, "cuda-inductor", C) == (Label.CRASH, "everywhere")
    assert expected_label(None, "neuron", A) is None


def test_a_failure_is_known_only_with_exactly_the_expected_label():
    known = parse_expectations(GOOD)
    assert known_failure_reason(known, "neuron", A, "MISMATCH") == "softmax rounding"
    assert known_failure_reason(known, "neuron", A, Label.CRASH) is None
    assert known_failure_reason(known, "neuron", A, Label.PASS) is None
    assert known_failure_reason(known, "cpu-eager", A, Label.MISMATCH) is None


@pytest.mark.parametrize("entry, message", [
    ('label = "MISMATCHED"', "known.toml:2: unknown label 'MISMATCHED'; use one of MISMATCH,"),
    ('label = "PASS"', "known.toml:2: label PASS is not a failure"),
    ('label = "CRASH"\nlabl = "x"', "known.toml:2: unknown key 'labl'; allowed keys:"),
    ('label = "CRASH"\nreason = ""', "known.toml:2: 'reason' is missing or empty"),
    ('label = "CRASH"\nlink = 3', "known.toml:2: 'link' must be a string"),
    ('label = ["MISMATCH"]', "known.toml:2: 'label' is a TOML array; give it as a string"),
    ('label = "CRASH"\nbackend = 5', "known.toml:2: 'backend' is a TOML integer; give it as"),
    ('label = "CRASH"\ncase = "causal/b1"', "known.toml:2: case 'causal/b1' is neither a case id"),
])
def test_a_bad_entry_is_an_error_naming_its_line(entry, message):
    fields = {"backend": '"neuron"', "case": f'"{A}"', "reason": '"r"'}
    lines = [line for line in entry.splitlines()]
    keys = {line.split(" = ")[0] for line in lines}
    body = [f"{k} = {v}" for k, v in fields.items() if k not in keys] + lines
    text = "# known failures\n[[failure]]\n" + "\n".join(body) + "\n"
    with pytest.raises(ExpectationsError) as err:
        parse_expectations(text, "known.toml")
    assert str(err.value).startswith(message)


def test_file_level_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(ExpectationsError, match=r"known.toml: not valid TOML: .*line 3"):
        parse_expectations('version = 1\n[[failure]]\nbackend = neuron\n', "known.toml")
    with pytest.raises(ExpectationsError, match="unknown top-level key 'failures'"):
        parse_expectations("[[failures]]\n", "known.toml")
    with pytest.raises(ExpectationsError, match=r"known.toml:11: .* listed twice \(first at line 4\)"):
        parse_expectations(GOOD.replace(f'case = "{A}"', 'case = "causal/*"'), "known.toml")
    with pytest.raises(ExpectationsError, match="no such expectations file; create it with"):
        load_expectations(tmp_path / "absent.toml")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_toml_strings_read_back_unchanged(value):
    assert tomllib.loads(f"x = {toml_string(value)}")["x"] == value


def test_update_adds_new_failures_to_triage_and_drops_entries_that_pass():
    results = run([record(A, Label.MISMATCH), record(B),
                   record(case_id(seq=512), Label.OUT_OF_MEMORY, message="oom\n<details>"),
                   record(C, Label.CRASH)])
    # causal/* (COMPILE_TIMEOUT) now covers B (PASS) and the OOM case (wrong label): kept;
    text = GOOD.replace('case = "causal/*"', f'case = "{B}"')  # ... an exact B entry: dropped
    update = update_expectations(text, results, "known.toml")
    assert [e.case for e in update.dropped] == [B]
    assert [r.case_id for r in update.added] == [case_id(seq=512)]
    assert "# compile timeouts" not in update.text  # its comment went with it
    assert f'case = "{A}"' in update.text and f'case = "{C}"' in update.text
    triage = update.text[update.text.index(TRIAGE_HEADING):]
    assert f'case = "{case_id(seq=512)}"' in triage
    assert 'reason = "to triage: oom"' in triage and 'label = "OUT_OF_MEMORY"' in triage
    known = parse_expectations(update.text)
    assert expected_label(known, "neuron", case_id(seq=512))[0] is Label.OUT_OF_MEMORY
    again = update_expectations(update.text, results)
    assert again.text == update.text and not again.added and not again.dropped


def test_update_keeps_entries_of_other_backends_and_of_cases_not_run():
    results = run([record(C)], backend="cuda-inductor")  # C passes on CUDA
    update = update_expectations(GOOD, results)
    assert update.text == GOOD  # C's entry is for every backend ("*"): not judged from one


def test_flexconf_expectations_update_creates_then_edits_the_file(tmp_path, capsys):
    write_results(run([record(A, Label.MISMATCH), record(B)]), tmp_path / "r.json")
    path = tmp_path / "known.toml"
    assert main(["expectations", "update", str(tmp_path / "r.json"),
                 "--expectations", str(path), "--dry-run"]) == 0
    assert not path.exists() and f'case = "{A}"' in capsys.readouterr().out
    assert main(["expectations", "update", str(tmp_path / "r.json"),
                 "--expectations", str(path)]) == 0
    assert f"added    {A} (MISMATCH): to triage" in capsys.readouterr().out
    assert expected_label(load_expectations(path), "neuron", A)[0] is Label.MISMATCH
    write_results(run([record(A), record(B)]), tmp_path / "r2.json")
    assert main(["expectations", "update", str(tmp_path / "r2.json"),
                 "--expectations", str(path)]) == 0
    assert "passes now" in capsys.readouterr().out
    assert load_expectations(path).entries == ()
    # made from a run with nothing to list, it is created, not "up to date" (an outside audit)
    fresh = tmp_path / "fresh.toml"
    assert main(["expectations", "update", str(tmp_path / "r2.json"), "--dry-run",
                 "--expectations", str(fresh)]) == 0
    assert capsys.readouterr().err.endswith(
        f"{fresh}: would be created, with no entry: the run has no failure to list\n")
    assert not fresh.exists()
    assert main(["expectations", "update", str(tmp_path / "r2.json"),
                 "--expectations", str(fresh)]) == 0
    assert capsys.readouterr().out == \
        f"{fresh}: created, with no entry: the run has no failure to list\n"
    assert fresh.exists() and load_expectations(fresh).entries == ()
    assert main(["expectations", "update", str(tmp_path / "r2.json"),
                 "--expectations", str(fresh)]) == 0
    assert capsys.readouterr().out == f"{fresh}: up to date\n"


def test_update_makes_missing_directories_as_gate_and_merge_do(tmp_path, capsys):
    """A --expectations whose directory was missing failed with `[Errno 2] No such file or
    directory: '.../.flexconf-5ece3ed97040.tmp'`, naming a temporary file; one that cannot be
    made is one line naming the directory, before anything is written."""
    write_results(run([record(A, Label.MISMATCH)]), tmp_path / "r.json")
    path = tmp_path / "nodir" / "sub" / "known.toml"
    assert main(["expectations", "update", str(tmp_path / "r.json"),
                 "--expectations", str(path)]) == 0
    assert capsys.readouterr().out == f"added    {A} (MISMATCH): to triage\n"
    assert expected_label(load_expectations(path), "neuron", A)[0] is Label.MISMATCH
    (tmp_path / "afile").write_text("mine")
    blocked = tmp_path / "afile" / "sub" / "known.toml"
    assert main(["expectations", "update", str(tmp_path / "r.json"),
                 "--expectations", str(blocked)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf expectations: error: --expectations {blocked}: its directory "
        f"{blocked.parent}: {tmp_path / 'afile'} is a file, not a directory; give a path this "
        "user can write, e.g. --expectations expectations.toml"]
    assert (tmp_path / "afile").read_text() == "mine"


def test_junit_properties_carry_label_and_compile_seconds():
    props = dict(junit_properties(record(A, Label.MISMATCH, compile_seconds=4.25,
                                         metrics={"error_ratio": 3.5})))
    assert props == {"case_id": A, "label": "MISMATCH", "compile_seconds": "4.250",
                     "run_seconds": "0.010", "cache_hit": "false", "error_ratio": "3.5"}
    assert dict(junit_properties(record(A, compile_seconds=None,
                                        cache_hit=None)))["compile_seconds"] == ""


def test_the_example_in_docs_gate_md_is_a_valid_file():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "gate.md").read_text()
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    known = parse_expectations(example, "docs/gate.md")
    hit = expected_label(known, "neuron", "causal/b4-h8x8-s8192x8192-d128/bf16/fwd")
    assert hit is not None and hit[0] is Label.COMPILE_TIMEOUT


def test_ids_with_an_input_scale_part_are_case_ids():
    scaled = case_id() + "/x4"
    known = parse_expectations(f'[[failure]]\nbackend = "neuron"\ncase = "{scaled}"\n'
                               'label = "MISMATCH"\nreason = "bf16 overflow at 4x inputs"\n')
    assert expected_label(known, "neuron", scaled)[0] is Label.MISMATCH
    assert expected_label(known, "neuron", case_id()) is None


@pytest.mark.parametrize("doctor, says", [
    (lambda r: replace(r, records=(replace(r.records[0], case_id="*"),)),
     "the results' case id '*' holds a glob character (* ? [), which no name of this suite "
     "has: an entry written for it would match other cases; use the results of a run of this "
     "suite"),
    (lambda r: replace(r, options={**r.options, "backend": "*"}),
     "the results' backend '*' holds a glob character (* ? [), which no name of this suite "
     "has: an entry written for it would match other cases; use the results of a run of this "
     "suite"),
    (lambda r: replace(r, records=(replace(r.records[0], case_id="causal/$(id)/bf16/fwd"),)),
     "the results: case 'causal/$(id)/bf16/fwd' is neither a case id nor a glob"),
])
def test_update_never_writes_a_glob_from_a_doctored_results_file(tmp_path, capsys, doctor,
                                                                   says):
    """A results file whose failing case id was "*" became `case = "*"`, which excused every
    failure at the gate; an id that is no id was blamed on the expectations file."""
    failing = run([record(A, Label.MISMATCH)])
    path = tmp_path / "doctored.json"
    write_results(doctor(failing), path)
    known = tmp_path / "known.toml"
    assert main(["expectations", "update", str(path), "--expectations", str(known)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"flexconf expectations: error: {says}") and "\n" not in err
    assert not known.exists()


def test_update_lists_a_fuzzed_failure_without_refusing_the_run(tmp_path, capsys):
    """A fuzzed failure's id (fuzz/...) is no case id: the update refused the whole run over it
    (before: wrote an entry its own parser refused)."""
    fuzzed = "fuzz/" + case_id("causal", seq=64)
    path = tmp_path / "run.json"
    write_results(run([record(A, Label.MISMATCH), record(fuzzed, Label.MISMATCH)]), path)
    known = tmp_path / "known.toml"
    assert main(["expectations", "update", str(path), "--expectations", str(known)]) == 0
    out = capsys.readouterr().out
    assert f"added    {A} (MISMATCH): to triage" in out
    assert f"not added {fuzzed} (MISMATCH): a fuzzed case, which no entry can name" in out
    text = known.read_text()
    assert A in text and "fuzz/" not in text


@pytest.mark.parametrize("change, says", [
    ({"complete": False}, "the run was interrupted (complete=false); finish it with --resume "
                          "REPORT_DIR, or update from a finished run"),
    ({"options": {"shard": "2/3"}}, "shard 2/3 of a run, not the whole run; merge the shards "
                                    "first (flexconf merge) and update from the merged file"),
    ({"options": {"phase": "compile"}}, "a compile-only pass (--phase compile) judged no "
                                        "numbers; update from the run that followed it"),
])
def test_update_refuses_a_part_of_a_run_as_the_gate_does(tmp_path, capsys, change, says):
    """A shard dropped a glob entry another shard still fails ("passes now"), and an
    interrupted run added its cut-off case as an expected CRASH."""
    from dataclasses import replace

    whole = run([record(A, Label.MISMATCH), record(B)])
    if "options" in change:
        change = {"options": {**whole.options, **change["options"]}}
    part = replace(whole, **change)
    if part.options.get("shard"):
        from records.selection import Selection

        part = replace(part, selection=Selection("core", "smoke", (), None, None, "", "", "2/3",
                                                 (A, B)).to_json())
    write_results(part, tmp_path / "r.json")
    path = tmp_path / "known.toml"
    path.write_text("version = 1\n")
    assert main(["expectations", "update", str(tmp_path / "r.json"),
                 "--expectations", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf expectations: error: {tmp_path / 'r.json'}: {says}"]
    assert path.read_text() == "version = 1\n"


def test_update_replaces_an_entry_whose_case_now_fails_otherwise_and_agrees_with_the_gate(
        tmp_path, capsys):
    """An exact entry whose case now failed with another label made the update write a second
    entry for the case, which its own check then refused ('listed twice'); and an entry the
    gate called STALE (its own cases fixed, another entry deciding the one still failing) was
    kept by the update, so --strict-expectations blocked with no fix."""
    from reports.expectations import stale_expectations

    text = ("version = 1\n\n"
            f'[[failure]]\nbackend = "neuron"\ncase = "{A}"\nlabel = "MISMATCH"\nreason = "x"\n\n'
            '[[failure]]\nbackend = "neuron"\ncase = "full/*"\nlabel = "MISMATCH"\nreason = "y"\n'
            '\n[[failure]]\nbackend = "neuron"\ncase = "*/b1-*"\nlabel = "MISMATCH"\n'
            'reason = "z"\n')
    results = run([record(A, Label.COMPILE_ERROR, message="lowering failed"), record(B),
                   record("full/b1-h8x8-s128x128-d128/bf16/fwd", Label.MISMATCH)])
    update = update_expectations(text, results, "known.toml")
    assert [e.case for e in update.dropped] == [A, "*/b1-*"]
    assert [(r.case_id, r.label) for r in update.added] == [(A, Label.COMPILE_ERROR)]
    after = parse_expectations(update.text, "known.toml")
    assert expected_label(after, "neuron", A)[0] is Label.COMPILE_ERROR
    assert stale_expectations(after, results) == []  # nothing left for the gate to flag
    assert update.passing == frozenset({15})  # */b1-*: its one decided case, B, passes
