"""What a fuzzing run records and prints: each drawn example becomes a record (``fuzz/<case
id>``) of results.json as it runs, and with ``-v`` one terminal line. Once an example fails,
hypothesis shrinks it: those executions try ever smaller cases and are not recorded (they
would bury the one failure under dozens); the minimal failing case is, at the end."""
from __future__ import annotations

from dataclasses import replace

from cases.model import Case, fuzz_id
from records.errors import is_not_judged
from records.results import Record


class FuzzLog:
    def __init__(self, config, runner):
        self.runner = runner
        self.recorded: set[str] = set()
        self.shrunk: set[str] = set()  # ids tried while shrinking: no records, so no kept files
        self.shrinking = False
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
        record = self.runner.record_case(case, fuzz_id(case))
        self.recorded.add(record.case_id)
        # a case a full disk kept from being judged is no failure to shrink (conformance/fuzz.py)
        self.shrinking = not (record.label.acceptable or is_not_judged(record))
        self._say(f"{record.case_id} {record.label.value}")
        return record

    def finish(self, result) -> None:
        """Record the minimal failing case (when shrinking found a smaller one)."""
        failure = result.failure
        if failure is not None and failure.case_id not in self.recorded:
            self.runner.writer.finished(failure)
            self.recorded.add(failure.case_id)
        from conformance.kept_outputs import outputs_path

        for record_id in self.shrunk - self.recorded:  # outputs kept for a case with no record
            outputs_path(self.runner.options.report_dir, record_id).unlink(missing_ok=True)
        if failure is not None:
            self._say(f"fuzz: minimal failing case {failure.case_id} {failure.label.value}")

    def _say(self, line: str) -> None:
        if not (self._verbose and self._reporter):  # an xdist worker has no terminal reporter
            return
        if self._capture is None:
            self._reporter.write_line(line)
            return
        with self._capture.global_and_fixture_disabled():
            self._reporter.write_line(line)
