"""One case's tensors in one file: what went in, what the backend gave back, and what it should
have given. Written by the executor (``--keep-outputs``, conformance/kept_outputs.py) and by a
reproduction script (``python repro.py --save-outputs FILE``); read by ``load_case_outputs``
(a notebook, ``python repro.py --compare FILE``).

The file is ``torch.save`` of a dict of plain values and CPU tensors (so
``torch.load(path, weights_only=True)`` reads it too):

    format      "flexattention-conformance/case-outputs"    version  1
    case        the case spec (cases.model.Case.to_json)     seed     the run's seed
    label       the record's label ("MISMATCH", ...)         message  the record's message
    inputs      {"q", "k", "v"} and "grad_out" (dO) for fwd+bwd cases: what the backend got
    observed    {"out", "lse", "grads": {"dq", "dk", "dv"}}: what it returned (on the CPU)
    golden      the same keys: the float64 golden            baseline the same: the dtype baseline

``lse`` and ``grads`` are None when the case's mode has none. The golden's and the baseline's
also hold ``row_noise`` and ``unshared_noise`` (reference/golden.py) and, for a backward case
with rows a score mod hides by overflow, ``masked_overflow``: the same keys, for the case with
those rows masked (reference/overflow_rows.py); None otherwise.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from cases.inputs import Inputs
from cases.model import Case
from reference.golden import Reference

FORMAT = "flexattention-conformance/case-outputs"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CaseOutputs:
    """The tensors of one case of one run (see the module docstring for the file)."""

    case: Case
    seed: int
    label: str
    message: str
    inputs: Inputs
    grad_out: torch.Tensor | None  # dO of a backward case
    observed: Reference
    golden: Reference
    baseline: Reference

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held (about the file's size)."""
        return sum(t.numel() * t.element_size() for t in _tensors(self))


def save_case_outputs(outputs: CaseOutputs, path: str | Path) -> Path:
    """Write ``outputs`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    inputs = {"q": outputs.inputs.q, "k": outputs.inputs.k, "v": outputs.inputs.v}
    if outputs.grad_out is not None:
        inputs["grad_out"] = outputs.grad_out
    data = {"format": FORMAT, "version": FORMAT_VERSION, "case": outputs.case.to_json(),
            "seed": outputs.seed, "label": outputs.label, "message": outputs.message,
            "inputs": {k: _cpu(t) for k, t in inputs.items()},
            "observed": reference_to_dict(outputs.observed),
            "golden": reference_to_dict(outputs.golden),
            "baseline": reference_to_dict(outputs.baseline)}
    save_whole(data, path)
    return path


def save_whole(data, path: str | Path) -> None:
    """``torch.save`` of ``data`` into ``path``, whole or not at all: into a temporary file
    beside it, then renamed; the temporary file is removed when the write fails (a full disk
    kept 737 KB of one and then refused the run's results.json: an outside audit). A write
    the disk refuses raises its OSError (torch's own error says "unexpected pos" only)."""
    from records.errors import os_error_in

    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:  # through a Python file: its OSError is in torch's chain
            torch.save(data, f)
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        error = os_error_in(exc)
        if error is not None and error is not exc:
            raise error from exc
        raise


def load_case_outputs(path: str | Path) -> CaseOutputs:
    """The CaseOutputs saved in ``path``; ValueError (one line) for a file of another kind."""
    try:
        data = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; kept outputs are in REPORT_DIR/outputs/ "
                         "(pytest --keep-outputs failed|all)") from None
    except Exception as exc:  # noqa: BLE001 - torn or foreign file: say which
        raise ValueError(f"{path}: not a case outputs file ({type(exc).__name__}: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a case outputs file (no format {FORMAT!r})")
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: case outputs version {data.get('version')!r}; this suite "
                         f"reads version {FORMAT_VERSION}")
    inputs = data["inputs"]
    return CaseOutputs(case=Case.from_json(data["case"]), seed=int(data["seed"]),
                       label=str(data["label"]), message=str(data["message"]),
                       inputs=Inputs(inputs["q"], inputs["k"], inputs["v"]),
                       grad_out=inputs.get("grad_out"),
                       observed=reference_from_dict(data["observed"]),
                       golden=reference_from_dict(data["golden"]),
                       baseline=reference_from_dict(data["baseline"]))


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def reference_to_dict(ref: Reference) -> dict:
    """A Reference as plain values (what torch.save(weights_only) keeps), on the CPU."""
    def on_cpu(tensors: dict | None) -> dict | None:
        return {k: _cpu(t) for k, t in tensors.items()} if tensors else None

    return {"out": _cpu(ref.out), "lse": None if ref.lse is None else _cpu(ref.lse),
            "grads": on_cpu(ref.grads), "row_noise": on_cpu(ref.row_noise),
            "unshared_noise": on_cpu(ref.unshared_noise),
            "row_only_noise": on_cpu(ref.row_only_noise),
            "masked_overflow": None if ref.masked_overflow is None
            else reference_to_dict(ref.masked_overflow)}


def reference_from_dict(data: dict) -> Reference:
    """The Reference of ``reference_to_dict``."""
    noise = data.get("row_noise", data.get("cancelling"))  # its name before 2026-12-03
    other = data.get("masked_overflow")
    return Reference(data["out"], data.get("lse"), data.get("grads"), noise,
                     data.get("unshared_noise"),
                     None if other is None else reference_from_dict(other),
                     data.get("row_only_noise"))


def _tensors(outputs: CaseOutputs) -> list[torch.Tensor]:
    found = [outputs.inputs.q, outputs.inputs.k, outputs.inputs.v]
    if outputs.grad_out is not None:
        found.append(outputs.grad_out)
    refs = [outputs.observed, outputs.golden, outputs.baseline]
    refs += [ref.masked_overflow for ref in refs if ref.masked_overflow is not None]
    for ref in refs:
        found.append(ref.out)
        if ref.lse is not None:
            found.append(ref.lse)
        found += list((ref.grads or {}).values())
        found += list((ref.row_noise or {}).values())
        found += list((ref.unshared_noise or {}).values())
        found += list((ref.row_only_noise or {}).values())
    return found
