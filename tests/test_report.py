"""The HTML report and summary.md, on doctored results with every label."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cli import main
from reports.render import write_report, write_runs_report
from records.results import Label, Record, write_results
from reports.summary import rerun_command, verdict_line
from tests.test_report_doctored import (HOSTILE, LABEL_CASES, ODD_ID, Page, case_id,
                                        doctored_run, record, run)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    write_report(doctored_run(), out)
    html = (out / "index.html").read_text()
    return html, Page(html), (out / "summary.md").read_text()


def test_verdict_line_counts_every_label_in_enum_order():
    line = verdict_line(doctored_run())
    others = " · ".join(f"1 {label.value}" for label in Label if label is not Label.PASS)
    assert line == f"2/12 PASS · {others}"
    assert verdict_line(run([record(case_id())], complete=False)) == "1/1 PASS · run INCOMPLETE"


def test_report_shows_verdict_environment_and_sections(report):
    html, page, _ = report
    assert {"verdict", "environment", "matrix", "compile-times", "failures", "all-cases",
            "failure-table", "case-table"} <= page.ids()
    assert verdict_line(doctored_run()) in page.texts
    for value in ("trn3 <fake>", "2.21 & co", "host-1", "smoke", "cold", "600"):
        assert value in page.texts, value
    assert "comparison" not in page.ids()  # no baseline given


def test_grid_has_one_coloured_linked_cell_per_case(report):
    _, page, _ = report
    cells = [a for t, a in page.tags if t == "a" and a.get("title", "").count(": ")]
    titles = {a["title"].rsplit(": ", 1)[0]: a for a in cells}
    records = doctored_run().records
    assert set(titles) >= {r.case_id for r in records}
    for rec in records:
        failing = rec.label not in (Label.PASS, Label.COMPILED)  # COMPILED: no verdict to fail
        assert titles[rec.case_id]["href"] == ("#fail:" if failing else "#") + rec.case_id
    cell_classes = [a["class"] for t, a in page.tags if t == "td" and
                    a.get("class", "").startswith("l-")]
    for label in Label:
        assert f"l-{label.value}" in cell_classes


def test_failure_table_lists_each_non_passing_case_with_metrics_and_rerun(report):
    _, page, _ = report
    failing = {a["id"][len("fail:"):] for a in page.find("tr") if a.get("id", "").startswith("fail:")}
    assert failing == {cid for label, cid in LABEL_CASES.items()
                       if label not in (Label.PASS, Label.COMPILED)}
    text = "".join(page.texts)
    mismatch = LABEL_CASES[Label.MISMATCH]
    for fragment in ("error ratio: 3.25", "max abs err: 0.5", "worst row at: b0 h3 q17",
                     "NaN: 2", "failed rules: global, row", "custom_extra: x<y",
                     f"--case-id {mismatch} --report-dir"):
        assert fragment in text, fragment
    every_id = {a["id"] for a in page.find("tr") if "id" in a and not a["id"].startswith("fail:")}
    assert every_id == {r.case_id for r in doctored_run().records}


def test_hostile_text_is_shown_as_text_never_as_markup(report):
    html, page, _ = report
    assert "<script>alert(1)" not in html and "<img" not in html and "<b>bold" not in html
    assert HOSTILE in page.texts  # the message, decoded, as one text node of the <pre>
    assert [t for t, _ in page.tags].count("script") == 1  # only the report's own script
    assert not page.find("img") and not page.find("b")
    assert any(a.get("title", "").startswith(ODD_ID + ": PASS") for a in page.find("a"))
    assert ODD_ID in page.ids()  # the row anchor keeps the id intact


def test_summary_markdown_is_short_and_escaped(report):
    _, _, summary = report
    assert "<script>" not in summary and "&lt;script&gt;" in summary
    assert "2/12 PASS" in summary and "does not conform" in summary
    for label in Label:
        assert f"| {label.value} | " in summary
    assert summary.count(f"`{LABEL_CASES[Label.CRASH]}`") == 1
    assert len(summary.splitlines()) < 60


def test_a_wrapped_compiler_error_shows_its_cause_on_the_summary_line(tmp_path):
    wrapped = ("compile: BackendCompilerFailed: backend='inductor' raised:\n"
               "UnsupportedAliasMutationException: Mutations detected in score_mod\n\n"
               "While executing %flex_attention : [num_users=1]")
    results = run([record(case_id(), Label.COMPILE_ERROR, message=wrapped)])
    write_report(results, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert ("raised: UnsupportedAliasMutationException: Mutations detected in score\\_mod"
            in summary), summary
    assert "While executing" not in summary


def test_compile_time_chart_switches_to_log_scale_and_draws_timeouts(tmp_path):
    narrow = run([record(case_id(seq=s), compile_seconds=t)
                  for s, t in ((128, 2.0), (256, 4.0), (512, 6.0))])
    wide = run([record(case_id(seq=128), compile_seconds=0.05),
                record(case_id(seq=256), compile_seconds=50.0),
                record(case_id(seq=512), Label.COMPILE_TIMEOUT, compile_seconds=None)])
    for name, results in (("narrow", narrow), ("wide", wide)):
        write_report(results, tmp_path / name)
    narrow_page = Page((tmp_path / "narrow" / "index.html").read_text())
    wide_page = Page((tmp_path / "wide" / "index.html").read_text())
    assert narrow_page.find("svg")[0]["aria-label"].endswith("linear scale")
    assert wide_page.find("svg")[0]["aria-label"].endswith("log scale")
    assert len(narrow_page.find("rect")) == 3 and not narrow_page.find("line", class_="timeout")
    timeout_bar = wide_page.find("rect", class_="b-COMPILE_TIMEOUT")[0]
    timeout_line = wide_page.find("line", class_="timeout")[0]
    assert float(timeout_bar["y"]) == pytest.approx(float(timeout_line["y1"]), abs=1)
    assert "compile timeout 600 s" in wide_page.texts


def test_baseline_comparison_lists_regressions_fixes_new_missing_and_slower(tmp_path):
    a, b, c, d, e = (case_id(seq=s) for s in (128, 256, 512, 1024, 2048))
    old = run([record(a), record(b, Label.MISMATCH), record(c, compile_seconds=4.0),
               record(d)])
    new = run([record(a, Label.COMPILE_TIMEOUT, compile_seconds=None), record(b),
               record(c, compile_seconds=5.2), record(e)])
    write_report(new, tmp_path, baseline=old)
    page = Page((tmp_path / "index.html").read_text())
    def rows(table_id):
        html = (tmp_path / "index.html").read_text()
        start = html.index(f'<table id="{table_id}"')
        return Page(html[start:html.index("</table>", start)])
    assert "Against baseline: 1 regression · 1 fix · 0 other label changes · 1 new case · " \
           "1 missing case · 1 slower to compile" in page.texts
    assert rows("regressions").find("a")[0]["href"] == f"#{a}"
    assert b in rows("fixes").texts and e in rows("new-cases").texts
    assert d in rows("missing-cases").texts and c in rows("compile-slower").texts
    html = (tmp_path / "index.html").read_text()
    # the first screen: the verdict and the comparison line, then the matrix; the environment
    # comes after the comparison, collapsed
    assert html.index('id="verdict"') < html.index('id="comparison-line"') < \
        html.index('id="matrix"') < html.index('id="regressions"') < html.index('id="fixes"') \
        < html.index('id="environment"')
    environment = html[html.index('<section id="environment">'):]
    assert environment.index("<details>") < environment.index("<table")
    summary = (tmp_path / "summary.md").read_text()
    assert "### Regressions (1)" in summary and f"`{a}`" in summary


def test_a_baseline_timed_on_another_machine_has_its_times_shown_for_information_only(
        tmp_path):
    """The gate does not gate times across machines (tests/test_gate.py); the report says so
    above the compile-time tables, with the machines' names as text."""
    a = case_id(seq=128)
    old = run([record(a, compile_seconds=4.0)])
    new = run([record(a, compile_seconds=5.2)])
    for out, device_name in ((tmp_path / "same", "EPYC"), (tmp_path / "other", "<b>Xeon</b>")):
        write_report(replace(new, environment={**new.environment, "device_name": device_name}),
                     out, baseline=replace(old, environment={**old.environment,
                                                             "device_name": "EPYC"}))
    note = ("Times not compared: the runs were measured on different machines (device_name "
            "'EPYC' (baseline), '<b>Xeon</b>' (candidate)); they are shown for information only.")
    assert note in Page((tmp_path / "other" / "index.html").read_text()).texts
    assert "<b>Xeon</b>" not in (tmp_path / "other" / "index.html").read_text()  # escaped
    assert not any(text.startswith("Times not compared")
                   for text in Page((tmp_path / "same" / "index.html").read_text()).texts)
    # the line under the verdict, and summary.md's, qualify their count of slower compiles
    caveat = "1 slower to compile (timed on different machines: not compared)"
    for where in ("index.html", "summary.md"):
        assert caveat in (tmp_path / "other" / where).read_text()
        same = (tmp_path / "same" / where).read_text()
        assert "1 slower to compile" in same and "not compared" not in same
    write_report(replace(new, options={**new.options, "compile_cache": "warm"}),
                 tmp_path / "warm", baseline=old)
    assert ("1 slower to compile (not both compiled cold: for information only)"
            in (tmp_path / "warm" / "summary.md").read_text())


