"""The label of a case from what was observed: the one decision function, called by the
executor (``conformance/executor.py``) and by a reproduction script (``repro_runtime``).

    Observation that decides by itself (error, timeout, crash, ...) ─▶ protocol.label_of
    ok, compile-only pass ─▶ COMPILED
    ok ─▶ the output file against the golden and baseline ─▶ reference.verdict.judge ─▶ PASS | MISMATCH
          (the first call's result, and each later call's that differs from it bit for bit:
          MISMATCH where any fails)
    the reference, the output file or the verdict failed ─▶ HARNESS_ERROR (the suite's fault)
    the case's mods raise in the reference, and the backend failed with an error; or its
          score mod raises somewhere on the grid (where eager flex_attention applies it:
          masked points too), and the backend failed with an error before its first call
          returned ─▶ HARNESS_ERROR (the case's fault: a table indexed out of bounds)
    the golden itself is NaN somewhere (the case's mods make a score +inf or NaN at a visible
          pair, or the score mod's gradient NaN): flex_attention's answer is undefined there,
          for every backend alike ─▶ HARNESS_ERROR (the case's fault)
    the baseline (a careful kernel in the case dtype, its mods evaluated in float32 or the
          dtype, as flex_attention evaluates them) is NaN or inf where the golden is finite
          (the case overflows the arithmetic flex_attention defines it in: a naive softplus,
          log(1 + exp(40 s)), gives inf in float32), and the backend's answer passes with those
          values left out ─▶ HARNESS_ERROR (the case's fault); wrong elsewhere ─▶ MISMATCH
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cases.model import Case
from conformance.protocol import Observation, Phase, label_of, load_output
from records.errors import NOT_JUDGED_KEY
from records.labels import Label
from records.metrics import took_masked_answer
from records.text import first_line


@dataclass(frozen=True)
class Decision:
    label: Label
    message: str = ""
    metrics: dict[str, Any] | None = None
    observed: Any = None  # the backend's output as read back (a Reference), when judged


def decide(case: Case, obs: Observation, reference: tuple | BaseException | None) -> Decision:
    """``reference``: the (golden, baseline) pair, the exception computing it raised, or None
    in a compile-only pass (no reference is computed there)."""
    from cases.pointwise import PointwiseModError

    from conformance.protocol import Outcome

    label = label_of(obs)
    if Outcome(obs.outcome) is Outcome.DISK_FULL:  # the child saw the errno (conformance/child.py)
        return disk_full(obs.message)
    if label in _ERRORS_A_MOD_EXPLAINS:
        backend = f"{label.value}: {first_line(obs.message, 300)}"
        if isinstance(reference, PointwiseModError):
            return Decision(Label.HARNESS_ERROR, (
                f"the case's own mods fail in the float64 reference: {reference}; fix the "
                f"variant, not the backend (the backend: {backend})"))
        # not after the first call succeeded: the backend evaluated the mod without an error
        raised = _score_mod_raises(case) if Phase(obs.phase) is not Phase.RUN else None
        if raised is not None:
            return Decision(Label.HARNESS_ERROR, (
                f"the case's own score_mod fails where flex_attention evaluates it: {raised}; "
                "eager flex_attention applies the score mod at every point, masked or not (the "
                "float64 reference, only at the points the mask keeps, did not meet it); fix "
                f"the variant, not the backend (the backend: {backend})"))
    if label is not None:
        return Decision(label, obs.message)
    if reference is None:
        return Decision(Label.COMPILED)
    if isinstance(reference, BaseException):  # the reference is ours: a harness fault
        return Decision(Label.HARNESS_ERROR,
                        f"the reference computation failed: {one_line(reference)}")
    golden, baseline = reference
    undefined = _undefined_answer(golden)
    if undefined:
        return Decision(Label.HARNESS_ERROR, (
            f"the case's own mods make flex_attention's answer NaN ({undefined}): a score of "
            "+inf or NaN at a visible pair, or a score mod whose gradient is NaN there; no "
            "backend can be judged on it; fix the variant, not the backend"))
    try:
        results = load_output(obs.output_path)
    except Exception as exc:  # noqa: BLE001
        return Decision(Label.HARNESS_ERROR, f"cannot read the child's output: {one_line(exc)}")
    from reference.verdict import judge

    differing = results.differing
    beyond = _beyond_the_case_dtype(case, golden, baseline)
    if beyond and _right_wherever_defined(case, golden, baseline, beyond,
                                          [results.first, *(o for _, o in differing)]):
        counts = "; ".join(f"{name}: {int(where.sum())} of {where.numel()} values"
                           for name, where in beyond.items())
        return Decision(Label.HARNESS_ERROR, (
            f"the case overflows the arithmetic flex_attention computes it in: a careful "
            f"{case.dtype} kernel (the baseline, its mods evaluated as flex_attention "
            f"evaluates them) gets NaN or inf where the float64 reference is finite "
            f"({counts}), and the backend's answer passes everywhere else; no backend can be "
            "judged there; fix the variant (a score mod that float32 holds, such as "
            "torch.nn.functional.softplus for log(1 + exp(x))), not the backend"))
    judged = []  # (call number, verdict, result): the first call, then each that differs
    for number, observed in [(1, results.first), *differing]:
        try:
            judged.append((number, judge(case, golden, baseline, observed), observed))
        except Exception as exc:  # noqa: BLE001
            return Decision(Label.HARNESS_ERROR, f"the verdict failed: {one_line(exc)}",
                            observed=observed)
    failing = [(n, verdict, observed) for n, verdict, observed in judged if not verdict.passed]
    number, verdict, observed = failing[0] if failing else judged[0]
    metrics = verdict.metrics
    if differing:  # said only where a later call's result was not the first call's
        metrics = {**(metrics or {}), "differing_calls": [n for n, _ in differing],
                   "failing_calls": _failing_calls(judged, results.calls)}
        masked = _masked_answer_calls(judged, results.calls)
        if masked:
            metrics["masked_answer_calls"] = masked
    if not failing:
        return Decision(Label.PASS, "", metrics, observed)
    calls = _calls_text(metrics["failing_calls"], results.calls) if differing else ""
    return Decision(Label.MISMATCH, calls + verdict.summary, metrics, observed)


def _undefined_answer(golden) -> str:
    """Where the float64 golden is NaN ("out: 496 of 1024 values; dq: ..."), "" where it is
    not. Inputs are finite and a fully masked row is 0 (lse -inf), so only the mods make it.
    Gradients count only where no other right answer exists (a row a mod hides by overflow
    has one: reference/overflow_rows.py)."""
    import torch

    parts = {"out": golden.out, "lse": golden.lse}
    other = golden.masked_overflow
    for name, grad in (golden.grads or {}).items():
        if other is None or other.grads is None or torch.isnan(other.grads[name]).any():
            parts[name] = grad
    found = [f"{name}: {int(torch.isnan(t).sum())} of {t.numel()} values"
             for name, t in parts.items() if t is not None and bool(torch.isnan(t).any())]
    return "; ".join(found)


def _beyond_the_case_dtype(case: Case, golden, baseline) -> dict:
    """{name: bool mask} of the values (out, lse, dq, dk, dv: what the case checks) where the
    baseline is NaN or inf and the golden finite; empty where there are none. Rows a mod hides
    by overflow are the verdict's, which takes their other right answer (reference/
    overflow_rows.py): in out and lse they are left out (their float32 lse is -inf), in a
    gradient a value counts only where the baseline's other answer is not finite either."""
    import torch

    from reference.overflow_rows import rows_hidden_by_overflow

    hidden = rows_hidden_by_overflow(golden.lse, case.dtype)
    checked = [("out", golden.out, baseline.out, None)]
    if case.mode == "fwd+lse":
        checked.append(("lse", golden.lse, baseline.lse, None))
    other = baseline.masked_overflow
    for name, grad in (baseline.grads or {}).items():
        other_grad = None if other is None or other.grads is None else other.grads[name]
        checked.append((name, (golden.grads or {}).get(name), grad, other_grad))
    found = {}
    for name, want, got, other_got in checked:
        if want is None or got is None or want.shape != got.shape:
            continue
        beyond = torch.isfinite(want) & ~torch.isfinite(got.to(want.device))
        if other_got is not None:
            beyond &= ~torch.isfinite(other_got.to(want.device))
        if hidden is not None and name in ("out", "lse"):
            rows = hidden.to(want.device)
            beyond &= ~(rows.unsqueeze(-1) if name == "out" else rows)
        if bool(beyond.any()):
            found[name] = beyond
    return found


