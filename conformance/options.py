"""The suite's options, declared once (``OPTIONS``), and their parsing into one RunOptions.

Each ``Option`` carries its flag, default, help, parser and where its value goes; the pytest
plugin registers them all, ``flexconf shrink`` and the executor's defaults reuse them, and no
default is written anywhere else. Values arrive as strings and are checked here, so a bad one
is a usage error of one line that names the value and the fix
(``--compile-timeout 'ten' is not a positive number of seconds; write e.g. --compile-timeout 600``).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from conformance import cache_dirs
from records.selection import MAX_SHARDS

DEFAULT_REPORT_DIR = "reports/latest"
PHASES = ("all", "compile")
DEVICE_CHECKS = ("bypass", "strict")

@dataclass(frozen=True)
class Option:
    """One option, declared once: the plugin registers it, ``parse`` reads it, other commands
    (``flexconf shrink``) reuse it, and its default lives only here."""

    flag: str
    default: Any  # as a user would write it on the command line; None: derived (default_text)
    help: str
    parse: Callable[[Any, Path], Any]  # (raw value, invocation dir) -> value; ValueError, one line
    to: str  # where the value goes: selection, controller, worker, child, report
    action: str = "store"  # store | store_true | append
    field: str = ""  # the RunOptions attribute (default: the flag's name)
    default_text: str = ""  # what a derived default is, for the help

    @property
    def name(self) -> str:
        return self.field or self.flag[2:].replace("-", "_")

    @property
    def metavar(self) -> str:
        return self.flag[2:].upper().replace("-", "_")

    @property
    def help_text(self) -> str:
        shown = self.default_text or (None if self.default in (None, False, []) else self.default)
        text = self.help + (f"; default {shown}" if shown is not None else "")
        return text.replace("%", "%%")  # argparse formats help with %


def _choice(flag: str, choices: tuple[str, ...]) -> Callable[[Any, Path], str]:
    def parse(text, _base):
        if text is None:  # an option whose default is derived (--compile-cache)
            return None
        if text not in choices:
            raise ValueError(f"{flag} {text!r} is unknown; use one of: {', '.join(choices)}")
        return text
    return parse


def _given(flag: str, text, what: str) -> None:
    """ValueError, one line, for ``flag`` given an empty value (records.files'
    empty_value_problem): a path would read it as the current directory, a default-taking
    option as not given."""
    from records.files import empty_value_problem

    problem = empty_value_problem(flag, text, what)
    if problem:
        raise ValueError(problem)


def _path_or_none(flag: str, what: str) -> Callable[[Any, Path], str | None]:
    def parse(text, base: Path) -> str | None:
        _given(flag, text, what)
        return os.path.normpath(base / text) if text is not None else None
    return parse


def _report_dir(text, base: Path) -> Path:
    _given("--report-dir", text, "a directory")
    return base / (DEFAULT_REPORT_DIR if text is None else text)


def _keep(text, _base) -> str:
    from conformance.kept_outputs import check_keep

    return check_keep(text)


def _profile(text, base):
    from cases.names import PROFILES

    return _choice("--profile", tuple(PROFILES))(text, base)


def _matrix(text, base):
    from cases.names import MATRICES

    return _choice("--matrix", tuple(MATRICES))(text, base)


def _reference_cache(text, base: Path) -> Path | None:
    _given("--reference-cache", text, "a directory, or none to cache no golden output")
    if text is None:
        return cache_dirs.DEFAULT_CACHE_ROOT / "reference"
    return None if text.lower() == "none" else base / text


def _case_ids(values, _base) -> tuple[str, ...]:
    ids = tuple(dict.fromkeys(v.strip() for v in values or ()))
    if any(not i for i in ids):
        raise ValueError("--case-id '': give the exact id of a case (flexconf list prints them)")
    return ids


def _cases_modules(values, _base) -> tuple[str, ...]:
    from cases.names import entry_point_case_modules

    return tuple(dict.fromkeys(list(values or []) + entry_point_case_modules()))


def _schedule_from(text, base: Path) -> str:
    from conformance.schedule import AUTO, ESTIMATE, OFF

    _given("--schedule-from", text, f"a run's results.json, or {AUTO}, {ESTIMATE} or {OFF}")
    return text if text in (AUTO, ESTIMATE, OFF) else str(base / text)


def _count(flag: str, minimum: int, maximum: int | None = None
           ) -> Callable[[Any, Path], int]:
    return lambda text, _base: parse_count(flag, text, minimum, maximum)


def _seconds(flag: str) -> Callable[[Any, Path], float]:
    return lambda text, _base: parse_seconds(flag, text)


def _size(flag: str) -> Callable[[Any, Path], int]:
    return lambda text, _base: parse_size(flag, text)


#: argparse takes a value that starts with '-' for an option; the size options say so.
_DASH_VALUES = ("; a value that starts with '-' needs the = form ({flag}=-1G), as the option "
                "parser takes -1G for an option")


def _memory_budget(text, _base) -> int:
    return parse_size("--memory-budget", text) if text else _default_budget()


OPTIONS: tuple[Option, ...] = (
    Option("--backend", "auto", "backend to run: a registered name (flexconf backends), "
           "package.module:object, or auto (the best available)", lambda t, _b: t, "controller"),
    Option("--profile", "full", "matrix profile: full (the gating sizes) or smoke (lengths / 8, "
           "for CI and quick checks)", _profile, "selection"),
    Option("--matrix", "core", "which cases: core (the 96 gating cases), extended (dtypes, "
           "GQA, head dims, odd lengths, cross attention, lse, backward, ...), all, or custom "
           "(only the cases of --cases-module and installed case modules)", _matrix, "selection"),
    Option("--cases-module", [], "import MODULE (repeatable) and add its cases (docs/cases.md); "
           "modules of the entry point group flexattention_conformance.cases are added too",
           _cases_modules, "selection", action="append", field="cases_modules"),
    Option("--case-file", None, "run the cases of a JSON file (one case spec or a list, as "
           "written by Case.to_json) instead of the profile's matrix",
           _path_or_none("--case-file", "a case file (JSON)"), "selection"),
    Option("--case-id", [], "run exactly the case with this id (repeatable; matched whole, "
           "unlike -k); an id the selection lacks is a usage error", _case_ids, "selection",
           action="append", field="case_ids"),
    Option("--shard", None, "run part I of N of the matrix (1-based, balanced by estimated "
           f"cost), e.g. 2/4; N may exceed the number of cases (parts left empty), up to "
           f"{MAX_SHARDS}", lambda t, _b: parse_shard(t), "selection"),
    Option("--compile-timeout", "600", "seconds allowed for the compile phase of a case "
           "(first call)", _seconds("--compile-timeout"), "worker"),
    Option("--run-timeout", "300", "seconds allowed for setup and for the timed runs of a case",
           _seconds("--run-timeout"), "worker"),
    Option("--timed-runs", "3", "timed calls after the first; the record's run time is their "
           "median (at most 1000: more would only run into --run-timeout)",
           _count("--timed-runs", 1, maximum=1000), "worker"),
    Option("--compile-cache", None, "cold: every case compiles from empty caches, no cache of "
           "its graph or kernels can serve it (torch's precompiled C++ headers, alike for every "
           "case, stay: docs/execution.md); warm: one compiler cache directory under the "
           "suite's cache dir, shared by cases and runs",
           _choice("--compile-cache", ("cold", "warm")),
           "worker", default_text="cold, or warm with --phase compile"),
    Option("--phase", "all", "all: compile, time and judge every case; compile: only compile "
           "every selected case into the warm cache (no timed runs, no verdict; label "
           "COMPILED), for a following --compile-cache warm run", _choice("--phase", PHASES),
           "worker"),
    Option("--report-dir", None, "where results.json, the report and the per-worker records "
           "go", _report_dir, "report",
           default_text=DEFAULT_REPORT_DIR),
    Option("--resume", None, "finish the interrupted run of this report directory: run only "
           "its selected cases that have no record (or one a full disk kept from being judged), "
           "then write the whole run there (the same "
           "options as the interrupted run; cases a -k or -m selects beyond it are named, "
           "not run); it names the report directory: a different --report-dir is a usage "
           "error", _path_or_none("--resume", "the report directory of the interrupted run"),
           "report"),
    Option("--schedule-from", "auto", "the order cases go to xdist workers: longest first by "
           "the measured seconds of RESULTS.json; auto: of the last run in the report "
           "directory when it is of the same matrix, profile and backend, else by the "
           "estimate; "
           "estimate: by the estimate; off: collection order (xdist's own)",
           _schedule_from, "controller"),
    Option("--seed", "0", "seed of the inputs (with the case id)", lambda t, _b: parse_seed(t),
           "worker"),
    Option("--memory-budget", None, "run cases concurrently only while their estimated peak "
           "memory fits this: bytes with a unit (16G, 512M) or a share of RAM (80%)"
           + _DASH_VALUES.format(flag="--memory-budget"),
           _memory_budget, "worker", default_text="80%"),
    Option("--reference-cache", None, "directory caching golden outputs; 'none' disables",
           _reference_cache, "worker",
           default_text="~/.cache/flexattention-conformance/reference ($XDG_CACHE_HOME if set)"),
    Option("--reference-cache-size", "4G", "bound of the reference cache: bytes with a unit "
           "(4G, 512M) or a share of RAM (10%)"
           + _DASH_VALUES.format(flag="--reference-cache-size"),
           _size("--reference-cache-size"), "worker"),
    Option("--reference-device", "cpu", "where the float64 golden is computed: cpu or cuda",
           _choice("--reference-device", ("cpu", "cuda")), "worker"),
    Option("--fuzz-examples", "0", "run N fuzzed variants through conformance/test_fuzz.py "
           "(hypothesis, repeatable with --seed; records under fuzz/ in results.json; -v prints "
           "each); 0: fuzzing skipped", _count("--fuzz-examples", 0), "selection"),
    Option("--neuron-cores-per-worker", "1", "NeuronCores each worker's child may use (neuron "
           "backend)", _count("--neuron-cores-per-worker", 1), "child"),
    Option("--neuron-device-check", "bypass", "bypass: where flex_attention rejects device "
           "'neuron', lift that one check for 'neuron' as the Neuron SDK's examples do "
           "(recorded in the environment); strict: keep upstream's check (every case "
           "UNSUPPORTED)", _choice("--neuron-device-check", DEVICE_CHECKS), "child"),
    Option("--keep-artifacts", False, "keep every case's compile artefacts under "
           "REPORT_DIR/artifacts (without it: only failed and timed-out cases')",
           lambda v, _b: bool(v), "worker", action="store_true"),
    Option("--keep-outputs", "failed", "save each case's inputs, output, golden and baseline "
           "to <report-dir>/outputs/ (reference.load_case_outputs reads them): none, failed or "
           "all", _keep, "worker"),
    Option("--keep-outputs-cap", "256M", "the most bytes one case's kept outputs may take; a "
           "larger case is not saved and its record says so"
           + _DASH_VALUES.format(flag="--keep-outputs-cap"), _size("--keep-outputs-cap"),
           "worker"),
    Option("--expectations", None, "known failures (TOML, docs/gate.md): a case failing with "
           "exactly its expected label is xfail, any other failure still fails",
           _path_or_none("--expectations", "an expectations file (TOML)"), "controller"),
)
_BY_FLAG = {option.flag: option for option in OPTIONS}


@dataclass(frozen=True)
class RunOptions:
    """The parsed options; every field is an ``Option``'s (defaults live in ``OPTIONS``)."""

    backend: str
    profile: str
    matrix: str
    cases_modules: tuple[str, ...]  # --cases-module, then installed entry points
    case_file: str | None
    case_ids: tuple[str, ...]  # --case-id: exact ids
    shard: tuple[int, int] | None  # (index 0-based, count)
    compile_timeout: float
    run_timeout: float
    timed_runs: int
    compile_cache: str  # cold | warm
    phase: str  # all | compile (compile-only pass)
    report_dir: Path
    resume: str | None
    schedule_from: str  # auto | estimate | off | a results file
    seed: int
    memory_budget: int
    reference_cache: Path | None
    reference_cache_size: int
    reference_device: str
    fuzz_examples: int
    neuron_cores_per_worker: int
    neuron_device_check: str  # bypass | strict
    keep_artifacts: bool  # file every case's compile artefacts, not only failed ones
    keep_outputs: str
    keep_outputs_cap: int
    expectations: str | None

    def to_record(self) -> dict[str, Any]:
        """The options as written into results.json."""
        data = asdict(self)
        data["report_dir"] = str(self.report_dir)
        data["reference_cache"] = str(self.reference_cache) if self.reference_cache else None
        data["shard"] = f"{self.shard[0] + 1}/{self.shard[1]}" if self.shard else None
        data["cases_modules"] = list(self.cases_modules)
        data["case_ids"] = list(self.case_ids)
        return data


