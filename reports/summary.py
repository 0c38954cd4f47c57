"""What a run says in a few words: counts per label, the verdict line, the failing cases,
the command that reruns one case, and ``summary.md`` (short enough for a PR comment)."""
from __future__ import annotations

from collections import Counter

from reports.compare import Comparison
from records.text import first_line
from reports.formatting import fmt_seconds, recorded_of_selected, run_title
from reports.markdown import md_code, md_table, md_text
from records.metrics import took_masked_answer
from records.results import Label, Record, RunResults, is_fuzzed
from records.selection import matrix_selects, selection_damage
from conformance.run_info import shell_command

#: At most this many failures are listed in summary.md; the rest are in index.html.
SUMMARY_MAX_FAILURES = 30


def label_counts(records: tuple[Record, ...] | list[Record]) -> dict[Label, int]:
    """Labels that occur, with their counts, in the order of the Label enum."""
    counts = Counter(r.label for r in records)
    return {label: counts[label] for label in Label if counts[label]}


def is_compile_pass(results: RunResults) -> bool:
    """Whether ``results`` is a compile-only pass (``--phase compile``): no verdicts in it."""
    return results.options.get("phase") == "compile"


def verdict_line(results: RunResults, with_known: bool = True) -> str:
    """``89/96 PASS · 7 COMPILE_TIMEOUT`` (and a warning when the run was interrupted); a
    compile-only pass counts COMPILED instead and says that it judged no numbers. With
    ``with_known``, how many failures the run's --expectations listed (the gate leaves that
    out: it judges against its own --expectations)."""
    counts = label_counts(results.records)
    head = Label.COMPILED if is_compile_pass(results) else Label.PASS
    parts = [f"{counts.get(head, 0)}/{len(results.records)} {head.value}"]
    parts += [f"{n} {label.value}" for label, n in counts.items() if label is not head]
    failures = failing(results)
    if with_known and with_expectations(results) and failures:
        known = sum(1 for r in failures if r.expected_failure)
        parts.append(f"{known} of {len(failures)} failures known")
    if head is Label.COMPILED:
        parts.append("compile-only pass, numbers not judged")
    if not results.records:
        parts = ["no case ran" + (" (no selected case is in this shard)"
                                  if results.options.get("shard") else "")]
    if not results.complete:
        held = records_held(results)
        parts.append(f"run INCOMPLETE: {held}" if held else "run INCOMPLETE")
    elif damage := selection_damage(results):
        parts.append(f"file DAMAGED: it says complete, but {damage} (an edited or damaged "
                     "file)")
    return " · ".join(parts)


def records_held(results: RunResults) -> str:
    """``5 of 8 selected cases have a record, 1 of them cut off (CRASH)``: how much of an
    unfinished run's selection is recorded, the cases its interruption cut off counted apart
    (their CRASH record says only that the worker stopped; records/events.py), fuzzed examples
    counted beside; "" when the selected count is unknown and the run did not fuzz."""
    selected = results.selected_count
    if not selected and not any(is_fuzzed(r.case_id) for r in results.records):
        return ""
    cut_off = sum(1 for r in results.records if r.label is Label.CRASH and not r.finished_at)
    held = recorded_of_selected(results.records, selected)
    return (f"{held} have a record"
            + (f", {cut_off} of them cut off (CRASH)" if cut_off else ""))


def conforms(results: RunResults) -> bool:
    """dEQP rule: a run conforms when it is complete and every label is acceptable. A
    compile-only pass never conforms: it judged no numbers; nor does a run of no case (an
    empty --shard part), nor a file that says complete but lacks records of its selection
    (edited or damaged: the gate refuses it too)."""
    return (results.complete and not is_compile_pass(results) and bool(results.records)
            and selection_damage(results) is None
            and all(r.label.acceptable for r in results.records))


def non_passing(results: RunResults) -> list[Record]:
    """Every record whose label is not PASS (nor COMPILED): the failures in case order, then
    the UNSUPPORTED cases, so a cut list shows the failures first."""
    return failing(results) + unsupported(results)


