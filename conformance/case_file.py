"""Case spec files (``--case-file``, docs/cases.md "Case spec files"): one JSON spec, a list
of specs, or ``{"cases": [...]}``, read into cases; a bad file is a ValueError of one line that
names the file, the case and the fix. Every field is checked, unknown ones too: a misspelt
``input_scale`` must not turn an x4 case into an x1 case that passes."""
from __future__ import annotations

import difflib
from collections.abc import Collection

from cases.catalog_params import param_problem
from cases.model import Case, id_part_problem, is_param_value
from records.files import UserFileError, read_json
from records.text import one_line

#: The fields of a case spec (Case.to_json), and of its shape.
SPEC_FIELDS = ("id", "variant", "params", "shape", "dtype", "mode", "input_scale")
SHAPE_FIELDS = ("B", "Bkv", "Hq", "Hkv", "Sq", "Skv", "D")
#: Beside "cases", what a saved fuzz failure carries (conformance/fuzz.py).
FILE_FIELDS = ("cases", "fuzz")


def load_case_file(path: str, known_variants: Collection[str] | None = None,
                   what: str = "--case-file") -> list:
    """Cases of a JSON case file: one spec, a list of specs, or {"cases": [...]}.
    ``known_variants``: the variants this process can build (after importing the case
    modules); a spec naming another is an error here, not a HARNESS_ERROR of the case.
    ``what``: how errors name the file (the option, or shrink's argument)."""
    try:
        data = read_json(path, "pass a JSON case spec file (docs/cases.md)")
    except UserFileError as exc:
        raise ValueError(f"{what} {exc}") from None
    if isinstance(data, dict) and "cases" in data:
        _refuse_unknown(data, FILE_FIELDS, f"{what} {path!r}: the file")
        data = data["cases"]
        if not isinstance(data, list):  # it was read as one spec: "case 0 is a JSON string"
            raise ValueError(f"{what} {path!r}: its 'cases' is a JSON {_json_type(data)}; "
                             "give a list of case specs (Case.to_json, docs/cases.md)")
    specs = data if isinstance(data, list) else [data]
    cases = []
    for i, spec in enumerate(specs):
        cases.append(case_from_spec(spec, f"{what} {path!r}: case {i}", known_variants))
    if not cases:
        raise ValueError(f"{what} {one_line(str(path))} lists no cases; give a file with "
                         "at least one case spec (Case.to_json, docs/cases.md)")
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{what} {path!r} lists case {duplicates[0]!r} twice; keep one")
    return cases


def case_from_spec(spec, where: str, known_variants: Collection[str] | None = None,
                   extra_fields: bool = False) -> Case:
    """The case of one spec (Case.to_json's fields), every field checked; ValueError, one
    line that begins with ``where``, naming the field and the fix. ``known_variants``: as in
    load_case_file. ``extra_fields``: fields beside Case.to_json's pass (a record's spec,
    which a later suite may extend), not only the spec's own."""
    _check_fields(spec, where, extra_fields)
    try:
        case = Case.from_json(spec)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where} is not a valid case spec ({_spec_problem(exc)}); write "
                         "the fields of Case.to_json (docs/cases.md)") from None
    if known_variants is not None and case.variant.name not in known_variants:
        raise ValueError(f"{where} names variant {case.variant.name!r}, which no builder "
                         f"registers{_suggestion(case.variant.name, known_variants)}; a "
                         "custom variant needs its --cases-module (docs/cases.md)")
    problem = param_problem(case.variant)  # the catalog's ranges need no builder
    if problem is not None:
        raise ValueError(f"{where}: variant {case.variant.name!r}: {problem}")
    if known_variants is not None:
        _check_params(case, where)
    return case