def test_several_runs_side_by_side_show_disagreements_and_compile_time_per_run(tmp_path):
    a, b = case_id(seq=128), case_id(seq=256)
    runs = [run([record(a, compile_seconds=1.0), record(b)]),
            run([record(a, compile_seconds=2.0), record(b, Label.CRASH)]),
            run([record(a, compile_seconds=3.0)])]
    write_runs_report(runs, tmp_path, names=["2.31.json", "2.32.json", "2.33.json"])
    html = (tmp_path / "index.html").read_text()
    start = html.index('<table id="disagreements"')
    disagreements = Page(html[start:html.index("</table>", start)])
    assert b in disagreements.texts and a not in disagreements.texts
    assert {"PASS", "CRASH", "absent"} <= set(disagreements.texts)
    start = html.index('<table id="side-all"')
    side = Page(html[start:html.index("</table>", start)])
    assert {"1.00", "2.00", "3.00"} <= set(side.texts)
    page = Page(html)
    assert "Against 2.32.json: 0 regressions · 0 fixes · 0 other label changes · 0 new cases · " \
           "1 missing case · 1 slower to compile" in page.texts  # last run vs the one before


def test_rerun_command_names_every_option_that_selected_the_case_and_its_own_report_dir():
    cid = "causal/b1-h8x8-s128x128-d128/bf16/fwd"
    results = run([record(cid)], backend="cpu-inductor", profile="smoke")
    results = replace(results, options=dict(results.options, compile_timeout=600.0,
                                            run_timeout=300.0, report_dir="reports/latest"))
    assert rerun_command(results, cid) == (
        "pytest conformance/ --backend cpu-inductor --profile smoke --seed 0 "
        f"--compile-timeout 600 --run-timeout 300 --case-id {cid} "
        "--report-dir reports/latest-rerun")
    # a module:object backend (with its PYTHONPATH), case modules, a case file, a seed,
    # budgets and a warm cache are given again; not a matrix that a case file replaced (an
    # older suite recorded it; pasted, the command was refused)
    options = dict(results.options, backend="test-wrong", seed=7, case_file="/tmp/my cases.json",
                   backend_requested="tests.fault_backends:WrongNumbers",
                   backend_pythonpath="/src/my plugin", matrix="extended",
                   cases_modules=["my_cases"], compile_cache="warm", timed_runs=5,
                   report_dir="/tmp/run 1/", expectations="/src/known.toml",
                   cases_modules_pythonpath=["/src/cases", "/src/my plugin"])
    results = replace(results, options=options)
    assert rerun_command(results, "odd'id`$(x)") == (
        "PYTHONPATH='/src/my plugin:/src/cases'${PYTHONPATH:+:$PYTHONPATH} pytest conformance/ "
        "--backend tests.fault_backends:WrongNumbers --profile smoke "
        "--cases-module my_cases --case-file '/tmp/my cases.json' --seed 7 "
        "--compile-timeout 600 --run-timeout 300 --timed-runs 5 --compile-cache warm "
        "--expectations /src/known.toml --case-id 'odd'\"'\"'id`$(x)' --report-dir '/tmp/run 1-rerun'")
    # on Neuron: the cores each worker had and the device check, as the run was set
    neuron = replace(results, options=dict(results.options, backend="neuron",
                                           backend_requested="neuron", neuron_cores_per_worker=4,
                                           neuron_device_check="strict"))
    assert "--neuron-cores-per-worker 4 --neuron-device-check strict --case-id" in \
        rerun_command(neuron, cid)
    without_file = replace(results, options={k: v for k, v in options.items()
                                             if k != "case_file"})
    assert " --matrix extended --cases-module my_cases " in rerun_command(without_file, cid)