def register(parser) -> None:
    group = parser.getgroup("flexattention-conformance", "FlexAttention conformance matrix")
    for option in OPTIONS:
        add_option(group.addoption, option)


def add_option(add: Callable[..., Any], option: Option) -> None:
    """Declare ``option`` through ``add`` (pytest's addoption, argparse's add_argument)."""
    extra = {} if option.action == "store_true" else {"metavar": option.metavar}
    default = list(option.default) if isinstance(option.default, list) else option.default
    add(option.flag, action=option.action, default=default, help=option.help_text, **extra)


def options_markdown() -> str:
    """The options as a Markdown table (docs/execution.md holds this text; a test keeps it so):
    ``python -c "from conformance.options import options_markdown; print(options_markdown())"``."""
    rows = ["| Option | Default | Meaning |", "| --- | --- | --- |"]
    for option in OPTIONS:
        shown = option.default_text or ("" if option.default in (None, False, []) else option.default)
        value = "" if option.action == "store_true" else f" {option.metavar}"
        repeat = " (repeatable)" if option.action == "append" else ""
        text = option.help.replace("|", "\\|")
        rows.append(f"| `{option.flag}{value}`{repeat} | {f'`{shown}`' if shown else ''} | {text} |")
    return "\n".join(rows)


def add_arguments(parser, flags: tuple[str, ...]) -> None:
    """The named options on an argparse parser, declared as the plugin declares them."""
    for flag in flags:
        add_option(parser.add_argument, _BY_FLAG[flag])


