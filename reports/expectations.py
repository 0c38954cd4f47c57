"""Known failures per backend, from a TOML file (docs/gate.md shows the format).

    [[failure]]
    backend = "neuron"
    case = "*/b4-h8x8-s8192x8192-d128/bf16/fwd"     # a case id, or a glob (fnmatch: * ? [])
    label = "COMPILE_TIMEOUT"
    reason = "neuronx-cc needs more than 600 s at B4 S8192"
    link = "https://example.com/bugs/1234"

A lookup prefers an entry naming the exact case id over a glob; among globs the first one in
the file wins. A bad entry is an error naming the file, the line and the fix. No torch here:
the gate and the pytest plugin (xfail) both call ``expected_label``.
"""
from __future__ import annotations

import fnmatch
import re

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path

from cases.model import Shape
from records.results import Label, Record, RunResults

ENTRY_TABLE = "failure"
_HEADER_RE = re.compile(r"^\s*\[\[\s*" + ENTRY_TABLE + r"\s*\]\]\s*(#.*)?$")
_REQUIRED = ("backend", "case", "label", "reason")
_ALLOWED = _REQUIRED + ("link",)
_TOP_LEVEL = ("version", ENTRY_TABLE)
_GLOB_CHARS = "*?["


class ExpectationsError(ValueError):
    """An expectations file that cannot be used; the message names file, line and fix."""


#: How the reason of an entry that ``flexconf expectations update`` added begins, until a
#: person replaces it: the gate notes such entries as accepted but never looked at.
TRIAGE_REASON = "to triage:"


@dataclass(frozen=True)
class Expectation:
    backend: str  # a backend name or a glob ("*" for every backend)
    case: str  # a case id or a glob
    label: Label
    reason: str
    link: str = ""
    line: int = 0  # line of the entry's [[failure]] header, 0 when unknown

    @property
    def is_glob(self) -> bool:
        return any(ch in self.case for ch in _GLOB_CHARS)

    def applies_to(self, backend: str) -> bool:
        return fnmatch.fnmatchcase(backend, self.backend)

    def matches(self, backend: str, case_id: str) -> bool:
        return self.applies_to(backend) and fnmatch.fnmatchcase(case_id, self.case)


@dataclass(frozen=True)
class Expectations:
    entries: tuple[Expectation, ...]
    source: str = "expectations"

    def lookup(self, backend: str, case_id: str) -> Expectation | None:
        """The entry that covers ``case_id`` on ``backend``: exact id first, then globs."""
        glob_match = None
        for entry in self.entries:
            if entry.matches(backend, case_id):
                if not entry.is_glob:
                    return entry
                glob_match = glob_match or entry
        return glob_match


def expected_label(expectations: Expectations | None, backend: str,
                   case_id: str) -> tuple[Label, str] | None:
    """(expected label, reason) when ``case_id`` is a known failure on ``backend``, else None."""
    if expectations is None:
        return None
    entry = expectations.lookup(backend, case_id)
    return (entry.label, entry.reason) if entry else None


def known_failure_reason(expectations: Expectations | None, backend: str, case_id: str,
                         label: Label | str) -> str | None:
    """The reason of the entry that lists exactly this failure (``label``) of ``case_id`` on
    ``backend``, else None: a pass, or a failure with another label, is not excused. The pytest
    plugin makes such a case xfail, and its record says so (``Record.expected_failure``)."""
    expected = expected_label(expectations, backend, case_id)
    if expected is None or expected[0] is not Label(label):
        return None
    return expected[1]


def load_expectations(path: str | Path) -> Expectations:
    from records.files import UserFileError, read_text
    from records.text import one_line

    path = Path(path)
    if not path.exists():
        raise ExpectationsError(
            f"{one_line(str(path))}: no such expectations file; create it with "
            f"`flexconf expectations update RESULTS.json --expectations {one_line(str(path))}`")
    try:
        text = read_text(path, "pass a TOML expectations file (docs/gate.md)")
    except UserFileError as exc:
        raise ExpectationsError(str(exc)) from None
    return parse_expectations(text, str(path))