def test_the_resume_command_narrows_as_the_run_did():
    """recover's command left -k out: pasted, it said 72 selected cases were not part of the
    run it resumed."""
    from records.selection import Selection
    from reports.summary import resume_command

    cid = "causal/b1-h8x8-s128x128-d128/bf16/fwd"
    results = run([record(cid)], backend="cpu-inductor", profile="smoke")
    selection = Selection("core", "smoke", (), None, None, "causal and b1-", "not slow", None,
                          (cid,))
    narrowed = replace(results, selection=selection.to_json())
    assert resume_command(narrowed, "reports/x").endswith(
        "--run-timeout 120 -k 'causal and b1-' -m 'not slow' --resume reports/x")
    assert resume_command(results, "reports/x").endswith("--run-timeout 120 --resume reports/x")
    assert resume_command(results, "reports/x").startswith("pytest conformance/ ")
    # as many workers as the run had: a resume with another -n is refused (its threads)
    xdist = replace(results, environment={**results.environment, "workers": 8})
    assert resume_command(xdist, "reports/x").startswith("pytest -n 8 conformance/ ")
    # and its threads: a run under OMP_NUM_THREADS=1 on 2 cores was resumed with 2 (refused)
    capped = replace(results, environment={**results.environment, "workers": 1,
                                           "threads_per_worker": 1, "usable_cores": 2})
    assert resume_command(capped, "reports/x").startswith("OMP_NUM_THREADS=1 pytest conformance/")
    whole = replace(capped, environment={**capped.environment, "threads_per_worker": 2})
    assert resume_command(whole, "reports/x").startswith("pytest conformance/")
    # a compile-only pass is resumed as one (--resume refuses another --phase)
    compile_only = replace(results, options={**results.options, "phase": "compile",
                                             "compile_cache": "warm"})
    assert resume_command(compile_only, "reports/x").endswith(
        "--run-timeout 120 --phase compile --compile-cache warm --resume reports/x")