def failing(results: RunResults) -> list[Record]:
    """The records that keep a run from conforming (not PASS, COMPILED, UNSUPPORTED)."""
    return [r for r in results.records
            if r.label not in (Label.PASS, Label.COMPILED, Label.UNSUPPORTED)]


def unsupported(results: RunResults) -> list[Record]:
    return [r for r in results.records if r.label is Label.UNSUPPORTED]


def with_expectations(results: RunResults) -> bool:
    """Whether the run's records say which failures its ``--expectations`` listed: some record
    carries an ``expected_failure`` (a results file written before the field existed, on
    2026-12-05, cannot tell "not listed" from "not recorded", and says neither)."""
    return any(r.expected_failure for r in results.records)


def known_text(record: Record) -> str:
    """How a failure stands against ``--expectations``: ``known: REASON``, or ``not listed as
    LABEL``: the record cannot tell a case the file does not name from one it lists with
    another label (a known MISMATCH that became a COMPILE_ERROR), and plain "not listed" was
    false for the second (an outside audit; the gate names the listed label)."""
    return f"known: {record.expected_failure}" if record.expected_failure \
        else f"not listed as {record.label.value}"


def rerun_command(results: RunResults, case_ids: str | list[str]) -> str:
    """The command that reruns exactly this case, or these cases (``--case-id``, matched
    whole), with every option that selected and judged them, into a report directory of its
    own so it never replaces the run they came from. The backend is named as ``--backend``
    gave it (an entry point's name, a ``module:object`` with the PYTHONPATH it was imported
    from). A fuzzed case (``fuzz/`` id) is in no
    matrix: its command is ``flexconf repro`` of the run's results.json (one id at a time)."""
    ids = [case_ids] if isinstance(case_ids, str) else list(case_ids)
    if ids and all(is_fuzzed(i) for i in ids):
        return repro_command(results, ids[0])
    env, args = rerun_args(results, [i for i in ids if not is_fuzzed(i)])
    return shell_command(env, ["pytest", *args])


def repro_command(results: RunResults, case_id: str) -> str:
    """``flexconf repro`` of ``case_id`` from the run's results.json (in its report
    directory), with the PYTHONPATH its backend and case modules need."""
    from conformance import run_info

    report_dir = str(results.options.get("report_dir") or "reports/latest").rstrip("/")
    return run_info.repro_command(results.options, f"{report_dir}/results.json", case_id)


def rerun_args(results: RunResults, case_ids, report_dir: str | None = None,
               matrix: str | None = None) -> tuple[dict[str, str], list[str]]:
    """What ``rerun_command`` runs, for a subprocess: the environment it adds and the
    arguments after ``pytest`` (run from where the run started, or from where ``matrix`` is
    the ``conformance/`` directory), rerunning exactly ``case_ids`` into ``report_dir``
    (default: the run's report directory with ``-rerun`` appended)."""
    env, args = _run_args(results, matrix)
    for case_id in case_ids:
        args += ["--case-id", case_id]
    args += ["--report-dir", report_dir or _rerun_dir(results.options.get("report_dir"))]
    return env, args