def option_value(flag: str, raw: Any = None, base_dir: Path = Path(".")) -> Any:
    """One option parsed from ``raw`` (its default when None)."""
    option = _BY_FLAG[flag]
    return option.parse(option.default if raw is None else raw, base_dir)


def default_value(flag: str) -> Any:
    """An option's default, parsed (for code that runs without the plugin)."""
    return option_value(flag)


def parse(get, base_dir: Path) -> RunOptions:
    """Options from ``get(flag)`` (pytest's config.getoption); raises ValueError, one line."""
    values = {option.name: option.parse(get(option.flag), base_dir) for option in OPTIONS}
    if values["compile_cache"] is None:
        values["compile_cache"] = "warm" if values["phase"] == "compile" else "cold"
    if values["phase"] == "compile" and values["compile_cache"] == "cold":
        raise ValueError("--phase compile fills the warm cache, but --compile-cache is cold; "
                         "drop --compile-cache cold (or give warm)")
    _check_resume(values, get("--report-dir") is not None)
    _check_custom_matrix(values)
    _check_case_file_matrix(values)
    if values["resume"]:
        values["report_dir"] = Path(values["resume"])
    return RunOptions(**values)


def _check_resume(values: dict, report_dir_given: bool) -> None:
    """--resume names the report directory: another --report-dir would be ignored."""
    from records.text import one_line

    resume, report_dir = values["resume"], values["report_dir"]
    if resume and report_dir_given and Path(resume).resolve() != Path(report_dir).resolve():
        raise ValueError(f"--resume {one_line(resume)} and --report-dir {one_line(report_dir)} "
                         "differ: --resume names the report directory; drop --report-dir")


