"""The ground floor: what a run's results are, on disk and in memory. Imports no other package
of the project and no torch; every other package may import it (docs/style: records/ is to
this suite what dEQP's qpTestLog is to dEQP).

- ``records.labels``: the closed set of labels, in one table;
- ``records.results``: ``Record``, ``RunResults``, the JSON Schema, the results file's reader and writer;
- ``records.store``: the append-only per-worker JSONL store a run writes while it goes on;
- ``records.text``: making any message valid, printable text when it is recorded.
"""
from records.labels import Label, LabelInfo
from records.results import (SCHEMA_NAME, SCHEMA_VERSION, Record, ResultsError, RunResults,
                             load_results, results_schema, validate_results_json, write_results)

__all__ = ["Label", "LabelInfo", "Record", "ResultsError", "RunResults", "SCHEMA_NAME",
           "SCHEMA_VERSION", "load_results", "results_schema", "validate_results_json",
           "write_results"]