def test_modules_of_the_interpreters_own_site_packages_get_no_pythonpath(monkeypatch):
    """A rerun in another environment with this one's site-packages on PYTHONPATH would import
    this environment's torch: a plugin or case module installed here needs no entry."""
    import site

    from conformance.run_info import import_paths

    spec, cases_module = "tests.fault_backends:WrongNumbers", "tests.gym_variants"
    assert import_paths(spec, [cases_module]) == {
        "backend_pythonpath": str(REPO), "cases_modules_pythonpath": [str(REPO)]}
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(REPO)])
    assert import_paths(spec, [cases_module]) == {}


def test_flexconf_report_renders_from_files_and_rejects_a_bad_file(tmp_path, capsys):
    write_results(doctored_run(), tmp_path / "old.json")
    write_results(doctored_run(seed=1), tmp_path / "new.json")
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "old.json"), str(tmp_path / "new.json"),
                 "-o", str(out)]) == 0
    assert "old.json" in Page((out / "index.html").read_text()).texts
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "something else"}))
    assert main(["report", str(tmp_path / "bad.json"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.json" in err[0] and "not a valid results file" in err[0]


def test_reports_never_import_torch():
    code = ("import sys, reports.render, reports.gate, reports.expectations_update, "
            "reports.cmd_report, reports.cmd_gate, reports.cmd_expectations, reports.junit, "
            "reports.synthetic, reports.gate_json, records.selection; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_failure_rows_link_artifacts_and_show_compile_stages(tmp_path):
    stages = {"neuronx-cc": 41.25, "stablehlo_lowering": 3.1, "fx_passes": 0.2, "other": 0.5}
    failed = replace(record(case_id("alibi"), Label.COMPILE_ERROR, message="neuronx-cc failed"),
                     compile_breakdown=stages, artifacts="artifacts/alibi__b1-9f00ba4",
                     compiled_bytes=3 * 1024 * 1024 // 2)
    doctored = replace(record(case_id("causal"), Label.COMPILE_TIMEOUT),
                       artifacts="javascript:alert(1)")  # from a doctored results file
    passed = replace(record(case_id("full")), compile_breakdown={"neuronx-cc": 2.0, "other": 0.1})
    write_report(run([failed, doctored, passed]), tmp_path)
    page = Page((tmp_path / "index.html").read_text())
    assert page.find("a", class_="artifacts") == [{"class": "artifacts",
                                                   "href": "artifacts/alibi__b1-9f00ba4/"}]
    assert ("neuronx-cc 41.2 · stablehlo_lowering 3.10 · fx_passes 0.20 · other 0.50 · made "
            "1.5 MiB") in page.texts
    assert "neuronx-cc 2.00 · other 0.10" in "".join(page.texts)  # every case, in the table


def test_compile_anatomy_draws_a_stacked_bar_per_case_slowest_first(tmp_path):
    from reports.anatomy import build_anatomy

    records = [Record(case_id="fast", label=Label.PASS, compile_seconds=2.0,
                      compile_breakdown={"dynamo_tracing": 0.5, "inductor_lowering": 1.0,
                                         "other": 0.5}),
               Record(case_id="slow", label=Label.PASS, compile_seconds=8.0,
                      compile_breakdown={"dynamo_tracing": 1.0, "inductor_lowering": 4.0,
                                         "cxx_compile": 2.0, "other": 1.0}),
               Record(case_id="none", label=Label.PASS, compile_seconds=1.0)]
    anatomy = build_anatomy(records)
    assert [row.case_id for row in anatomy.rows] == ["slow", "fast"] and anatomy.with_stages == 2
    slow, fast = anatomy.rows
    assert [(s.name, s.width) for s in slow.segments] == [
        ("dynamo_tracing", 12.5), ("inductor_lowering", 50.0), ("cxx_compile", 25.0), ("other", 12.5)]
    assert sum(s.width for s in fast.segments) == 25.0  # on the slowest case's scale
    assert dict(anatomy.shares)["inductor_lowering"] == 50.0
    write_report(run(records), tmp_path)
    table = Page((tmp_path / "index.html").read_text())
    assert "Compile anatomy: where the compile time went" in table.texts
    assert build_anatomy(records[2:]).rows == []  # no stages, no section


def test_summary_notes_passes_that_took_the_fully_masked_answer():
    from reports.summary import summary_markdown
    from tests.test_report_doctored import case_id, record, run

    took = [record(case_id(seq=128), metrics={"overflow_rows": 384, "overflow_rows_zero": 384}),
            record(case_id(seq=256), metrics={"lse": {"overflow_rows_minus_inf": 12}}),
            record(case_id(seq=512), metrics={"dv": {"as_masked_overflow": True}})]
    exact = [record(case_id(seq=1024), metrics={"overflow_rows": 384, "overflow_rows_zero": 0,
                                                "dv": {"as_masked_overflow": False}}),
             record(case_id(seq=2048), Label.MISMATCH, metrics={"overflow_rows_zero": 384})]
    assert "Oracle note: 3 passing case(s)" in summary_markdown(run(took + exact))
    assert "Oracle note" not in summary_markdown(run(exact))


def test_the_title_names_what_narrowed_the_run_and_an_empty_part_does_not_conform(tmp_path):
    from reports.formatting import run_title
    from reports.summary import conforms, summary_markdown

    whole = run([record(case_id())])
    assert run_title(whole) == "FlexAttention conformance: neuron · smoke"
    narrowed = replace(whole, selection={
        "matrix": "extended", "profile": "smoke", "cases_modules": [], "case_file": None,
        "keyword": "causal/b1 or 'x'", "markexpr": "", "shard": "1/2", "case_ids": None})
    assert run_title(narrowed) == ("FlexAttention conformance: neuron · smoke · extended "
                                   "matrix · -k \"causal/b1 or 'x'\" · shard 1/2 · 1 case")
    by_file = replace(whole, selection={**narrowed.selection, "case_file": "mine.json",
                                        "keyword": "", "shard": None})
    by_file = replace(by_file, options={**by_file.options, "case_ids": ["a/b"]})
    assert run_title(by_file) == ("FlexAttention conformance: neuron · case file mine.json · "
                                  "--case-id 'a/b' · 1 case")
    # interrupted: of how many selected ("2 cases" of 12 read as the whole; an outside audit)
    stopped = replace(narrowed, complete=False, selected_count=12)
    assert run_title(stopped).endswith(" · shard 1/2 · 1 of 12 selected cases")
    # a finished run that also fuzzed: its fuzz/ records are no missing case of the matrix
    finished = replace(narrowed, selected_count=1, options={**narrowed.options,
                                                            "fuzz_examples": 1, "seed": 1},
                       records=(*narrowed.records, record("fuzz/" + case_id())))
    assert run_title(finished).endswith(" · with fuzzing (1 examples, seed 1) · 1 case and 1 "
                                        "fuzzed example")
    # stopped while fuzzing: its fuzzed examples are counted apart from the cases selected
    # (the run's summary said "36 of 12 selected cases"), in the title and the verdict line
    cut = replace(finished, complete=False, selected_count=12, records=(
        *finished.records, record("fuzz/" + case_id(seq=256)), record(case_id(seq=512))))
    assert run_title(cut).endswith(" · 2 of 12 selected cases and 2 fuzzed examples")
    from reports.summary import records_held

    assert records_held(cut) == "2 of 12 selected cases and 2 fuzzed examples have a record"
    alone = replace(cut, selected_count=None, records=cut.records[1:3])
    assert records_held(alone) == "2 fuzzed examples have a record"
    assert conforms(whole) and conforms(narrowed)  # on what it selected, and says what that is
    # a run of fuzzed variants alone was titled with a profile none of its cases had
    fuzzed = replace(whole, options={**whole.options, "fuzz_examples": 50, "seed": 1},
                     selection={**narrowed.selection, "keyword": "", "shard": None,
                                "case_ids": []})
    assert run_title(fuzzed) == "FlexAttention conformance: neuron · fuzzing (50 examples, seed 1)"
    both = replace(fuzzed, selection={**fuzzed.selection, "matrix": "core", "case_ids": ["a"]},
                   records=(*fuzzed.records, record("fuzz/" + case_id())))
    assert run_title(both) == ("FlexAttention conformance: neuron · smoke · with fuzzing (50 "
                               "examples, seed 1)")
    # -k or a later --shard part left the fuzzing test out: no fuzzing claimed (an audit)
    left_out = replace(both, records=fuzzed.records)
    assert run_title(left_out) == "FlexAttention conformance: neuron · smoke"
    empty = replace(narrowed, records=())
    assert not conforms(empty)
    assert verdict_line(empty) == "no case ran"
    empty_part = replace(empty, options={**empty.options, "shard": "2/2"})
    assert verdict_line(empty_part) == "no case ran (no selected case is in this shard)"
    assert "❌ does not conform" in summary_markdown(empty_part)


def test_failures_come_before_unsupported_cases_and_the_known_ones_say_so(tmp_path):
    """On a backend with many UNSUPPORTED cases (Neuron without backward), summary.md's cut
    list must still show every failure; with --expectations, each failure says whether it is
    a known one, and the verdict line counts them."""
    from reports.summary import SUMMARY_MAX_FAILURES, summary_markdown

    skipped = [record(case_id(seq=64 * (i + 1)), Label.UNSUPPORTED, message="no backward")
               for i in range(SUMMARY_MAX_FAILURES + 5)]
    known = replace(record(case_id("alibi", seq=128), Label.MISMATCH, message="off by 2x"),
                    expected_failure="bias <sign> flipped")
    new = record(case_id("alibi", seq=256), Label.CRASH, message="SIGSEGV")
    results = run(skipped + [known, new])
    results = replace(results, options={**results.options, "expectations": "known.toml"})
    summary = summary_markdown(results)
    assert "1 CRASH · 35 UNSUPPORTED · 1 of 2 failures known**" in summary
    failing_part, _, unsupported_part = summary.partition("### Unsupported (35)")
    assert "### Failing (2)" in failing_part
    assert f"| `{new.case_id}` | CRASH | not listed as CRASH |" in failing_part
    assert "| MISMATCH | known: bias &lt;sign&gt; flipped |" in failing_part
    assert unsupported_part.count("| no backward |") == SUMMARY_MAX_FAILURES
    assert "... and 5 more: see index.html." in unsupported_part
    without = summary_markdown(run(skipped + [new]))
    assert "failures known" not in without and "not listed" not in without
    # a file written before expected_failure existed cannot tell "not listed" from "not
    # recorded": its run's --expectations alone says neither
    older = summary_markdown(replace(run(skipped + [new]), options={
        **results.options}))
    assert "failures known" not in older and "not listed" not in older

    write_report(results, tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert "Not passing (37: 2 failing, 35 unsupported)" in page
    assert page.index(f'id="fail:{new.case_id}"') < page.index(f'id="fail:{skipped[0].case_id}"')
    assert "known: bias &lt;sign&gt; flipped" in page


def test_a_cache_hit_is_not_drawn_as_a_cold_compile(tmp_path):
    """A warm run's 0.47 s compile read as a compile in the chart and the anatomy: only the
    all-cases table said 'hit'."""
    stages = {"dynamo_tracing": 0.4, "other": 0.07}
    hit = replace(record(case_id(), compile_seconds=0.47, cache_hit=True),
                  compile_breakdown=stages)
    cold = replace(record(case_id(seq=256), compile_seconds=5.0, cache_hit=False),
                   compile_breakdown={"dynamo_tracing": 4.0, "other": 1.0})
    write_report(run([hit, cold]), tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert "<strong>1 of the 2 cases drawn were cache hits</strong> (drawn pale)" in page
    assert f"{hit.case_id}: 0.47 s (PASS, cache hit: not a cold compile)" in page
    assert f"{cold.case_id}: 5.00 s (PASS)" in page
    assert "<strong>1 of them were cache hits</strong>: their stages are a warm compile" in page
    assert page.count('<span class="note">(cache hit)</span>') == 1


def test_a_report_of_several_runs_names_the_one_it_describes_and_warns_of_their_order(tmp_path):
    old = replace(run([record(case_id())]), started_at="2026-12-01T10:00:00+00:00")
    new = replace(run([record(case_id(), Label.MISMATCH, message="off")], seed=1),
                  started_at="2026-12-02T10:00:00+00:00")
    write_runs_report([old, new], tmp_path / "right", names=["old.json", "new.json"])
    page = (tmp_path / "right" / "index.html").read_text()
    assert "The sections below describe the last run given, new.json." in page
    assert "oldest first" not in page
    write_runs_report([new, old], tmp_path / "wrong", names=["new.json", "old.json"])
    page = (tmp_path / "wrong" / "index.html").read_text()
    assert ("The sections below describe the last run given, old.json; the runs were not given "
            "oldest first (by started_at: old.json, new.json), so the comparison reads each "
            "change backwards: give them oldest first.") in page
    other = replace(old, options={**old.options, "backend": "cuda-inductor"})
    write_runs_report([new, other], tmp_path / "two", names=["neuron.json", "cuda.json"])
    assert "oldest first" not in (tmp_path / "two" / "index.html").read_text()  # no order
    write_runs_report([new, old], tmp_path / "base", names=["new.json", "old.json"],
                      baseline=old)
    assert "oldest first" not in (tmp_path / "base" / "index.html").read_text()
