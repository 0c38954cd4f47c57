"""Variants from outside the suite: case modules named by ``--cases-module`` or installed under
the entry point group ``flexattention_conformance.cases`` (docs/cases.md).

A case module is an importable Python module that

- registers the builder of each of its variants with ``@cases.variants.builder("name")``
  (importing the module is what registers them, in every process that runs its cases), and
- exposes ``cases(profile: str) -> list[Case]``: its cases for the profile (full or smoke).

``load_case_modules`` imports the modules and collects their cases (the parent process);
``import_case_modules`` only imports them (the child process, before building any mods).
"""
from __future__ import annotations

import importlib
import re
import sys
from types import ModuleType

from cases.catalog import PROFILES, check_profile, matrix
from cases.model import Case, Variant, id_part_problem, is_param_value
from cases.names import check_custom_matrix, entry_point_origin
from cases import variants
from records.text import one_line

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: variant name -> the case module whose import registered it (this process).
_REGISTERED_BY: dict[str, str] = {}


def import_case_modules(names: list[str]) -> list[ModuleType]:
    """Import each case module once (registering its variants); ValueError, one line, for a
    name that is not an importable module. Importing again is a no-op."""
    modules = []
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ValueError(f"case module {name!r} is not a Python module name; write a dotted "
                             "name like my_variants (for a file my_variants.py, put its "
                             "directory on PYTHONPATH)")
        if name in sys.modules:
            modules.append(sys.modules[name])
            continue
        before = set(variants.registered_variants())
        try:
            module = _import_module(name)
        except ValueError as exc:
            origin = entry_point_origin(name)
            if origin is None:
                raise
            # an installed package's: every run loads it, so say which package to fix (an
            # outside audit: the line named neither, and stopped every run)
            raise ValueError(f"{exc} (the module of {origin}, which every run loads; fix or "
                             "uninstall that package)") from None
        for variant in set(variants.registered_variants()) - before:
            _REGISTERED_BY[variant] = name
        modules.append(module)
    return modules


def _import_module(name: str) -> ModuleType:
    """import_case_modules' import of one name: ValueError, one line, when it fails."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            if name.endswith(".py"):
                raise ValueError(f"case module {name!r} cannot be found: name the module, "
                                 f"not its file: --cases-module {name[:-3]}, with its "
                                 "directory on PYTHONPATH") from None
            raise ValueError(f"case module {name!r} cannot be found; install it or put "
                             "its directory on PYTHONPATH") from None
        raise ValueError(f"case module {name!r} failed to import: {exc}; install what "
                         "it needs") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: say which
        raise ValueError(f"case module {name!r} failed to import: "
                         f"{type(exc).__name__}: {exc}; fix the module") from None


def load_case_modules(names: list[str], profile: str = "full") -> list[Case]:
    """The cases of every case module in ``names`` for ``profile``, in module order.

    ValueError (one line, naming the module and the fix) when a module cannot be imported,
    has no ``cases(profile)``, returns something else than cases, uses a variant without a
    registered builder, or when two cases share an id.
    """
    check_profile(profile)
    collected: list[Case] = []
    for name, module in zip(names, import_case_modules(names)):
        make = getattr(module, "cases", None)
        if not callable(make):
            raise ValueError(f"case module {name!r} has no function cases(profile) -> "
                             "list[Case]; define one (docs/cases.md)")
        for case in _module_cases(name, make, profile):
            if not isinstance(case, Case):
                raise ValueError(f"case module {name!r}: cases({profile!r}) returned a "
                                 f"{type(case).__name__}; return cases.model.Case objects")
            if case.variant.name not in variants.registered_variants():
                raise ValueError(
                    f"case module {name!r}: case {case.id!r} uses variant "
                    f"{case.variant.name!r}, which has no builder; decorate its builder with "
                    f"@cases.variants.builder({case.variant.name!r})")
            problem = _param_problem(case.variant)
            if problem:
                raise ValueError(f"case module {name!r}: case {case.id!r}: {problem}")
            collected.append(case)
    seen: set[str] = set()
    for case in collected:
        if case.id in seen:
            raise ValueError(f"case {case.id!r} is defined twice by the case modules "
                             f"{', '.join(names)}; give each case a distinct variant or shape")
        seen.add(case.id)
    _refuse_catalog_ids(collected, names)
    return collected


def _param_problem(variant: Variant) -> str | None:
    """What makes a variant's parameters unfit for a record (None when nothing does): each is
    a (name, value) pair with a name and a finite int or float value, as a case file reads
    them back (conformance/case_file.py). A string, a bool or NaN ran, and the record's spec
    was then refused by `flexconf repro`, `shrink` and `--case-file` (an outside audit)."""
    if not isinstance(variant.params, tuple):
        return (f"params is a {type(variant.params).__name__}; give a tuple of (name, value) "
                "pairs, e.g. (('w', 256),)")
    for pair in variant.params:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and pair[0]):
            return f"parameter {pair!r} is not a (name, value) pair; give e.g. ('w', 256)"
        key, value = pair
        problem = id_part_problem(key)
        if problem:
            return f"parameter name {key!r} {problem}"
        if not is_param_value(value):
            return (f"parameter {key!r} is {value!r}; give a finite int or float (a record's "
                    "spec must be read back by flexconf repro, shrink and --case-file)")
    return None


def _module_cases(name: str, make, profile: str) -> list:
    """What the case module ``name``'s ``cases`` (``make``) returns for ``profile``, as a list;
    ValueError, one line, where it raises or returns something other than a list or tuple."""
    try:
        made = make(profile)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's function: say which
        raise ValueError(f"case module {name!r}: cases({profile!r}) raised "
                         f"{type(exc).__name__}: {one_line(str(exc))}; fix the module "
                         "(docs/cases.md)") from None
    if not isinstance(made, (list, tuple)):
        raise ValueError(f"case module {name!r}: cases({profile!r}) returned "
                         f"{_a(type(made).__name__)}, not a list; return a list of "
                         "cases.model.Case (docs/cases.md)")
    return list(made)


def _a(noun: str) -> str:
    if noun == "NoneType":
        return "None"
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _refuse_catalog_ids(collected: list[Case], names: list[str]) -> None:
    """An id means one case forever: a custom case may not reuse a catalog case's id (a
    record of it would be read as the catalog's case by the report, the gate and repro)."""
    if not collected:
        return
    catalog = {case.id: f"the catalog's {'core' if 'core' in case.tags else 'extended'} matrix "
                        f"({profile} profile)"
               for profile in PROFILES for case in matrix(profile, "all")}
    for case in collected:
        if case.id in catalog:
            owner = _REGISTERED_BY.get(case.variant.name) or " or ".join(names)
            raise ValueError(f"case {case.id!r} of case module {owner!r} has the id of a case "
                             f"of {catalog[case.id]}; give the custom case another variant "
                             "name, parameters or shape")


