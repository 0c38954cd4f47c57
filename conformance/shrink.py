"""Shrinking a failing case: the smallest batch, heads, lengths and head dim that keep its label.

Each dimension is searched by bisection between its smallest value and the current one (the
current value is known to keep the label, so the result always does): batch; key/value heads
with the GQA group kept; the GQA group; the sequence length (query and key together when they
are equal, else each on its own) with the variant's length-like parameters scaled in
proportion; the head dim in multiples of 8. Passes repeat until nothing shrinks. Every try is
one case through ``execute`` (the supervised Executor), one at a time.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from cases import composed
from cases.model import Case, Shape, Variant
from records.files import write_text_atomic
from records.results import Label, Record

#: Length-like parameters of the catalog's variants (scaled with the sequence length). A case
#: module may declare its own as ``LENGTH_PARAMS = {"variant name": ("key", ...)}``.
LENGTH_PARAMS: dict[str, tuple[str, ...]] = {
    "sliding_window": ("w",), "prefix_lm": ("p",), "padded_causal": ("v",)}
MAX_PASSES = 3
HEAD_DIM_STEP = 8


@dataclass
class ShrinkResult:
    original: Record
    smallest: Record
    tried: list[Record] = field(default_factory=list)  # every execution, in order (original first)
    passes: int = 0
    out_of_budget: bool = False


class _Budget(Exception):
    pass


def shrink(case: Case, execute: Callable[[Case], Record], max_cases: int = 60) -> ShrinkResult:
    """The smallest case found that ``execute`` gives the same label as ``case``.

    ValueError when ``case`` itself passes or is unsupported (nothing to shrink), or is a
    HARNESS_ERROR (the case or the suite is at fault, not the backend: every smaller case
    would keep that label for the same reason).
    """
    from records.errors import is_not_judged

    original = execute(case)
    if is_not_judged(original):
        raise ValueError(f"{case.id} was not judged: a disk was full; make room, then shrink "
                         "it again")
    if original.label in (Label.PASS, Label.UNSUPPORTED):
        raise ValueError(f"{case.id} is {original.label.value} on this backend; shrink takes a "
                         "failing case")
    if original.label is Label.HARNESS_ERROR:
        from records.text import first_line

        raise ValueError(f"{case.id} is HARNESS_ERROR ({first_line(original.message, 300)}); "
                         "fix the case (or its --cases-module) before shrinking")
    result = ShrinkResult(original, original, [original])
    seen = {case.id: original}

    def keeps(candidate: Case) -> bool:
        if candidate.id not in seen:
            if len(result.tried) >= max_cases:
                raise _Budget
            record = execute(candidate)
            if is_not_judged(record):  # neither keeps the label nor loses it: stop, and say so
                raise ValueError(f"{candidate.id} was not judged while shrinking {case.id}: a "
                                 "disk was full; make room, then shrink it again")
            seen[candidate.id] = record
            result.tried.append(record)
        return seen[candidate.id].label is original.label

    current = case
    try:
        while result.passes < MAX_PASSES:
            result.passes += 1
            before = current
            for candidates in (_batches, _kv_heads, _groups, _lengths, _kv_lengths, _q_lengths,
                               _head_dims):
                current = _bisect(current, candidates(current), keeps)
            if current == before:
                break
    except _Budget:  # the smallest of the cases that kept the label so far
        result.out_of_budget = True
        kept = [Case.from_json(r.case) for r in result.tried if r.label is original.label]
        current = min(kept, key=_size)
    result.smallest = seen[current.id]
    return result


def _size(case: Case) -> tuple[int, str]:
    s = case.shape
    return s.B * s.Hq * s.Sq * s.Skv * s.D, case.id


def _bisect(current: Case, candidates: list[Case], keeps: Callable[[Case], bool]) -> Case:
    """The first of ``candidates`` (ascending, all smaller than ``current``) that keeps the
    label, assuming that larger ones keep it too; ``current`` when none does."""
    lo, hi = 0, len(candidates)
    while lo < hi:
        mid = (lo + hi) // 2
        if keeps(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return candidates[hi] if hi < len(candidates) else current


# -- the dimensions: smaller cases, ascending -----------------------------------------------
def _with_shape(case: Case, variant: Variant | None = None, **changes) -> Case | None:
    try:
        shape = replace(case.shape, **changes)
    except ValueError:
        return None
    return replace(case, variant=variant or case.variant, shape=shape)


def _valid(cases) -> list[Case]:
    return [c for c in cases if c is not None]


def _batches(case: Case) -> list[Case]:
    s = case.shape
    return _valid(_with_shape(case, B=b, Bkv=1 if s.Bkv == 1 else b) for b in range(1, s.B))


def _kv_heads(case: Case) -> list[Case]:
    s = case.shape
    group = s.Hq // s.Hkv
    return _valid(_with_shape(case, Hq=h * group, Hkv=h) for h in range(1, s.Hkv))


def _groups(case: Case) -> list[Case]:
    s = case.shape
    return _valid(_with_shape(case, Hq=s.Hkv * g) for g in range(1, s.Hq // s.Hkv))


def _lengths(case: Case) -> list[Case]:
    s = case.shape
    if s.Sq != s.Skv:
        return []
    return _valid(_with_shape(case, scale_lengths(case.variant, n / s.Skv), Sq=n, Skv=n)
                  for n in range(1, s.Sq))


def _kv_lengths(case: Case) -> list[Case]:
    s = case.shape
    if s.Sq == s.Skv:
        return []
    return _valid(_with_shape(case, scale_lengths(case.variant, n / s.Skv), Skv=n)
                  for n in range(1, s.Skv))


def _q_lengths(case: Case) -> list[Case]:
    s = case.shape
    if s.Sq == s.Skv:
        return []
    return _valid(_with_shape(case, Sq=n) for n in range(1, s.Sq))


def _head_dims(case: Case) -> list[Case]:
    d = case.shape.D
    return _valid(_with_shape(case, D=n) for n in range(HEAD_DIM_STEP, d, HEAD_DIM_STEP))


def scale_lengths(variant: Variant, ratio: float) -> Variant:
    """``variant`` with its length-like parameters multiplied by ``ratio`` (at least 1)."""
    if variant.name == composed.NAME:
        return composed.scale_lengths(variant, ratio)
    keys = LENGTH_PARAMS.get(variant.name) or _declared_length_params(variant.name)
    if not keys:
        return variant
    return Variant(variant.name, tuple(
        (k, max(1, int(round(v * ratio))) if k in keys else v) for k, v in variant.params))


def _declared_length_params(variant_name: str) -> tuple[str, ...]:
    from cases.custom import defining_module

    try:
        module = sys.modules.get(defining_module(variant_name))
    except ValueError:
        return ()
    return tuple(getattr(module, "LENGTH_PARAMS", {}).get(variant_name, ()))


# -- finding the case, and writing what was found ---------------------------------------------
def case_from_argument(text: str, case_modules: list[str] | None = None) -> Case:
    """A case from a case id (the catalog's, a composed variant's or a case module's) or from a
    case spec file (its first case). ValueError, one line, when it is none of these."""
    from cases.catalog import PROFILES, find_case, matrix
    from cases.catalog_params import param_problem
    from cases.custom import import_case_modules, load_case_modules
    from cases.names import entry_point_case_modules
    from cases.variants import registered_variants
    from conformance.case_file import load_case_file

    modules = list(dict.fromkeys(list(case_modules or []) + entry_point_case_modules()))
    if text.endswith(".json") or Path(text).is_file():
        import_case_modules(modules)  # a spec may name a custom variant
        cases = load_case_file(text, registered_variants(), what="case spec file")
        if len(cases) != 1:
            raise ValueError(f"{text} holds {len(cases)} cases; shrink takes one: give a spec "
                             "file of one case, or the case's id")
        return cases[0]
    text = text.removeprefix("fuzz/")  # a fuzzed case's record id: its case id after it
    pool = [c for p in PROFILES for c in matrix(p, "all")]
    for profile in PROFILES:
        pool += load_case_modules(modules, profile) if modules else []
    try:
        return find_case(text, pool)
    except KeyError:
        pass
    parts = text.split("/")
    if len(parts) in (4, 5):
        # any shape of a known variant (a shrunk case's id, a --case-file run's): the id says it
        variant = (composed.variant_from_token(parts[0]) if parts[0].startswith(composed.NAME)
                   else _variant_of_token(parts[0], {c.variant for c in pool}))
        if variant is not None:
            problem = param_problem(variant)  # as a spec file of the case is refused
            if problem is not None:
                raise ValueError(f"case {text!r}: variant {variant.name!r}: {problem}")
            scale = int(parts[4][1:]) if len(parts) == 5 and parts[4][1:].isdigit() else 1
            return Case(variant, Shape.parse(parts[1]), parts[2], parts[3], scale)
    if len(parts) not in (4, 5):  # the variant may be right (an outside audit: it was blamed)
        raise ValueError(f"no case with id {text!r}: an id has 4 or 5 parts, VARIANT/SHAPE/"
                         f"DTYPE/MODE[/xSCALE] (e.g. causal/b1-h8x8-s1024x1024-d128/bf16/fwd), "
                         f"this one {len(parts)}; copy it from the report or flexconf list, "
                         "or pass a case spec file (SPEC.json)")
    raise ValueError(f"no case with id {text!r}: its variant part {parts[0]!r} is none of the "
                     "matrices', the composed variants' or the case modules'; pass a case spec "
                     "file (SPEC.json, e.g. from the run's results.json) or --cases-module")


def _variant_of_token(token: str, known: set[Variant]) -> Variant | None:
    """The variant whose id token is ``token``: a known one, or one of a known variant's name
    and parameter names with other values (a shrunk ``sliding_window-w16``), each value of
    the type the known one has; None when no known variant reads so."""
    name, *values = token.split("-")
    for like in sorted(known, key=lambda v: v.token):
        if like.name != name or len(like.params) != len(values):
            continue
        params = []
        for (key, value), text in zip(like.params, values):
            if not text.startswith(key):
                break
            try:
                params.append((key, type(value)(text[len(key):])))
            except ValueError:
                break
        else:
            candidate = Variant(name, tuple(params))
            if candidate.token == token:  # it reads back as given: nothing was guessed
                return candidate
    return None


def spec_seed(text: str) -> int | None:
    """The seed a saved fuzz failure (a spec file with a ``fuzz`` block) was found with; None
    for a case id or a plain spec."""
    import json

    if not (text.endswith(".json") or Path(text).is_file()):
        return None
    try:
        data = json.loads(Path(text).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # case_from_argument says what is wrong with it
    seed = data.get("fuzz", {}).get("seed") if isinstance(data, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def write_outcome(result: ShrinkResult, out_dir: Path, environment: dict, options: dict) -> dict:
    """Write ``results.json`` (every try) and ``smallest.json`` (the smallest case's spec) into
    ``out_dir``; returns their paths."""
    from conformance.run_info import suite_version
    from records.results import RunResults, write_results

    out_dir.mkdir(parents=True, exist_ok=True)
    results_path, spec_path = out_dir / "results.json", out_dir / "smallest.json"
    write_results(RunResults(environment, options, tuple(result.tried), suite_version(),
                             complete=not result.out_of_budget), results_path)
    write_text_atomic(spec_path, json.dumps({"cases": [result.smallest.case]}, indent=1) + "\n")
    return {"results": results_path, "spec": spec_path}
