"""The reference cache key covers the source a case's golden runs through: the suite's modules
and the helpers a case module imports, found by reading files, never by importing them
(conformance/source_closure.py); an edit to any of them is a new key."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _keys(tmp_path, root: str, script: str | None = None) -> tuple[str, set[str], str]:
    """(the cache key of a case of ``root``, the keyed modules, what the process printed
    besides), in a fresh process as a worker computes it."""
    code = script or ("from conformance.reference_cache import cache_key, keyed_modules; "
                      f"print(cache_key('x/b1-h1x1-s8x8-d8', 0, 'cpu', {root!r})); "
                      f"print(' '.join(keyed_modules({root!r})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    args = [sys.executable, "-c", code] if script is None else [sys.executable, code]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout.splitlines()
    return out[-2], set(out[-1].split()), "\n".join(out[:-2])


def test_the_key_covers_the_helpers_a_case_module_imports_and_an_edit_is_a_new_key(tmp_path):
    """A case module's bias table came from a helper module it imports: the key hashed only the
    case module, so after an edit of the helper the cache served the old golden, a false
    MISMATCH on a correct backend (an outside audit). Helpers in a folder without
    __init__.py, in another encoding, imported inside a function: each keyed (a review)."""
    package = tmp_path / "userpkg"  # no __init__.py: a namespace package
    package.mkdir()
    (package / "tables.py").write_bytes(b"# -*- coding: latin-1 -*-\nSCALE = 1.0  # \xe9\n")
    (tmp_path / "sibling_tables.py").write_text("OFFSET = 0.0\n")
    device = tmp_path / "devicepkg"
    device.mkdir()
    (device / "__init__.py").write_text("print('devicepkg started a device')\n")
    (device / "runtime.py").write_text("")
    (package / "my_cases.py").write_text(
        "import json\nimport torch\nimport sibling_tables\nfrom .tables import SCALE\n"
        "from cases.variants import Mods, builder\n"
        "def later():\n    from devicepkg import runtime\n")
    key, modules, printed = _keys(tmp_path, "userpkg.my_cases")
    assert {"userpkg.my_cases", "userpkg.tables", "sibling_tables", "devicepkg",
            "devicepkg.runtime", "cases.variants"} <= modules, modules
    assert not {"json", "torch"} & modules  # installed: not the user's source
    assert "devicepkg started" not in printed  # read, never imported
    assert _keys(tmp_path, "userpkg.my_cases")[0] == key  # the same sources: the same key
    (package / "tables.py").write_bytes(b"# -*- coding: latin-1 -*-\nSCALE = 3.0  # \xe9\n")
    edited = _keys(tmp_path, "userpkg.my_cases")[0]
    (tmp_path / "sibling_tables.py").write_text("OFFSET = 1.0\n")
    assert len({key, edited, _keys(tmp_path, "userpkg.my_cases")[0]}) == 3


def test_variants_registered_by_a_script_are_keyed_by_the_script(tmp_path):
    """Variants registered from ``__main__`` (the suite used as a library) had the same key
    before and after an edit of the script (a review)."""
    script = tmp_path / "run_mine.py"
    (tmp_path / "my_helper.py").write_text("SCALE = 1.0\n")
    body = ("import my_helper\nfrom conformance.reference_cache import cache_key, keyed_modules\n"
            "print(cache_key('x/b1-h1x1-s8x8-d8', 0, 'cpu', '__main__'))\n"
            "print(' '.join(keyed_modules('__main__')))\n")
    script.write_text(body)
    key, modules, _ = _keys(tmp_path, "__main__", str(script))
    assert {"__main__", "my_helper"} <= modules
    script.write_text(body + "# edited\n")
    assert _keys(tmp_path, "__main__", str(script))[0] != key


def test_an_installed_case_module_is_followed_within_its_own_package_only(tmp_path,
                                                                         monkeypatch):
    """A case module an installed package registers lies in site-packages: it and its own
    package's modules are keyed, nothing else installed beside it (torch is walked nowhere:
    walking a source checkout of torch took 20 s and 1,653 modules, a review)."""
    from conformance import source_closure

    site_dir = tmp_path / "site"
    (site_dir / "theirpkg").mkdir(parents=True)
    (site_dir / "theirpkg" / "__init__.py").write_text("")
    (site_dir / "theirpkg" / "tables.py").write_text("")
    (site_dir / "other.py").write_text("")
    (site_dir / "theirpkg" / "cases.py").write_text(
        "import other\nimport torch\nfrom theirpkg import tables\nimport cases.variants\n")
    monkeypatch.syspath_prepend(str(site_dir))
    installed = source_closure._installed
    monkeypatch.setattr(source_closure, "_installed",
                        lambda path: path.resolve() == site_dir.resolve() or installed(path))
    source_closure._closure.cache_clear()
    try:
        modules = source_closure.local_closure(("theirpkg.cases",))
    finally:
        source_closure._closure.cache_clear()
    assert {"theirpkg", "theirpkg.cases", "theirpkg.tables", "cases.variants"} <= set(modules)
    assert not {"other", "torch"} & set(modules)
    assert not any(name.startswith("torch") for name in modules)


def test_the_key_covers_every_module_the_golden_and_the_inputs_import():
    """An edit to any suite module that the reference numbers run through (followed import by
    import from reference.golden and cases.inputs, as `flexconf repro` follows them) is a new
    cache key: a module missing from the key would serve stale goldens after the edit."""
    from conformance import reference_cache
    from conformance.repro import _module_source, _suite_imports

    reached, pending = set(), ["reference.golden", "cases.inputs"]
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending += _suite_imports(_module_source(name))
    assert reached <= set(reference_cache.keyed_modules()), \
        sorted(reached - set(reference_cache.keyed_modules()))
    assert "cases.torch_state" in reached  # which a hand-kept list of the key once missed