def _check_custom_matrix(values: dict) -> None:
    """--matrix custom without a case module: a usage error, with --case-file too (which
    replaces the matrix, so the option would be ignored)."""
    from cases.names import check_custom_matrix

    check_custom_matrix(values["matrix"], values["cases_modules"])


def _check_case_file_matrix(values: dict) -> None:
    """--case-file runs the file's cases alone: --matrix extended or all would be ignored,
    yet recorded, and a gate or merge against a run of the same file without it refused the
    two for a difference that changed nothing (an outside audit). (--matrix custom still
    says what fuzzing draws from.)"""
    from records.selection import matrix_selects

    if values["matrix"] != "core" and not matrix_selects(values["matrix"],
                                                        values["case_file"]):
        raise ValueError(f"--matrix {values['matrix']} does not apply with --case-file, which "
                         "runs the file's cases alone; drop --matrix")


def parse_count(option: str, text: str, minimum: int, maximum: int | None = None) -> int:
    if not re.fullmatch(r"\d+", str(text).strip()) or int(text) < minimum:
        raise ValueError(f"{option} {text!r} is not an integer >= {minimum}; "
                         f"write e.g. {option} {max(minimum, 1)}")
    if maximum is not None and int(text) > maximum:
        raise ValueError(f"{option} {text!r} is above {maximum}, the most this option takes; "
                         f"write e.g. {option} {max(minimum, 1)}")
    return int(text)