def header_lines(text: str) -> list[int]:
    """1-based line numbers of the ``[[failure]]`` headers, in order."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if _HEADER_RE.match(line)]


def parse_expectations(text: str, source: str = "expectations") -> Expectations:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # arrays in arrays, thousands deep: no expectations file
        raise ExpectationsError(f"{source}: nested too deeply for an expectations file; "
                                f"entries are flat [[{ENTRY_TABLE}]] tables") from None
    unknown = [key for key in data if key not in _TOP_LEVEL]
    if unknown:
        raise ExpectationsError(
            f"{source}: unknown top-level key {unknown[0]!r}; entries are [[{ENTRY_TABLE}]] tables")
    if data.get("version", 1) != 1:
        raise ExpectationsError(f"{source}: version {data['version']!r} is not supported; use 1")
    raw = data.get(ENTRY_TABLE, [])
    if not isinstance(raw, list):
        raise ExpectationsError(f"{source}: '{ENTRY_TABLE}' must be [[{ENTRY_TABLE}]] tables")
    lines = header_lines(text)
    lines = lines if len(lines) == len(raw) else [0] * len(raw)
    entries = [_entry(item, f"{source}:{line}" if line else f"{source}: entry {i + 1}", line)
               for i, (item, line) in enumerate(zip(raw, lines))]
    seen: dict[tuple[str, str], Expectation] = {}
    for entry in entries:
        key = (entry.backend, entry.case)
        if key in seen:
            where = f"{source}:{entry.line}" if entry.line else source
            raise ExpectationsError(
                f"{where}: backend {entry.backend!r} case {entry.case!r} is listed twice "
                f"(first at line {seen[key].line}); keep one entry")
        seen[key] = entry
    return Expectations(tuple(entries), source)


def _entry(item: object, where: str, line: int) -> Expectation:
    if not isinstance(item, dict):
        raise ExpectationsError(f"{where}: an entry must be a table with {', '.join(_REQUIRED)}")
    for key in item:
        if key not in _ALLOWED:
            raise ExpectationsError(
                f"{where}: unknown key {key!r}; allowed keys: {', '.join(_ALLOWED)}")
    for key in _REQUIRED:
        if key in item and not isinstance(item[key], str):  # backend = 5, label = ["MISMATCH"]
            raise ExpectationsError(f"{where}: '{key}' is a TOML {_toml_type(item[key])}; give "
                                    "it as a string")
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise ExpectationsError(f"{where}: '{key}' is missing or empty; give it as a string")
    if not isinstance(item.get("link", ""), str):
        raise ExpectationsError(f"{where}: 'link' must be a string (a URL or an issue id)")
    try:
        label = Label(item["label"])
    except ValueError:
        choices = ", ".join(lb.value for lb in Label if lb is not Label.PASS)
        raise ExpectationsError(
            f"{where}: unknown label {item['label']!r}; use one of {choices}") from None
    if label is Label.PASS:
        raise ExpectationsError(f"{where}: label PASS is not a failure; remove the entry")
    if ":" in item["backend"]:  # what --backend was given, never a backend's name
        raise ExpectationsError(
            f"{where}: backend {item['backend'].strip()!r} is a --backend module:object spec; "
            "an entry names the backend itself, as results.json records it in options.backend "
            "(the backend's name attribute; flexconf backends lists the registered ones)")
    case = item["case"].strip()
    if not any(ch in case for ch in _GLOB_CHARS):
        check_case_id(case, where)
    return Expectation(item["backend"].strip(), case, label, item["reason"].strip(),
                       item.get("link", "").strip(), line)


def _toml_type(value: object) -> str:
    return {bool: "boolean", int: "integer", float: "float", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def misspelt_backends(expectations: Expectations, backend: str) -> list[Expectation]:
    """Entries whose backend is not ``backend`` (the run's) but spelt almost like it
    (``cpu-eagr`` for ``cpu-eager``): they apply to no case of the run, so the failures they
    list are unknown to it, and nothing said why (an outside audit). Entries for other
    backends are a file's normal content: a name registered here (cuda-eager beside
    cpu-eager, which differ by two letters) is never taken for a misspelling."""
    import difflib

    from conformance.backends.registry import registered  # names only: no backend imported

    known = registered()
    return [entry for entry in expectations.entries if not entry.applies_to(backend)
            and entry.backend not in known
            and difflib.get_close_matches(entry.backend, [backend], n=1, cutoff=0.8)]


def decided_cases(expectations: Expectations, entry: Expectation,
                  results: RunResults) -> list[Record]:
    """The run's cases that ``entry`` decides (the one ``lookup`` gives for them)."""
    backend = results.options.get("backend", "")
    return [r for r in results.records if entry.matches(backend, r.case_id)
            and expectations.lookup(backend, r.case_id) is entry]


def stale_expectations(expectations: Expectations, results: RunResults) -> list[Expectation]:
    """Entries for the run's backend that decide cases of the run, none of which shows the
    expected label (the failure was fixed, or the case now fails differently). The one rule
    the gate flags (STALE) and ``flexconf expectations update`` drops by."""
    backend = results.options.get("backend", "")
    stale = []
    for entry in expectations.entries:
        if not entry.applies_to(backend):
            continue
        decided = decided_cases(expectations, entry, results)
        if decided and not any(r.label is entry.label for r in decided):
            stale.append(entry)
    return stale


def shadowed_expectations(expectations: Expectations, results: RunResults
                          ) -> list[tuple[Expectation, Expectation]]:
    """(entry, an entry that decides one of its cases: a glob where one does) for each entry for
    the run's backend that matches cases of the run but decides none of them: an exact entry
    or an earlier glob comes first (``lookup``), so its label and reason never apply here."""
    backend = results.options.get("backend", "")
    shadowed = []
    for entry in expectations.entries:
        if not entry.applies_to(backend):
            continue
        matched = [r for r in results.records if entry.matches(backend, r.case_id)]
        if matched and not decided_cases(expectations, entry, results):
            winners = [expectations.lookup(backend, r.case_id) for r in matched]
            shadowed.append((entry, next((w for w in winners if w.is_glob), winners[0])))
    return shadowed


def check_case_id(case: str, where: str) -> None:
    parts = case.split("/")
    problem = "" if len(parts) >= 4 else "it lacks the parts variant/shape/dtype/mode"
    if not problem:
        try:
            Shape.parse(parts[1])
        except ValueError as exc:
            problem = str(exc)
    if problem:
        raise ExpectationsError(
            f"{where}: case {case!r} is neither a case id nor a glob ({problem}); "
            f"`flexconf list` prints the ids")