def _check_fields(spec, where: str, extra_fields: bool = False) -> None:
    """Unknown fields (unless ``extra_fields``), and fields of the wrong JSON type, as one
    line naming the field."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where} is a JSON {_json_type(spec)}; a case spec is an object with "
                         f"the fields {', '.join(SPEC_FIELDS)} (docs/cases.md)")
    if not extra_fields:
        _refuse_unknown(spec, SPEC_FIELDS, where)
    shape = spec.get("shape")
    if shape is not None and not isinstance(shape, dict):
        raise ValueError(f"{where}: 'shape' is a JSON {_json_type(shape)}; give an object with "
                         f"the fields {', '.join(SHAPE_FIELDS)}")
    if isinstance(shape, dict):
        _refuse_unknown(shape, SHAPE_FIELDS, f"{where}: shape")
    integers = [(f"shape.{key}", value) for key, value in (shape or {}).items()
                if not (key == "Bkv" and value is None)]  # Bkv null: the batch
    integers += [("input_scale", spec["input_scale"])] if "input_scale" in spec else []
    for name, value in integers:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: {name} is {one_line(_json_text(value))} (a JSON "
                             f"{_json_type(value)}); give a whole number, e.g. 64")
    for name in ("variant", "dtype", "mode", "id"):
        if name in spec and not isinstance(spec[name], str):
            raise ValueError(f"{where}: {name} is {one_line(_json_text(spec[name]))} (a JSON "
                             f"{_json_type(spec[name])}); give a string")
    if "params" in spec and not isinstance(spec["params"], dict):
        raise ValueError(f"{where}: 'params' is a JSON {_json_type(spec['params'])}; give an "
                         'object of the variant\'s parameters, e.g. {"w": 256}, or {}')
    for key, value in (spec.get("params") or {}).items():  # a parameter is a number
        problem = id_part_problem(key)
        if problem:
            raise ValueError(f"{where}: parameter name {one_line(repr(key))} {problem}")
        if not is_param_value(value):
            raise ValueError(f"{where}: params.{one_line(str(key))} is "
                             f"{one_line(_json_text(value))}; give a finite number, e.g. 256")


def _check_params(case: Case, where: str) -> None:
    """A parameter the variant's builder needs and the spec does not give, or one the spec
    gives that the builder did not read, spelt like an optional one it asked for and built
    without (a misspelt optional parameter: the builder silently took its default, and the
    name only changed the id). Other unread parameters pass: a builder may read one at some
    shapes only."""
    from cases.variants import param_use

    use = param_use(case.variant, case.shape)
    given = [key for key, _ in case.variant.params]
    name = case.variant.name
    if use.missing:
        raise ValueError(f"{where}: variant {name!r} needs the parameter {use.missing[0]!r}, "
                         f"which 'params' does not give{_given(given, use.missing[0])}; give "
                         f"the parameters it reads: {', '.join(use.read)}")
    for unread in use.unread or ():
        close = _closest(unread, use.defaulted)
        if close is not None:
            raise ValueError(f"{where}: variant {name!r} did not read the parameter "
                             f"{one_line(unread)!r}, and took its default for {close!r} (did "
                             f"you mean {close!r}?); fix its name or drop it")


def _given(given: list[str], needed: str) -> str:
    if not given:
        return ""
    close = _closest(needed, given)  # a given key that is the needed one misspelt
    return (f" (it gives {', '.join(one_line(k) for k in given)}"
            f"{f'; did you mean {needed!r} instead of {one_line(close)!r}?' if close else ''})")


def _refuse_unknown(data: dict, allowed: tuple[str, ...], where: str) -> None:
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ValueError(f"{where} has an unknown field {one_line(unknown[0])!r}"
                         f"{_suggestion(unknown[0], allowed)}; its fields are "
                         f"{', '.join(allowed)}")


def _suggestion(name: str, known: Collection[str]) -> str:
    close = _closest(name, known)
    return f" (did you mean {close!r}?)" if close else ""


def _closest(name: str, known: Collection[str]) -> str | None:
    """The name of ``known`` that ``name`` is most likely a misspelling of (case aside)."""
    lowered = {str(k).lower(): k for k in known}
    close = difflib.get_close_matches(str(name).lower(), list(lowered), n=1)
    return lowered[close[0]] if close else None


def _json_text(value) -> str:
    import json

    return json.dumps(value)[:80]


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _spec_problem(exc: Exception) -> str:
    """What ``Case.from_json`` found wrong, in words: a missing field is named with its place
    (``shape.Sq``), anything else is the error's own one-line text."""
    from dataclasses import fields

    from cases.model import Shape

    if isinstance(exc, KeyError) and exc.args:
        key = str(exc.args[0])
        place = f"shape.{key}" if key in {f.name for f in fields(Shape)} else key
        return f"the field {one_line(place)!r} is missing"
    return one_line(exc)
