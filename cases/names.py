"""Names the controller checks before it imports torch, so a usage error is answered at once:
the catalog's profiles and matrices (cases/catalog.py builds the cases they name) and the case
modules installed under the suite's entry point group (cases/custom.py imports them)."""
from __future__ import annotations

from importlib.metadata import entry_points

PROFILES = ("full", "smoke")

#: ``custom`` holds no catalog case: it selects the cases of case modules alone (cases/custom.py).
MATRICES = ("core", "extended", "all", "custom")

ENTRY_POINT_GROUP = "flexattention_conformance.cases"


def entry_point_case_modules() -> list[str]:
    """The module names installed under ``flexattention_conformance.cases`` (by entry name)."""
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    return [ep.value.partition(":")[0].strip() for ep in found]


def entry_point_origin(module: str) -> str | None:
    """Where the case module ``module`` was installed from, where an entry point names it:
    ``entry point 'acme' (group flexattention_conformance.cases) of package acme-cases 1.0``;
    None for a module only given with --cases-module."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.partition(":")[0].strip() == module:
            dist = getattr(ep, "dist", None)
            package = "an unknown package" if dist is None else \
                f"package {dist.metadata['Name']} {dist.version}"
            return f"entry point {ep.name!r} (group {ENTRY_POINT_GROUP}) of {package}"
    return None


def check_custom_matrix(matrix_name: str, modules) -> None:
    """ValueError, one line, for ``--matrix custom`` without a case module (it selects the
    case modules' cases alone, so it would run nothing; with --case-file the option would be
    ignored)."""
    if matrix_name == "custom" and not modules:
        raise ValueError("--matrix custom runs only the cases of case modules, and none is "
                         "given; pass --cases-module MODULE (docs/cases.md)")