def _right_wherever_defined(case: Case, golden, baseline, beyond: dict, calls: list) -> bool:
    """Whether every call's answer passes the verdict with the values in ``beyond`` (where
    the case overflows its own arithmetic) taken as the golden's, in it and in the baseline:
    a backend wrong anywhere else is judged as any other (MISMATCH)."""
    from dataclasses import replace

    from reference.verdict import judge

    def defined(ref):
        changed = {}
        for name, where in beyond.items():
            whole = name in ("out", "lse")
            have = getattr(ref, name, None) if whole else (ref.grads or {}).get(name)
            want = getattr(golden, name) if whole else golden.grads[name]
            if have is None or have.shape != where.shape:
                continue
            have = have.where(~where.to(have.device), want.to(have.device, have.dtype))
            changed[name] = have
        grads = {name: changed.pop(name) for name in list(changed) if name not in ("out", "lse")}
        if grads:
            changed["grads"] = {**ref.grads, **grads}
        return replace(ref, **changed)

    try:
        base = defined(baseline)
        return all(judge(case, golden, base, defined(observed)).passed for observed in calls)
    except Exception:  # noqa: BLE001 - judged as any other case below, which says what failed
        return False


#: Backend labels that the case's own mods, failing in the reference too, explain: the same
#: error met by both. A crash, an out-of-memory or a timeout of the backend keeps its label
#: (the reference may have failed for its own reasons then, e.g. out of memory itself).
_ERRORS_A_MOD_EXPLAINS = (Label.COMPILE_ERROR, Label.RUNTIME_ERROR)


