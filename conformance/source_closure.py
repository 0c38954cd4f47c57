"""The source files a computation runs through, found by following imports from its modules:
each module they import, directly or not (imports inside functions and relative imports too),
that is this suite's code or lies beside the modules it starts from. What the reference
cache's key covers (conformance/reference_cache.py: a case module's helper with its bias tables
is part of its golden) and what a repro script embeds (conformance/repro.py: the suite's
modules only).

Where a module is looked for: in the suite's own directory, and in the directory each starting
module was found in (its ``sys.path`` entry: for ``mycases.my_cases`` at
``/work/mycases/my_cases.py``, ``/work``), as ``a/b/c.py`` or ``a/b/c/__init__.py`` (a folder
without ``__init__.py`` too). Only files are read, never imported: following a case module's
imports runs none of their code (a package that starts a device when imported), and torch,
wherever it is installed (a source checkout too), is not walked, unless the starting module
lies in torch's own directory. A starting module in site-packages is followed within its own
package only.

Static: an import the source does not spell out (``importlib.import_module(name)``) and data a
module reads (a file, an environment variable) are not followed."""
from __future__ import annotations

import ast
import importlib.util
import site
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Callable

#: The suite's own packages: always followed, wherever they are installed.
SUITE_PACKAGES = ("cases", "reference", "conformance", "records", "reports")
#: The directory that holds the suite's packages.
SUITE_DIR = Path(__file__).resolve().parents[1]


def imported_names(source: str, package: str = "",
                   is_module: Callable[[str], bool] = lambda name: False) -> list[str]:
    """The modules ``source`` imports, absolute names, in order: ``import a.b``, ``from a
    import b`` (a.b too, where ``is_module`` says it is one) and relative imports resolved
    against ``package``, the importing module's package. Source that does not parse imports
    nothing."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
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
                if alias.name != "*" and is_module(candidate):
                    found.append(candidate)
    return found


def local_closure(roots: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> source file of ``roots`` (imported modules: ``__main__`` too) and of
    every module they import, directly or not, where the module docstring says, with the
    packages above them (their ``__init__`` runs too), in name order."""
    return dict(_closure(tuple(roots)))


@lru_cache(maxsize=64)
def _closure(roots: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    starts = {name: path for name in roots if (path := _loaded_origin(name)) is not None}
    where = _search_dirs(starts)
    reached: dict[str, Path] = {}
    pending = list(starts)
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        path = starts.get(name) or find_source(name, where(name))
        if path is None:
            continue
        reached[name] = path
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        pending += imported_names(_read(path), package,
                                  lambda module: find_source(module, where(module)) is not None)
        if "." in name:
            pending.append(name.rpartition(".")[0])
    return tuple(sorted(reached.items()))


def find_source(name: str, directories: tuple[Path, ...]) -> Path | None:
    """The file of module ``name`` under the first of ``directories`` that has it, without
    importing anything; None where none has it."""
    parts = name.split(".")
    for directory in directories:
        stem = directory.joinpath(*parts)
        for path in (stem.with_name(parts[-1] + ".py"), stem / "__init__.py"):
            if path.is_file():
                return path
    return None


def _search_dirs(starts: dict[str, Path]) -> Callable[[str], tuple[Path, ...]]:
    """Where a module of a given name is looked for: the suite's packages in the suite's
    directory; others in the directory of each starting module that is not installed, and
    in that of an installed one for the names of its own top-level package."""
    free, own = [], {}
    for name, path in starts.items():
        top = name.partition(".")[0]
        if top in SUITE_PACKAGES:
            continue
        depth = name.count(".") + (path.name == "__init__.py")
        if depth >= len(path.parents):  # a file loaded under a name its path does not have
            continue
        directory = path.parents[depth]
        if _installed(directory):
            own.setdefault(top, directory)
        elif directory not in free:
            free.append(directory)

    def where(name: str) -> tuple[Path, ...]:
        top = name.partition(".")[0]
        if top in SUITE_PACKAGES:
            return (SUITE_DIR,)
        return tuple(free) + ((own[top],) if top in own else ())
    return where


def _loaded_origin(name: str) -> Path | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if file is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            return None
        file = spec.origin if spec is not None else None
    return Path(file).resolve() if file and str(file).endswith(".py") else None


def _read(path: Path) -> str:
    """The source as Python reads it (its coding line honoured); "" where it cannot be."""
    try:
        return importlib.util.decode_source(path.read_bytes())
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return ""


def _absolute(module: str, level: int, package: str) -> str | None:
    if not level:
        return module
    try:
        return importlib.util.resolve_name("." * level + module, package)
    except (ImportError, ValueError):
        return None


def site_packages() -> set[str]:
    """The interpreter's own site-packages directories (its environment's and the user's),
    resolved: where pip installs what this interpreter imports."""
    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # some virtualenvs' site module
        pass
    try:
        paths.add(site.getusersitepackages())
    except AttributeError:  # the same virtualenvs
        pass
    return {str(Path(p).resolve()) for p in paths if p}


@lru_cache(maxsize=1)
def _installed_roots() -> tuple[Path, ...]:
    paths = site_packages() | {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    torch_spec = importlib.util.find_spec("torch")  # a source checkout of torch is not ours
    if torch_spec is not None and torch_spec.origin:
        paths.add(str(Path(torch_spec.origin).parents[1]))
    return tuple(Path(p).resolve() for p in paths if p)


def _installed(path: Path) -> bool:
    path = path.resolve()
    return any(path == root or path.is_relative_to(root) for root in _installed_roots())