def parse_seconds(option: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{option} {text!r} is not a positive number of seconds; "
                         f"write e.g. {option} 600")
    return value


def parse_seed(text: str) -> int:
    if not re.fullmatch(r"\d+", str(text)):
        raise ValueError(f"--seed {text!r} is not a non-negative integer; write e.g. --seed 0")
    return int(text)


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(option: str, text: str) -> int:
    """Bytes from ``16G``, ``16GiB``, ``512M``, ``1000000B`` or ``75%`` (of the machine's
    RAM). A number without a unit is refused: ``--memory-budget 16`` was taken as 16 bytes,
    which ran every case alone, and said nothing (an outside audit); so is a size below one
    byte (``0.5B``)."""
    from conformance.memory_gate import machine_memory_bytes

    t = str(text).strip().lower()
    percent = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", t)
    if percent and 0 < float(percent.group(1)) <= 100:
        return int(machine_memory_bytes() * float(percent.group(1)) / 100)
    if percent:  # a share, out of range (an outside audit: "not a size" named the wrong fault)
        raise ValueError(f"{option} {text!r} is a share of RAM outside (0, 100]; give one in "
                         f"that range (e.g. {option} 75%) or a size (e.g. {option} 16G)")
    if re.fullmatch(r"\d+(?:\.\d+)?", t) and float(t) > 0:
        in_bytes = f", or {t}B for bytes" if t.isdigit() else ""
        raise ValueError(f"{option} {text!r} has no unit; write e.g. {option} {t}G or "
                         f"{t}M{in_bytes}")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)", t)
    size = int(float(m.group(1)) * _UNITS[m.group(2) or ""]) if m else 0
    if size < 1:
        raise ValueError(f"{option} {text!r} is not a size; write bytes with a unit "
                         f"(e.g. {option} 16G) or a share of RAM (e.g. {option} 75%)")
    return size


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """(I - 1, N) of ``--shard I/N``. N may exceed the number of cases (the parts beyond are
    empty, and merge), up to MAX_SHARDS, the most parts flexconf merge joins; above it is a
    usage error of one line, not parts no merge would take."""
    if text is None:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r} is not I/N with 1 <= I <= N; write e.g. --shard 2/4")
    if int(m.group(2)) > MAX_SHARDS:
        raise ValueError(f"--shard {text!r}: N is above {MAX_SHARDS}, the most parts flexconf "
                         "merge joins; give N as the number of machines, e.g. --shard 2/4")
    return int(m.group(1)) - 1, int(m.group(2))


def _default_budget() -> int:
    from conformance.memory_gate import default_budget_bytes

    return default_budget_bytes()
