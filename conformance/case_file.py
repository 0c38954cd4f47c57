"""Case spec files (``--case-file``, docs/cases.md): one JSON spec, a list of specs, or
``{"cases": [...]}``, read into cases; a bad file is a ValueError of one line that names the
file, the case and the fix."""
from __future__ import annotations

from cases.model import Case
from records.files import UserFileError, read_json
from records.text import one_line


def load_case_file(path: str) -> list:
    """Cases of a JSON case file: one spec, a list of specs, or {"cases": [...]}."""
    try:
        data = read_json(path, "pass a JSON case spec file (docs/cases.md)")
    except UserFileError as exc:
        raise ValueError(f"--case-file {exc}") from None
    if isinstance(data, dict) and "cases" in data:
        data = data["cases"]
    specs = data if isinstance(data, list) else [data]
    cases = []
    for i, spec in enumerate(specs):
        try:
            cases.append(Case.from_json(spec))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"--case-file {path!r}: case {i} is not a valid case spec "
                             f"({_spec_problem(exc)}); write the fields of Case.to_json "
                             "(docs/cases.md)") from None
    if not cases:
        raise ValueError(f"--case-file {one_line(str(path))} lists no cases; give a file with "
                         "at least one case spec (Case.to_json, docs/cases.md)")
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"--case-file {path!r} lists case {duplicates[0]!r} twice; keep one")
    return cases


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