def resume_command(results: RunResults, report_dir, matrix: str | None = None) -> str:
    """The command that finishes the interrupted run ``results`` in ``report_dir`` with the
    run's own options (``--resume``; its ``-n``, its shard's ``--shard``, its ``-k`` and
    ``-m``), from the directory the run started in, or from where ``matrix`` (the
    ``conformance/`` argument) is right."""
    from records.selection import selection_of

    env, args = _run_args(results, matrix)
    fuzzed = results.options.get("fuzz_examples")  # fuzzes again, replaying what finished
    fuzzed = fuzzed if isinstance(fuzzed, int) and fuzzed > 0 else 0
    if fuzzed and selection_of(results).case_ids == ():  # it fuzzed and selected no case:
        args[0] = f"{args[0].rstrip('/')}/test_fuzz.py"  # the matrix would be "not part of it"
    if results.options.get("shard"):
        args += ["--shard", str(results.options["shard"])]
    selection = selection_of(results)  # the same -k / -m: nothing selected here is left out
    args += ["-k", selection.keyword] if selection.keyword else []
    args += ["-m", selection.markexpr] if selection.markexpr else []
    args += ["--fuzz-examples", str(fuzzed)] if fuzzed else []
    args += ["--resume", str(report_dir)]
    # as many workers, and threads each, as the run had: a resume measures as the run did
    # (conformance/run_lifecycle.py refuses another number of threads per worker)
    facts = results.environment
    workers, threads, cores = (facts.get(key) for key in ("workers", "threads_per_worker",
                                                          "usable_cores"))
    layout = ["-n", str(workers)] if isinstance(workers, int) and workers > 1 else []
    if all(isinstance(v, int) and v > 0 for v in (workers, threads, cores)) \
            and threads < max(1, cores // workers):  # the run's OMP_NUM_THREADS capped them
        env = {"OMP_NUM_THREADS": str(threads), **env}
    return shell_command(env, ["pytest", *layout, *args])


def resume_command_of(report_dir, manifest) -> str:
    """``resume_command`` of a run known by its manifest (records/run.json) and the
    environment its first worker recorded, not by a results file: for the refusals of
    ``--resume`` and ``flexconf recover``, which said only "the run's options" (a user had to
    find them; an outside audit)."""
    import shlex

    from conformance.run_info import matrix_path
    from records.events import recorded_environments

    if not (manifest.options or {}).get("backend"):  # a manifest that says too little
        return (f"pytest {matrix_path()} --resume {shlex.quote(str(report_dir))} and the "
                "run's options")
    environments = recorded_environments(report_dir)
    run = RunResults(environments[0] if environments else {}, manifest.options or {}, (),
                     manifest.suite_version or "", manifest.started_at or "",
                     selection=manifest.selection)
    return resume_command(run, report_dir, matrix_path())


def _run_args(results: RunResults, matrix: str | None = None
              ) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments after ``pytest`` that select and judge as the run
    did (backend, profile, matrix, case modules and file, seed, budgets, timed runs, phase,
    cache).
    The matrix is ``matrix``, else the ``conformance/`` the run named from where it started
    (``options.matrix_path``; files before it: ``conformance/``, from the suite's root)."""
    opts = results.options
    backend, env = rerun_backend(results)
    args = [matrix or str(opts.get("matrix_path") or "conformance/"), "--backend", backend,
            "--profile", str(opts.get("profile", "?"))]
    if opts.get("matrix") not in (None, "core") and matrix_selects(opts["matrix"],
                                                                  opts.get("case_file")):
        args += ["--matrix", str(opts["matrix"])]
    for module in opts.get("cases_modules") or []:
        args += ["--cases-module", str(module)]
    if opts.get("case_file"):
        args += ["--case-file", str(opts["case_file"])]
    for key in ("seed", "compile_timeout", "run_timeout", "timed_runs"):
        if opts.get(key) is not None:
            args += [f"--{key.replace('_', '-')}", _number(opts[key])]
    if opts.get("phase") not in (None, "all"):  # a compile-only pass: --resume needs it too
        args += ["--phase", str(opts["phase"])]
    if opts.get("compile_cache") == "warm":
        args += ["--compile-cache", "warm"]
    if opts.get("expectations"):  # its known failures are xfail again
        args += ["--expectations", str(opts["expectations"])]
    if opts.get("backend") == "neuron":  # how the run used the device and flex_attention's check
        for key in ("neuron_cores_per_worker", "neuron_device_check"):
            if opts.get(key) is not None:
                args += [f"--{key.replace('_', '-')}", _number(opts[key])]
    return env, args


def rerun_backend(results: RunResults) -> tuple[str, dict[str, str]]:
    """The ``--backend`` a rerun of ``results`` names, and the environment it adds: the
    backend as the run was given it (conformance.run_info.rerun_backend_spec), and PYTHONPATH
    naming where that backend and the case modules were imported from
    (conformance.run_info.import_paths)."""
    from conformance.run_info import pythonpath_env, rerun_backend_spec

    return rerun_backend_spec(results.options), pythonpath_env(results.options)


def _rerun_dir(report_dir) -> str:
    return f"{str(report_dir or 'reports/latest').rstrip('/')}-rerun"


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def masked_answer_cases(records) -> list[str]:
    """Ids of the passing records whose verdict took the fully masked answer somewhere."""
    return [r.case_id for r in records if r.label is Label.PASS
            and isinstance(r.metrics, dict) and took_masked_answer(r.metrics)]


def comparison_line(comparison: Comparison) -> str:
    """``2 regressions · 1 fix · 3 new · 0 missing · 1 slower to compile``; the last says
    so where the two runs' times cannot be compared (timed on different machines, or not both
    with a cold compile cache)."""
    def count(n: int, word: str, plural: str) -> str:
        return f"{n} {word if n == 1 else plural}"

    slower = count(len(comparison.slower), "slower to compile", "slower to compile")
    if comparison.machines:
        slower += " (timed on different machines: not compared)"
    elif not comparison.both_cold:
        slower += " (not both compiled cold: for information only)"
    return " · ".join([
        count(len(comparison.regressions), "regression", "regressions"),
        count(len(comparison.fixes), "fix", "fixes"),
        count(len(comparison.changed), "other label change", "other label changes"),
        count(len(comparison.new), "new case", "new cases"),
        count(len(comparison.missing), "missing case", "missing cases"),
        slower,
    ])


def _variant_of(record: Record) -> str:
    """The variant's name (its parameters may change with the length: ``prefix_lm``), from
    the record's spec; else the variant part of its id (``fuzz/`` kept)."""
    name = record.case.get("variant") if isinstance(record.case, dict) else None
    if isinstance(name, str) and name:
        return f"fuzz/{name}" if is_fuzzed(record.case_id) else name
    parts = record.case_id.split("/")
    return "/".join(parts[:2]) if is_fuzzed(record.case_id) and len(parts) > 1 else parts[0]


def _failures_by_variant(results: RunResults) -> list[str]:
    """Each variant with a failing case: how many of its cases fail, and how (the failing
    table shows its first SUMMARY_MAX_FAILURES only: with 92 failures, six variants were
    never named in summary.md; an outside audit)."""
    rows = failing(results)
    if not rows:
        return []
    totals = Counter(_variant_of(r) for r in results.records)
    labels: dict[str, Counter] = {}
    for r in rows:
        labels.setdefault(_variant_of(r), Counter())[r.label.value] += 1
    return [f"### Failing by variant ({len(labels)})", ""] + md_table(
        ["variant", "failing", "labels"],
        [[md_code(variant), f"{sum(counts.values())} of {totals[variant]}",
          ", ".join(f"{n} {label}" for label, n in counts.most_common())]
         for variant, counts in labels.items()]) + [""]


def _run_facts(results: RunResults) -> str:
    """When, by which suite, and under which seed and budgets the run ran."""
    env, options = results.environment, results.options
    revision = str(env.get("git_revision") or "")[:12]
    facts = [f"started {results.started_at}" if results.started_at else "",
             f"suite {results.suite_version}" + (f" (git {revision})" if revision else ""),
             f"seed {options['seed']}" if options.get("seed") is not None else ""]
    budgets = [f"{what} {fmt_seconds(options[key])} s" for what, key in (
        ("compile", "compile_timeout"), ("run", "run_timeout")) if options.get(key)]
    if budgets:
        facts.append("budgets: " + ", ".join(budgets))
    return " · ".join(fact for fact in facts if fact)


def _failing_table(results: RunResults) -> list[str]:
    rows = failing(results)
    if not rows:
        return []
    with_known = with_expectations(results)
    header = ["case", "label"] + (["expectations"] if with_known else []) + ["compile", "message"]
    return [f"### Failing ({len(rows)})", ""] + md_table(header, [
        [md_code(r.case_id), r.label.value] + ([md_text(first_line(known_text(r), 100))]
                                                if with_known else [])
        + [fmt_seconds(r.compile_seconds), md_text(first_line(r.message, 160))]
        for r in rows[:SUMMARY_MAX_FAILURES]]) + _more(len(rows))


def _more(count: int) -> list[str]:
    if count > SUMMARY_MAX_FAILURES:
        return ["", f"... and {count - SUMMARY_MAX_FAILURES} more: see index.html.", ""]
    return [""]


def summary_markdown(results: RunResults, comparison: Comparison | None = None,
                     against: str = "the baseline") -> str:
    """The text of summary.md: verdict, counts per label, comparison, the failures."""
    mark = "✅ conforms" if conforms(results) else "❌ does not conform"
    lines = [f"## {md_text(run_title(results))}", "",
             f"**{md_text(verdict_line(results))}** ({mark})", ""]
    counts = label_counts(results.records)
    lines += md_table(["label", "cases"], [[label.value, str(n)] for label, n in counts.items()])
    lines.append("")
    if comparison is not None:
        lines += [f"Against {md_text(against)}: {md_text(comparison_line(comparison))}.", ""]
        if comparison.differs:
            lines += [f"Not a release comparison: {md_text(comparison.differs)} (the gate "
                      "refuses this pair).", ""]
        for title, changes in (("Regressions", comparison.regressions),
                               ("Fixes", comparison.fixes)):
            if changes:
                lines += [f"### {title} ({len(changes)})", ""]
                lines += md_table(["case", "baseline", "now"], [
                    [md_code(c.case_id), c.before_text, c.after_text]
                    for c in changes[:SUMMARY_MAX_FAILURES]])
                lines.append("")
    lines += _failures_by_variant(results)
    lines += _failing_table(results)
    skipped = unsupported(results)
    if skipped:
        lines += [f"### Unsupported ({len(skipped)})", ""]
        lines += md_table(["case", "reason"], [
            [md_code(r.case_id), md_text(first_line(r.message, 160))]
            for r in skipped[:SUMMARY_MAX_FAILURES]])
        lines += _more(len(skipped))
    from reports.performance import DENSE_THRESHOLD, case_performance

    dense = [row for row in case_performance(results.records) if row.dense]
    if dense:
        cases = "case costs" if len(dense) == 1 else "cases cost"
        lines += [f"Performance note: {len(dense)} masked {cases} as if dense (more than "
                  f"{DENSE_THRESHOLD:g}x what skipping the empty tiles would, e.g. "
                  f"{md_code(dense[0].case_id)}: {dense[0].tile_efficiency:.2f}x); see "
                  "index.html. Not a conformance failure.", ""]
    masked = masked_answer_cases(results.records)
    if masked:
        lines += [f"Oracle note: {len(masked)} passing case(s) returned rows that a score mod "
                  "hides by overflow as fully masked (output 0, lse -inf or the gradients "
                  f"without them), e.g. {md_code(masked[0])}: one of the two answers correct "
                  "kernels give there (docs/oracle.md, \"Rows hidden by overflow\").", ""]
    from reports.merge_facts import duplicates_note

    merge_note = duplicates_note(results)
    if merge_note:
        lines += [f"Merge note: {md_text(merge_note)}.", ""]
    env = results.environment
    facts = [f"{key} {env[key]}" for key in ("device", "torch", "torch_neuronx", "device_check",
                                             "host") if env.get(key)]
    if facts:
        lines += [md_text(" · ".join(str(f) for f in facts)), ""]
    run_facts = _run_facts(results)
    if run_facts:
        lines += [md_text(run_facts), ""]
    return "\n".join(lines)
