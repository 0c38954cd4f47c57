"""The source files a computation runs through, found by following imports from its modules:
each module they import, directly or not (imports inside functions and relative imports too),
that is this suite's code or the user's own, i.e. a ``.py`` file outside the interpreter's
installed paths (the standard library, site-packages). What the reference cache's key covers
(conformance/reference_cache.py: a case module's helper with its bias tables is part of its
golden) and what a repro script embeds (conformance/repro.py: the suite's modules only).

Static: an import the source does not spell out (``importlib.import_module(name)``) and data a
module reads (a file, an environment variable) are not followed."""
from __future__ import annotations

import ast
import importlib.util
import site
import sysconfig
from functools import lru_cache
from pathlib import Path

#: The suite's own packages: always followed, wherever they are installed.
SUITE_PACKAGES = ("cases", "reference", "conformance", "records", "reports")


def imported_names(source: str, package: str = "") -> list[str]:
    """The modules ``source`` imports, absolute names, in order: ``import a.b``, ``from a
    import b`` (a.b too, where a is local code and a.b a module of it) and relative imports
    resolved against ``package``, the importing module's package."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            if base is None:
                continue
            if base:
                found.append(base)
            for alias in node.names:  # `from cases import composed`: a submodule
                candidate = f"{base}.{alias.name}" if base else alias.name
                if alias.name != "*" and is_local(base or candidate) and is_module(candidate):
                    found.append(candidate)
    return found


def local_closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    """``roots`` (wherever they are installed: a case module a package installed registers
    through an entry point is keyed all the same) and every local module they import,
    directly or not, with the packages above them (their ``__init__`` runs too), sorted."""
    return _closure(tuple(roots))


@lru_cache(maxsize=64)
def _closure(roots: tuple[str, ...]) -> tuple[str, ...]:
    reached: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in reached or (name not in roots and not is_local(name)):
            continue
        origin = _origin(name)
        if origin is None:
            continue
        reached.add(name)
        package = name if origin.name == "__init__.py" else name.rpartition(".")[0]
        pending += imported_names(origin.read_text(encoding="utf-8"), package)
        if "." in name:
            pending.append(name.rpartition(".")[0])
    return tuple(sorted(reached))


def is_local(name: str) -> bool:
    """Whether module ``name`` is the suite's or the user's own source (see the module)."""
    top = name.partition(".")[0]
    if top in SUITE_PACKAGES:
        return True
    origin = _origin(top)
    return origin is not None and not _installed(origin)


def source_of(name: str) -> Path | None:
    """The ``.py`` file of module ``name``; None where it has none (built in, compiled, a
    namespace package) or cannot be found."""
    return _origin(name)


def _origin(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def is_module(name: str) -> bool:
    """Whether ``name`` can be imported here (a module or a package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _absolute(module: str, level: int, package: str) -> str | None:
    if not level:
        return module
    try:
        return importlib.util.resolve_name("." * level + module, package)
    except (ImportError, ValueError):
        return None


@lru_cache(maxsize=1)
def _installed_roots() -> tuple[Path, ...]:
    paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # some virtualenvs' site module
        pass
    paths.add(site.getusersitepackages())
    return tuple(Path(p).resolve() for p in paths if p)


def _installed(path: Path) -> bool:
    path = path.resolve()
    return any(path.is_relative_to(root) for root in _installed_roots())
