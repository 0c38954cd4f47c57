"""What a fuzzing run records and prints: each drawn example becomes a record (``fuzz/<case
id>``) of results.json as it runs, and with ``-v`` one terminal line. Once an example fails,
hypothesis shrinks it: those executions try ever smaller cases and are not recorded (they
would bury the one failure under dozens); the minimal failing case is, at the end.

A resumed run (``--resume``) fuzzes again with the run's examples and seed: the search draws
the same cases (conformance/fuzz.py), and an example the run finished before it stopped is
replayed from its record instead of run again, so the resume runs only what was cut off or
never drawn. When the fuzzing test ends, by returning, by an error of its own (hypothesis'
Unsatisfiable, a case module's fuzz_variants that raises) or by its own failure or skip, the
store is told (``fuzzing_finished``): until then the run is not complete. A stop signal, a
kill, a store that refuses a record or pytest-timeout's failure raised into the search cuts
the search off instead, and a resume finishes it."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Iterator, NoReturn

from cases.model import Case, fuzz_id
from records.errors import is_not_judged
from records.results import Record


class FuzzLog:
    def __init__(self, config, runner):
        self.runner = runner
        self.recorded: set[str] = set()
        self.shrunk: set[str] = set()  # ids tried while shrinking: no records, so no kept files
        self.shrinking = False
        self.replayed = 0
        self.failed_reruns: list[Record] = []  # cut-off examples run by themselves that failed
        self._own: BaseException | None = None  # the failure or skip ``fail``/``skip`` raised last
        self._finished_before, self._cut_off_before = _examples_before(runner.options) \
            if runner.options.resume else ({}, {})
        self._verbose = config.getoption("verbose", 0) > 0
        self._reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._capture = config.pluginmanager.get_plugin("capturemanager")

    def start(self, examples: int, backend: str, can_run) -> None:
        refused = "".join(f"; not drawn: {line}" for line in can_run.refusals())
        self._say(f"fuzz: {examples} examples on {backend}, modes {', '.join(can_run.modes)}, "
                  f"dtypes {', '.join(can_run.dtypes)}{refused}")

    def execute(self, case: Case) -> Record:
        """Run one drawn case (the callback of conformance.fuzz.search)."""
        if self.shrinking:
            record = replace(self.runner.executor.execute(case), case_id=fuzz_id(case))
            self.shrunk.add(record.case_id)
            self._say(f"  shrinking: {record.case_id} {record.label.value}")
            return record
        record = self._finished_before.get(fuzz_id(case))
        replayed = record is not None  # the run finished it before it stopped
        if replayed:
            self.replayed += 1
        else:
            record = self.runner.record_case(case, fuzz_id(case))
        self.recorded.add(record.case_id)
        # a case a full disk kept from being judged is no failure to shrink (conformance/fuzz.py)
        self.shrinking = not (record.label.acceptable or is_not_judged(record))
        self._say(f"{record.case_id} {record.label.value}"
                  + (" (recorded before the run stopped)" if replayed else ""))
        return record

    @contextlib.contextmanager
    def search_ends(self) -> Iterator[None]:
        """Around the fuzzing test's work: the store hears that it ended where it returned,
        raised an error (an ``Exception``: it would raise again in a resume) other than an
        OSError (the store refusing a record), or left through ``fail`` or ``skip``; not where
        another BaseException left it (an outside audit: pytest-timeout's failure, raised into
        the search, made a run of 10 examples of 15 complete; a review: a stop after the hook
        had failed once inside the search did too). Examples tried while shrinking keep no
        output file, however the test ends (a stop left them counted as kept outputs)."""
        try:
            yield
        except BaseException as exc:
            own = self._own is not None and (exc is self._own or self._own in getattr(
                exc, "exceptions", ()))
            if own or (isinstance(exc, Exception) and not isinstance(exc, OSError)):
                self.runner.writer.fuzzing_finished(len(self.recorded))
            raise
        else:
            self.runner.writer.fuzzing_finished(len(self.recorded))
        finally:
            self._drop_unrecorded_outputs()

    def fail(self, message: str) -> NoReturn:
        """Fail the fuzzing test, which ends the search (pytest.fail, one line, no trace)."""
        import pytest

        self._own = pytest.fail.Exception(message, pytrace=False)
        raise self._own

    def skip(self, message: str) -> NoReturn:
        import pytest

        self._own = pytest.skip.Exception(message, allow_module_level=False)
        raise self._own

    def finish(self, result) -> None:
        """Record the minimal failing case (when shrinking found a smaller one). In a resume,
        first run by itself each example the run had started and not finished that this
        search did not draw again (another hypothesis release draws others for the seed):
        its record would otherwise stay the CRASH of the kill."""
        for case_id, case in self._cut_off_before.items():
            if case_id not in self.recorded:
                record = self.runner.record_case(case, case_id)
                self.recorded.add(record.case_id)
                if not (record.label.acceptable or is_not_judged(record)):  # fails the test
                    self.failed_reruns.append(record)
                self._say(f"{case_id} {record.label.value}, run again by itself (cut off when "
                          "the run stopped)")
        failure = result.failure
        if failure is not None and failure.case_id not in self.recorded:
            self.runner.writer.finished(failure)
            self.recorded.add(failure.case_id)
        if failure is not None:
            self._say(f"fuzz: minimal failing case {failure.case_id} {failure.label.value}")
        if self.replayed:
            self._say(f"fuzz: {self.replayed} example(s) replayed from the records of the run "
                      "it resumed")

    def _drop_unrecorded_outputs(self) -> None:
        from conformance.kept_outputs import outputs_path

        for record_id in self.shrunk - self.recorded:  # outputs kept for a case with no record
            outputs_path(self.runner.options.report_dir, record_id).unlink(missing_ok=True)

    def _say(self, line: str) -> None:
        if not (self._verbose and self._reporter):  # an xdist worker has no terminal reporter
            return
        if self._capture is None:
            self._reporter.write_line(line)
            return
        with self._capture.global_and_fixture_disabled():
            self._reporter.write_line(line)


def _examples_before(options) -> tuple[dict[str, Record], dict[str, Case]]:
    """The fuzzed examples of the resumed run: those with a finished record (records/events.py
    finished_in: not cut off, not kept from being judged by a full disk), and the cases of
    the others (cut off, or not judged), where their spec can be read back."""
    from records.events import finished_in, merge_records
    from records.results import is_fuzzed

    merged = merge_records(options.report_dir, [])
    finished = finished_in(merged)
    done, again = {}, {}
    for record in merged.records:
        if not is_fuzzed(record.case_id):
            continue
        if record.case_id in finished:
            done[record.case_id] = record
            continue
        try:
            again[record.case_id] = Case.from_json(record.case)
        except (KeyError, TypeError, ValueError):  # a spec no longer read: drawn again or not
            pass
    return done, again
