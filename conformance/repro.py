"""``flexconf repro``: one standalone script that reproduces one case of a run.

The script needs only torch (and, for neuron, torch-neuronx). It embeds, verbatim, the source of
every suite module the reproduction runs (conformance/repro_runtime.py and what it imports,
followed transitively: inputs, variants, golden, verdict, the child's phases, the backend) and,
for a custom variant, its case module; at run time it serves them to ``import`` ahead of any
installed copy. So the script computes exactly what this suite computes. A backend given as
``package.module:object`` is imported from the environment the script runs in; it must be
importable where the script is written too (its suite imports are embedded), or nothing is
written.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import shlex
from pathlib import Path

from conformance.source_closure import SUITE_DIR, SUITE_PACKAGES, find_source, imported_names
from records.files import write_text_atomic
from records.results import Record, load_results

#: The modules the runtime needs whatever the backend; the backend's module is added.
ROOTS = ("conformance.repro_runtime", "conformance.child", "conformance.decision",
         "conformance.reference_cache", "conformance.backends.registry", "reference.verdict",
         "reference.outputs")


def write_repro(results_path: str | Path, case_id: str, output: str | Path,
                backend: str | None = None, case_modules: list[str] | None = None
                ) -> tuple[Path, str]:
    """Write the reproduction script of ``case_id`` of the run ``results_path`` to ``output``
    (its directory made when missing); returns its path and the backend it runs on.

    ``backend`` overrides the run's backend (compare on another one); ``case_modules`` names
    the case modules of custom variants (entry points and the run's own are found anyway).
    ValueError, one line, when the case is not in the run, its variant is unknown here, or the
    backend is unknown or its module cannot be imported here.
    """
    results = load_results(results_path)
    record = results.by_id().get(case_id)
    if record is None:
        raise ValueError(f"case {case_id!r} is not in {results_path}; `flexconf repro` takes "
                         "an id of that run (see its summary.md or report)")
    if not record.case:
        raise ValueError(f"the record of {case_id!r} in {results_path} has no case spec; "
                         "rerun the case with this suite")
    from conformance.case_file import case_from_spec

    case_from_spec(record.case, f"the record of {case_id!r} in {results_path}: its case",
                   extra_fields=True)
    options = results.options
    backend = backend or _run_backend(options)
    module = _variant_module(record.case["variant"], options, case_modules or [])
    recorded = options.get("backend_pythonpath") if backend == _run_backend(options) else None
    roots = list(ROOTS) + _backend_modules(backend, recorded) + ([module] if module else [])
    sources = embedded_sources(roots)
    if module and module not in sources:  # a case module outside the suite
        sources[module] = _module_source(module)
        sources.update(embedded_sources(_suite_imports(sources[module])))
    script = _script(record, backend, int(options.get("seed") or 0), _timed_runs(options),
                     [module] if module else [], results.environment, sources,
                     _run_backend(options))
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a link at ``path`` is replaced, never followed and overwritten (records/files.py)
    return write_text_atomic(path, script, mode=0o755), backend


def embedded_sources(roots: list[str]) -> dict[str, str]:
    """Module name -> source of ``roots`` and every suite module they import (transitively,
    function-level imports included), with the packages above them."""
    sources: dict[str, str] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in sources or name.partition(".")[0] not in SUITE_PACKAGES:
            continue
        sources[name] = _module_source(name)
        pending += _suite_imports(sources[name])
        parent = name.rpartition(".")[0]
        if parent:
            pending.append(parent)
    return dict(sorted(sources.items()))


def _suite_imports(source: str) -> list[str]:
    names = imported_names(source, "", lambda name: find_source(name, (SUITE_DIR,)) is not None)
    return [name for name in names if name.partition(".")[0] in SUITE_PACKAGES]


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _module_source(name: str) -> str:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"cannot find the source of module {name!r}; install it or put its "
                         "directory on PYTHONPATH")
    return Path(spec.origin).read_text()


def _run_backend(options: dict) -> str:
    """The backend as the run named it (conformance.run_info.rerun_backend_spec)."""
    from conformance.run_info import rerun_backend_spec

    return rerun_backend_spec(options, default="cpu-eager")


def _backend_modules(spec: str, recorded_root: str | None = None) -> list[str]:
    """The suite modules a backend needs: its built-in module, or for a plugin or a
    ``module:object`` the suite modules its module imports (that module is not embedded: the
    script imports it where it runs). ValueError, one line, for a backend the script could not
    load: an unknown name, or a module not importable here (its suite imports unknown; the
    message names ``recorded_root``, where the run imported it from, when known)."""
    from conformance.backends.registry import BUILTIN, registered

    if spec in BUILTIN:
        return [BUILTIN[spec].partition(":")[0]]
    names = registered()
    target = names.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown backend {spec!r}; name the backend the script runs on: "
                         f"{', '.join(names)} (or package.module:object)")
    module = target.partition(":")[0]
    if not _is_module(module):
        where = (f"PYTHONPATH={shlex.quote(recorded_root)}, where the run imported it from"
                 if recorded_root else "e.g. PYTHONPATH=. for tests.*")
        raise ValueError(f"backend {spec!r}: cannot import {module!r} here, so the script "
                         "would lack the suite modules it needs; put its directory on "
                         f"PYTHONPATH ({where}) and run flexconf repro again")
    return _suite_imports(_module_source(module))


def _variant_module(variant: str, options: dict, extra: list[str]) -> str | None:
    """The module registering ``variant``: None for the suite's own (embedded anyway), else
    the case module (from ``extra``, the run's options or the entry points)."""
    from cases.custom import defining_module, import_case_modules
    from cases.names import entry_point_case_modules
    from cases.variants import registered_variants

    # the modules given on this command line must import, as pytest, list and shrink ask,
    # even where the case's variant is the suite's own (a misspelt one was ignored silently)
    import_case_modules(list(extra))
    if variant not in registered_variants():
        run_modules = options.get("cases_modules") or options.get("cases_module") or []
        if isinstance(run_modules, str):
            run_modules = [run_modules]
        import_case_modules(list(run_modules) + entry_point_case_modules())
    try:
        module = defining_module(variant)
    except ValueError:
        raise ValueError(f"variant {variant!r} is not defined by this suite or its installed case "
                         "modules; pass its module with --cases-module") from None
    return None if module.partition(".")[0] in SUITE_PACKAGES else module


def _timed_runs(options: dict) -> int:
    """The run's ``--timed-runs`` (every call is judged, so the script makes as many); 3, the
    default, for a file that does not say."""
    runs = options.get("timed_runs")
    return runs if isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 else 3


def _script(record: Record, backend: str, seed: int, runs: int, case_modules: list[str],
            environment: dict, sources: dict[str, str], run_backend: str) -> str:
    from conformance.run_info import git_revision, suite_version

    first = (record.message or "").splitlines()[0] if record.message else ""
    # the label the run recorded is its backend's: said so where this script runs another
    label = (record.label.value if backend == run_backend
             else f"{record.label.value} on {run_backend}, the run's backend")
    recorded = f"{label}: {first}" if first else label
    run_suite = f"{environment.get('suite_version', '?')} (git {environment.get('git_revision')})"
    here = f"{suite_version()} (git {git_revision()})"
    # what a results file says goes into the docstring only through _docstring_safe, and into
    # code only as repr() literals: a value of the file never becomes code of the script
    facts = [
        f"case       {record.case_id}",
        f"backend    {backend}",
        f"seed       {seed}",
        f"recorded   {recorded[:300]}",
        f"run on     {environment.get('host', '?')}, torch {environment.get('torch', '?')}, "
        f"suite {run_suite}",
        f"embedded   suite {here}",
    ]
    lines = [
        *SCRIPT_HEAD.splitlines(),
        "",
        "    python repro.py     # needs torch; prints the phases, the error metrics and the label",
        "    python repro.py --save-outputs out.pt   # also saves inputs, output, golden, baseline",
        "    python repro.py --compare KEPT.pt       # and compares with the run's kept output",
        "",
        *map(_docstring_safe, facts),
        "",
        "It rebuilds the inputs from the case id and the seed, builds the variant's mods, runs the",
        "case on the backend as the suite's child does (first call = compile, then timed runs),",
        "computes the float64 golden and the dtype baseline, and judges with the suite's verdict.",
        "The suite modules it uses are embedded verbatim at the end (SOURCES). Exit status: 0 when",
        'the label is PASS, 1 otherwise."""',
        "import importlib.abc",
        "import importlib.machinery",
        "import importlib.util",
        "import json",
        "import sys",
        "",
        f"CASE = json.loads({json.dumps(record.case, indent=1)!r})",
        f"BACKEND = {backend!r}",
        f"SEED = {seed}",
        f"RUNS = {runs}  # timed runs after the first (compile) call, as in the run",
        f"CASE_MODULES = {case_modules!r}",
        f"RECORDED = {recorded[:300]!r}",
        "",
        _BOOTSTRAP,
        "SOURCES = {",
    ]
    for name, source in sources.items():
        lines.append(f"    {name!r}: {_literal(source)},")
    lines += ["}", "", "if __name__ == '__main__':", "    sys.exit(main())", ""]
    return "\n".join(lines)


#: How every script begins: ``flexconf repro -o`` replaces a file only when it begins so.
SCRIPT_HEAD = ("#!/usr/bin/env python3\n"
               '"""Reproduction of one FlexAttention conformance case '
               "(written by `flexconf repro`).")


def _docstring_safe(text: str) -> str:
    """``text`` as one line that cannot end a docstring: no quote, backslash or line break."""
    from records.text import one_line

    return one_line(text).replace("\\", "/").replace('"', "'")


def _literal(source: str) -> str:
    """A readable triple-quoted literal of ``source`` (checked to evaluate back to it)."""
    literal = "'''" + source.replace("\\", "\\\\").replace("'", "\\'") + "'''"
    if ast.literal_eval(literal) != source:
        literal = repr(source)
    return literal


_BOOTSTRAP = '''
class EmbeddedSuite(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the embedded suite modules to `import`, ahead of any installed copy."""

    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES:
            return None
        is_package = any(other.startswith(name + ".") for other in SOURCES)
        return importlib.util.spec_from_loader(name, self, is_package=is_package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if any(other.startswith(module.__name__ + ".") for other in SOURCES):
            module.__path__ = []
        module.__file__ = f"<embedded {module.__name__}>"
        exec(compile(SOURCES[module.__name__], module.__file__, "exec"), module.__dict__)


def main():
    import argparse

    parser = argparse.ArgumentParser(description="Reproduce one FlexAttention conformance case.")
    parser.add_argument("--save-outputs", metavar="FILE", help="save the inputs, the output, "
                        "the golden and the baseline (reference.load_case_outputs reads it)")
    parser.add_argument("--compare", metavar="KEPT", help="a file the run kept for this case "
                        "(REPORT_DIR/outputs/...pt): print how this output differs from it")
    args = parser.parse_args()
    sys.meta_path.insert(0, EmbeddedSuite())
    from conformance.repro_runtime import reproduce

    return reproduce(CASE, BACKEND, SEED, RUNS, tuple(CASE_MODULES), RECORDED,
                     args.save_outputs, args.compare)

'''