def disk_full(error: str) -> Decision:
    """A case that met a full disk was not judged: HARNESS_ERROR (fix the installation), its
    record marked so that ``--resume`` runs it again once there is room (records/events.py).
    The backend's COMPILE_ERROR or RUNTIME_ERROR was the disk's (an outside audit: a full warm
    compile cache failed every case as COMPILE_ERROR, a full TMPDIR as HARNESS_ERROR, and a
    resume kept them). Known in the child (records.errors.is_disk_full: the errno of an
    OSError in the error's chain, or a compiler subprocess's own words), never by a message's
    text (a mod's or a log's words could say it); so a backend that fills the disk itself is
    not judged either, and each resume tries it again."""
    return Decision(Label.HARNESS_ERROR, (
        f"not judged: a disk was full ({first_line(error, 300)}); make room, then --resume "
        "the run's report directory runs this case again"), metrics={NOT_JUDGED_KEY: "disk full"})


def _score_mod_raises(case: Case):
    """What the case's score mod raises from its own code somewhere on the grid, masked
    points included (cases.pointwise.score_mod_raises); None when it does not, has none, or
    its mods cannot be built (the backend's error stands then)."""
    from cases.pointwise import score_mod_raises
    from cases.score_dtype import traced_score_dtype
    from cases.variants import build_mods

    try:
        mods = build_mods(case.variant, case.shape)
    except Exception:  # noqa: BLE001 - reported by the child, which built them too
        return None
    if mods.score_mod is None:
        return None
    return score_mod_raises(mods.score_mod, case.shape, traced_score_dtype(case))


def _failing_calls(judged: list, calls: int) -> list[int]:
    """The numbers of every failing call: a call not judged on its own (its result is the
    first call's, bit for bit) fails where the first call does."""
    verdicts = {n: verdict.passed for n, verdict, _ in judged}
    return [n for n in range(1, calls + 1) if not verdicts.get(n, verdicts[1])]


def _masked_answer_calls(judged: list, calls: int) -> list[int]:
    """The numbers of every call whose result took the fully masked answer on rows a score mod
    hides by overflow (the report notes such passes), counted like ``_failing_calls``."""
    took = {n: took_masked_answer(verdict.metrics or {}) for n, verdict, _ in judged}
    return [n for n in range(1, calls + 1) if took.get(n, took[1])]


def _calls_text(failing: list[int], calls: int) -> str:
    """What a MISMATCH's message says first where the calls' results differ."""
    passing = [n for n in range(1, calls + 1) if n not in failing]
    return (f"call {', '.join(map(str, failing))} of {calls} failed, "
            f"{', '.join(map(str, passing)) or 'none'} passed (the results differ from call to "
            "call): ")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