def select_cases(profile: str, matrix_name: str, modules: list[str],
                 fuzzing: bool = False) -> list[Case]:
    """The cases of one run: the catalog's matrix ``matrix_name`` (none for ``custom``)
    followed by the cases of the case modules. ``custom`` without a case module is a
    ValueError: it would run nothing; so are case modules that give no case, unless the run
    is ``fuzzing`` (a module may exist to give fuzz_variants alone)."""
    check_custom_matrix(matrix_name, modules)
    selected = matrix(profile, matrix_name) + load_case_modules(modules, profile)
    if not selected and not fuzzing:  # only --matrix custom can select none
        raise ValueError(f"--matrix custom: the case module(s) {', '.join(modules)} give no "
                         f"case for the {profile} profile; return cases from cases({profile!r}), "
                         "or give the --profile they have cases for")
    return selected


def defining_module(variant_name: str) -> str:
    """The module whose import registers ``variant_name``'s builder: ``cases.variants`` or
    ``cases.composed`` for the suite's own, the case module for a custom one. ValueError when
    no module of this process registered it."""
    if variant_name in _REGISTERED_BY:
        return _REGISTERED_BY[variant_name]
    build = variants._BUILDERS.get(variant_name)  # noqa: SLF001 - same package
    if build is None:
        raise ValueError(f"unknown variant {variant_name!r}; pass its case module with "
                         "--cases-module (docs/cases.md)")
    return build.__module__


def fuzz_variant_sources(names: list[str]) -> list:
    """The ``fuzz_variants(shape) -> list[Variant]`` hooks of the case modules that define one
    (docs/cases.md), each checked as it is called: ValueError, one line, naming the module,
    when it returns something else than variants with a registered builder."""
    sources = []
    for name, module in zip(names, import_case_modules(names)):
        hook = getattr(module, "fuzz_variants", None)
        if hook is None:
            continue
        if not callable(hook):
            raise ValueError(f"case module {name!r}: fuzz_variants is not a function; define "
                             "fuzz_variants(shape) -> list[Variant] (docs/cases.md)")
        sources.append(_checked_source(name, hook))
    return sources


def _checked_source(name: str, hook):
    def variants_for(shape) -> list:
        found = list(hook(shape))
        for variant in found:
            if not isinstance(variant, Variant):
                raise ValueError(f"case module {name!r}: fuzz_variants returned a "
                                 f"{type(variant).__name__}; return cases.model.Variant objects")
            if variant.name not in variants.registered_variants():
                raise ValueError(f"case module {name!r}: fuzz_variants returned variant "
                                 f"{variant.name!r}, which has no builder; decorate its builder "
                                 f"with @cases.variants.builder({variant.name!r})")
            problem = _param_problem(variant)
            if problem:
                raise ValueError(f"case module {name!r}: fuzz_variants returned variant "
                                 f"{variant.token!r}: {problem}")
        return found

    return variants_for
