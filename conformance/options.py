"""The suite's pytest options: registration, and parsing into one frozen RunOptions.

Values arrive as strings and are checked here, so a bad one is a usage error of one line that
names the value and the fix (``--compile-timeout 'ten': write seconds, e.g. 600``).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
    / "flexattention-conformance"
DEFAULT_REFERENCE_CACHE_BYTES = 4 << 30
PHASES = ("all", "compile")
DEVICE_CHECKS = ("bypass", "strict")

_OPTIONS: tuple[tuple[str, str, str], ...] = (
    # (option, default, help)
    ("--backend", "auto", "backend to run: a registered name (flexconf backends), "
     "package.module:object, or auto (the best available; default)"),
    ("--profile", "full", "matrix profile: full (default; the gating sizes) or smoke "
     "(lengths / 8, for CI and quick checks)"),
    ("--matrix", "core", "which cases: core (default; the 96 gating cases), extended (dtypes, "
     "GQA, head dims, odd lengths, cross attention, lse, backward, ...), all, or custom (only "
     "the cases of --cases-module and installed case modules)"),
    ("--case-file", None, "run the cases of a JSON file (one case spec or a list, as written "
     "by Case.to_json) instead of the profile's matrix"),
    ("--compile-timeout", "600", "seconds allowed for the compile phase of a case "
     "(first call); default 600"),
    ("--run-timeout", "300", "seconds allowed for setup and for the timed runs of a case; default 300"),
    ("--compile-cache", None, "cold (default): every case compiles from empty caches, no "
     "cache of any layer can serve it; warm (the default of --phase compile): one compiler "
     "cache directory under the suite's cache dir, shared by cases and runs"),
    ("--phase", "all", "all (default): compile, time and judge every case; compile: only "
     "compile every selected case into the warm cache (no timed runs, no verdict; label "
     "COMPILED), for a following --compile-cache warm run"),
    ("--report-dir", "reports/latest", "where results.json, the report and the per-worker "
     "records go; default reports/latest"),
    ("--seed", "0", "seed of the inputs (with the case id); default 0"),
    ("--memory-budget", None, "run cases concurrently only while their estimated peak memory "
     "fits this: bytes with a unit (16G, 512M) or a share of RAM (80%%); default 80%%"),
    ("--reference-cache", None, "directory caching golden outputs (default "
     f"{DEFAULT_CACHE_ROOT}/reference); 'none' disables"),
    ("--reference-cache-size", "4G", "bound of the reference cache; default 4G"),
    ("--reference-device", "cpu", "where the float64 golden is computed: cpu (default) or cuda"),
    ("--shard", None, "run part I of N of the matrix (1-based, balanced by estimated cost), e.g. 2/4"),
    ("--fuzz-examples", "0", "run N fuzzed variants through conformance/test_fuzz.py "
     "(hypothesis, repeatable with --seed; records under fuzz/ in results.json; -v prints "
     "each); default 0: fuzzing skipped"),
    ("--neuron-cores-per-worker", "1", "NeuronCores each worker's child may use (neuron "
     "backend); default 1"),
    ("--neuron-device-check", "bypass", "bypass (default): where flex_attention rejects "
     "device 'neuron', lift that one check for 'neuron' as the Neuron SDK's examples do "
     "(recorded in the environment); strict: keep upstream's check (every case UNSUPPORTED)"),
    ("--keep-outputs", "failed", "save each case's inputs, output, golden and baseline to "
     "<report-dir>/outputs/ (reference.load_case_outputs reads them): none, failed (default) or all"),
    ("--keep-outputs-cap", "256M", "the most bytes one case's kept outputs may take; a larger "
     "case is not saved and its record says so; default 256M"),
    ("--expectations", None, "known failures (TOML, docs/gate.md): a case failing with exactly "
     "its expected label is xfail, any other failure still fails"),
)


@dataclass(frozen=True)
class RunOptions:
    backend: str
    profile: str
    case_file: str | None
    compile_timeout: float
    run_timeout: float
    compile_cache: str
    report_dir: Path
    seed: int
    memory_budget: int
    reference_cache: Path | None
    reference_cache_size: int
    reference_device: str
    shard: tuple[int, int] | None  # (index 0-based, count)
    expectations: str | None = None
    matrix: str = "core"
    cases_modules: tuple[str, ...] = ()  # --cases-module, then installed entry points
    fuzz_examples: int = 0
    neuron_cores_per_worker: int = 1
    phase: str = "all"  # all | compile (compile-only pass)
    neuron_device_check: str = "bypass"  # bypass | strict
    keep_artifacts: bool = False  # file every case's compile artefacts, not only failed ones
    keep_outputs: str = "failed"
    keep_outputs_cap: int = 256 << 20

    def to_record(self) -> dict[str, Any]:
        """The options as written into results.json."""
        data = asdict(self)
        data["report_dir"] = str(self.report_dir)
        data["reference_cache"] = str(self.reference_cache) if self.reference_cache else None
        data["shard"] = f"{self.shard[0] + 1}/{self.shard[1]}" if self.shard else None
        data["cases_modules"] = list(self.cases_modules)
        return data


def register(parser) -> None:
    group = parser.getgroup("flexattention-conformance", "FlexAttention conformance matrix")
    for name, default, help_text in _OPTIONS:
        group.addoption(name, default=default, help=help_text)
    group.addoption("--cases-module", action="append", default=[], metavar="MODULE",
                    help="import MODULE (repeatable) and add its cases (docs/cases.md); "
                         "modules of the entry point group flexattention_conformance.cases "
                         "are added too")
    group.addoption("--keep-artifacts", action="store_true", default=False,
                    help="keep every case's compile artefacts under REPORT_DIR/artifacts "
                         "(default: only failed and timed-out cases')")


def parse(get, base_dir: Path) -> RunOptions:
    """Options from ``get(name)`` (pytest's config.getoption); raises ValueError, one line."""
    from cases.catalog import MATRICES, PROFILES
    from cases.custom import entry_point_case_modules
    from conformance.kept_outputs import check_keep

    profile = get("--profile")
    if profile not in PROFILES:
        raise ValueError(f"--profile {profile!r} is unknown; use one of: {', '.join(PROFILES)}")
    matrix = get("--matrix")
    if matrix not in MATRICES:
        raise ValueError(f"--matrix {matrix!r} is unknown; use one of: {', '.join(MATRICES)}")
    phase = get("--phase")
    if phase not in PHASES:
        raise ValueError(f"--phase {phase!r} is unknown; use one of: {', '.join(PHASES)}")
    compile_cache = get("--compile-cache")
    if compile_cache is None:
        compile_cache = "warm" if phase == "compile" else "cold"
    if compile_cache not in ("cold", "warm"):
        raise ValueError(f"--compile-cache {compile_cache!r} is unknown; use cold or warm")
    if phase == "compile" and compile_cache == "cold":
        raise ValueError("--phase compile fills the warm cache, but --compile-cache is cold; "
                         "drop --compile-cache cold (or give warm)")
    device_check = get("--neuron-device-check")
    if device_check not in DEVICE_CHECKS:
        raise ValueError(f"--neuron-device-check {device_check!r} is unknown; use one of: "
                         f"{', '.join(DEVICE_CHECKS)}")
    device = get("--reference-device")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--reference-device {device!r} is unknown; use cpu or cuda")
    cache = get("--reference-cache")
    if cache is None:
        reference_cache = DEFAULT_CACHE_ROOT / "reference"
    else:
        reference_cache = None if cache.lower() == "none" else base_dir / cache
    budget = get("--memory-budget")
    case_file = get("--case-file")
    return RunOptions(
        backend=get("--backend"),
        profile=profile,
        case_file=str(base_dir / case_file) if case_file else None,
        compile_timeout=parse_seconds("--compile-timeout", get("--compile-timeout")),
        run_timeout=parse_seconds("--run-timeout", get("--run-timeout")),
        compile_cache=compile_cache,
        report_dir=base_dir / get("--report-dir"),
        seed=parse_seed(get("--seed")),
        memory_budget=parse_size("--memory-budget", budget) if budget else _default_budget(),
        reference_cache=reference_cache,
        reference_cache_size=parse_size("--reference-cache-size", get("--reference-cache-size")),
        reference_device=device,
        shard=parse_shard(get("--shard")),
        expectations=str(base_dir / get("--expectations")) if get("--expectations") else None,
        matrix=matrix,
        cases_modules=tuple(dict.fromkeys(
            list(get("--cases-module") or []) + entry_point_case_modules())),
        fuzz_examples=parse_count("--fuzz-examples", get("--fuzz-examples"), minimum=0),
        neuron_cores_per_worker=parse_count("--neuron-cores-per-worker",
                                            get("--neuron-cores-per-worker"), minimum=1),
        phase=phase,
        neuron_device_check=device_check,
        keep_artifacts=bool(get("--keep-artifacts")),
        keep_outputs=check_keep(get("--keep-outputs")),
        keep_outputs_cap=parse_size("--keep-outputs-cap", get("--keep-outputs-cap")),
    )


def parse_count(option: str, text: str, minimum: int) -> int:
    if not re.fullmatch(r"\d+", str(text).strip()) or int(text) < minimum:
        raise ValueError(f"{option} {text!r} is not an integer >= {minimum}; "
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
    """Bytes from ``16G``, ``16GiB``, ``512M``, ``1000000`` or ``75%`` (of the machine's RAM)."""
    from conformance.memory_gate import machine_memory_bytes

    t = str(text).strip().lower()
    percent = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", t)
    if percent and 0 < float(percent.group(1)) <= 100:
        return int(machine_memory_bytes() * float(percent.group(1)) / 100)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", t)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{option} {text!r} is not a size; write bytes with a unit "
                         f"(e.g. {option} 16G) or a share of RAM (e.g. {option} 75%)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r} is not I/N with 1 <= I <= N; write e.g. --shard 2/4")
    return int(m.group(1)) - 1, int(m.group(2))


def _default_budget() -> int:
    from conformance.memory_gate import default_budget_bytes

    return default_budget_bytes()


def load_case_file(path: str) -> list:
    """Cases of a JSON case file: one spec, a list of specs, or {"cases": [...]}."""
    from cases.model import Case

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--case-file {path!r} does not exist; pass a JSON case spec file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--case-file {path!r} is not JSON ({exc}); pass a JSON case spec file") from None
    if isinstance(data, dict) and "cases" in data:
        data = data["cases"]
    specs = data if isinstance(data, list) else [data]
    cases = []
    for i, spec in enumerate(specs):
        try:
            cases.append(Case.from_json(spec))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"--case-file {path!r}: case {i} is not a valid case spec ({exc}); "
                             "see Case.to_json for the fields") from None
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"--case-file {path!r} lists case {duplicates[0]!r} twice; keep one")
    return cases
