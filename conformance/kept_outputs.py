"""``--keep-outputs none|failed|all``: which cases' tensors the executor saves, where, and how big.

A kept case is one file, ``<report-dir>/outputs/<case id as a file name>.pt``, in the format of
reference/outputs.py (``reference.load_case_outputs`` reads it): the inputs, what the backend
returned, the golden and the baseline. Only a case whose backend returned an output has one
(a compile error, a timeout or a crash has nothing to inspect). A case whose tensors exceed
the cap is not saved; its record's message gets one line saying so (``SKIPPED_NOTE``).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from cases.model import Case, file_stem, split_origin
from records.results import Record

KEEP_CHOICES = ("none", "failed", "all")
OUTPUTS_DIR = "outputs"
DEFAULT_CAP = "256M"
KEPT_NOTE = "outputs kept:"
SKIPPED_NOTE = "outputs not kept:"


@dataclass(frozen=True)
class KeepPolicy:
    keep: str = "none"  # one of KEEP_CHOICES
    cap_bytes: int = 256 << 20  # the most one case's file may hold (DEFAULT_CAP)
    report_dir: str | None = None  # None: nothing is kept

    def wants(self, record: Record) -> bool:
        if self.report_dir is None or self.keep == "none":
            return False
        return self.keep == "all" or not record.label.acceptable


def check_keep(text: str) -> str:
    if text not in KEEP_CHOICES:
        raise ValueError(f"--keep-outputs {text!r} is unknown; use one of: {', '.join(KEEP_CHOICES)}")
    return text


def outputs_path(report_dir: str | Path, record_id: str) -> Path:
    """Where the kept outputs of a record's case go: named by the case id (a fuzzed example's
    ``fuzz/`` prefix dropped: the same case has the same tensors)."""
    return Path(report_dir) / OUTPUTS_DIR / f"{file_stem(split_origin(record_id)[1])}.pt"


def clear_outputs(report_dir: str | Path) -> None:
    """Start a run: an earlier run's files must not pass for this run's."""
    shutil.rmtree(Path(report_dir) / OUTPUTS_DIR, ignore_errors=True)


def keep_outputs(policy: KeepPolicy, case: Case, seed: int, record: Record, observed,
                 golden, baseline) -> Record:
    """Save the case's tensors when ``policy`` wants them; the record, with a note for a
    failure that was kept or a case that the cap skipped."""
    if not policy.wants(record):
        return record
    from cases.inputs import make_grad_output, make_inputs
    from reference.outputs import CaseOutputs, save_case_outputs

    # The inputs are a function of the case id and the seed (cases/inputs.py): the child made
    # exactly these, so they are made again here rather than sent back through a file.
    outputs = CaseOutputs(
        case=case, seed=seed, label=record.label.value, message=record.message,
        inputs=make_inputs(case, seed),
        grad_out=make_grad_output(case, seed) if case.mode == "fwd+bwd" else None,
        observed=observed, golden=golden, baseline=baseline)
    if outputs.nbytes > policy.cap_bytes:
        return _noted(record, f"{SKIPPED_NOTE} {_size(outputs.nbytes)} is over "
                              f"--keep-outputs-cap ({_size(policy.cap_bytes)}); raise the cap "
                              "to keep them")
    try:
        path = save_case_outputs(outputs, outputs_path(policy.report_dir, record.case_id))
    except OSError as exc:  # a full disk must not cost the case its record
        return _noted(record, f"{SKIPPED_NOTE} {type(exc).__name__}: {exc}")
    return record if record.label.acceptable else _noted(record, f"{KEPT_NOTE} {path}")


def summary_lines(records, report_dir: str | Path) -> list[str]:
    """The terminal summary's lines about kept outputs: where, and which the cap skipped."""
    directory = Path(report_dir) / OUTPUTS_DIR
    kept = sorted(directory.glob("*.pt")) if directory.is_dir() else []
    skipped = [r for r in records if SKIPPED_NOTE in (r.message or "")]
    files = f"{len(kept)} file" + ("" if len(kept) == 1 else "s")
    lines = [f"outputs: {files} kept in {directory}"] if kept else []
    lines += [f"{SKIPPED_NOTE} {r.case_id} ("
              + ("over --keep-outputs-cap" if "--keep-outputs-cap" in r.message else
                 "they could not be written") + ")" for r in skipped]
    return lines


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def _noted(record: Record, note: str) -> Record:
    message = f"{record.message}\n{note}" if record.message else note
    return replace(record, message=message)
