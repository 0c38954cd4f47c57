"""Custom variants from a case module (examples/custom_variants/my_variants.py): they load,
their masks are the ones their docstrings define, the golden and the verdict judge them
unchanged, and bad module names are one-line errors."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from cases.custom import defining_module, import_case_modules, load_case_modules
from cases.inputs import make_inputs
from cases.model import Case, Shape
from cases.names import entry_point_case_modules
from cases.variants import build_mods
from reference.faults import row_ignores_mask
from reference.golden import reference_pair
from reference.verdict import judge

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "custom_variants"


@pytest.fixture
def my_variants(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    (module,) = import_case_modules(["my_variants"])
    return module


def dense_mask(name: str, params: dict, sq: int, skv: int) -> np.ndarray:
    """The masks as their docstrings define them, on explicit index grids."""
    i, j = np.arange(sq)[:, None], np.arange(skv)[None, :]
    if name == "dilated_sliding_window":
        d = i - j
        return (d >= 0) & (d < params["w"]) & (d % params["dil"] == 0)
    if name == "global_window":
        g = params["g"]
        return (np.abs(i - j) <= params["w"]) | (j < g) | (i < g)
    raise AssertionError(name)


def test_the_example_module_gives_its_cases_for_each_profile(my_variants):
    for profile, seqs in (("smoke", {256, 512}), ("full", {2048, 4096})):
        cases = load_case_modules(["my_variants"], profile)
        assert {c.variant.name for c in cases} == {"dilated_sliding_window", "global_window"}
        assert {c.shape.Sq for c in cases} == seqs
        assert len({c.id for c in cases}) == len(cases) == 4
    assert load_case_modules(["my_variants"], "smoke")[1].id == \
        "global_window-w32-g2/b1-h8x8-s256x256-d128/bf16/fwd"
    assert defining_module("global_window") == "my_variants"
    assert defining_module("sliding_window") == "cases.variants"
    assert import_case_modules(["my_variants"]) == [my_variants]  # importing again: no-op


@pytest.mark.parametrize("make, args", [("dilated_sliding_window", (8, 3)),
                                        ("global_window", (4, 3))])
def test_masks_equal_an_independent_dense_mask(my_variants, make, args):
    variant = getattr(my_variants, make)(*args)
    shape = Shape(1, 2, 2, 37, 53, 16)
    mods = build_mods(variant, shape)
    got = mods.mask_mod(0, 0, torch.arange(37).view(-1, 1), torch.arange(53)).numpy()
    expected = dense_mask(variant.name, dict(variant.params), 37, 53)
    assert got.shape == expected.shape and (got == expected).all()
    assert 0 < expected.sum() < expected.size  # the mask does mask something


@pytest.mark.parametrize("make, args", [("dilated_sliding_window", (16, 4)),
                                        ("global_window", (8, 5))])
def test_golden_and_verdict_apply_unchanged(my_variants, make, args):
    case = Case(getattr(my_variants, make)(*args), Shape(1, 2, 2, 96, 96, 16))
    inputs = make_inputs(case)
    golden, baseline = reference_pair(case, inputs)
    mods = build_mods(case.variant, case.shape)
    mask = create_block_mask(mods.mask_mod, None, None, 96, 96, device="cpu")
    eager = flex_attention(inputs.q, inputs.k, inputs.v, block_mask=mask)
    verdict = judge(case, golden, baseline, eager)
    assert verdict.passed, verdict.summary
    broken = judge(case, golden, baseline, row_ignores_mask(case, inputs, eager))
    assert not broken.passed and "row" in broken.metrics["failed_rules"]


@pytest.mark.parametrize("name, message", [
    ("no_such_variants_module", "case module 'no_such_variants_module' cannot be found; "
     "install it or put its directory on PYTHONPATH"),
    ("my-variants", "case module 'my-variants' is not a Python module name;"),
    ("examples/custom_variants/my_variants.py", "is not a Python module name;"),
    ("my_attn.py", "case module 'my_attn.py' cannot be found: name the module, not its file: "
     "--cases-module my_attn, with its directory on PYTHONPATH"),
    ("string", "case module 'string' has no function cases(profile) -> list[Case]; define one"),
])
def test_bad_module_names_are_one_line_errors(name, message):
    with pytest.raises(ValueError) as err:
        load_case_modules([name], "smoke")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_module_whose_import_fails_or_whose_variant_has_no_builder_is_named(tmp_path, monkeypatch):
    (tmp_path / "needs_missing.py").write_text("import not_installed_dependency_xyz\n")
    (tmp_path / "no_builder.py").write_text(
        "from cases.model import Case, Shape, Variant\n"
        "def cases(profile):\n"
        "    return [Case(Variant('unregistered_mask'), Shape(1, 1, 1, 8, 8, 8))]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"case module 'needs_missing' failed to import: "
                                         r"No module named 'not_installed_dependency_xyz'"):
        import_case_modules(["needs_missing"])
    with pytest.raises(ValueError, match=r"uses variant 'unregistered_mask', which has no builder; "
                                         r"decorate its builder with @cases.variants.builder"):
        load_case_modules(["no_builder"])


_ONE_CASE = ("from cases.model import Case, Shape, Variant\n"
             "def cases(profile):\n"
             "    return [Case(Variant('sliding_window', {}), Shape(1, 1, 1, 8, 8, 8))]\n")


@pytest.mark.parametrize("source, message", [
    ("def cases(profile):\n    return None\n",
     "case module 'mod': cases('smoke') returned None, not a list; return a list of "
     "cases.model.Case (docs/cases.md)"),
    ("def cases(profile):\n    return 5\n",
     "case module 'mod': cases('smoke') returned an int, not a list;"),
    ("def cases():\n    return []\n",
     "case module 'mod': cases('smoke') raised TypeError: cases() takes 0 positional arguments "
     "but 1 was given; fix the module (docs/cases.md)"),
    ("def cases(profile):\n    return {'full': []}[profile]\n",
     "case module 'mod': cases('smoke') raised KeyError: 'smoke'; fix the module"),
    ("import sys\nsys.exit(3)\n", "case module 'mod' failed to import: SystemExit: 3; fix the "
     "module"),
    ("def cases(profile):\n    return []\n",
     "--matrix custom: the case module(s) mod give no case for the smoke profile; return cases "
     "from cases('smoke'), or give the --profile they have cases for"),
    # a record's spec must read back: NaN, a string and a bool ran, and repro refused the
    # record (an outside audit)
    (_ONE_CASE.format("(('w', float('nan')),)"), "case module 'mod': case "
     "'sliding_window-wnan/b1-h1x1-s8x8-d8/bf16/fwd': parameter 'w' is nan; give a finite int "
     "or float (a record's spec must be read back by flexconf repro, shrink and --case-file)"),
    (_ONE_CASE.format("(('w', 'abc'),)"), "parameter 'w' is 'abc'; give a finite int or float"),
    (_ONE_CASE.format("(('w', True),)"), "parameter 'w' is True; give a finite int or float"),
    (_ONE_CASE.format("(('w', 8), ('', 2))"), "parameter ('', 2) is not a (name, value) pair"),
    (_ONE_CASE.format("(('w', 8), ('\u00e9', 2))"), "parameter name '\u00e9' holds a character "
     "that a case id cannot"),
])
def test_a_case_module_whose_cases_are_unusable_is_a_one_line_error(source, message, tmp_path,
                                                                     monkeypatch):
    """An outside audit: each of these was an INTERNALERROR with a traceback, or (no case at
    all) a run of pytest's placeholder case that exited 0."""
    from cases.custom import select_cases

    (tmp_path / "mod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mod", raising=False)
    with pytest.raises(ValueError) as err:
        select_cases("smoke", "custom", ["mod"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_variant_two_case_modules_define_names_both(tmp_path, monkeypatch):
    source = ("from cases.variants import Mods, builder\n"
              "@builder('defined_by_two')\n"
              "def build(variant, shape, device):\n"
              "    return Mods(None, None)\n"
              "def cases(profile):\n"
              "    return []\n")
    for name in ("first_definer", "second_definer"):
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as err:
        import_case_modules(["first_definer", "second_definer"])
    assert str(err.value) == (
        "case module 'second_definer' failed to import: ValueError: variant 'defined_by_two' is "
        "defined twice (first by first_definer); give one of them another name; fix the module")


def test_entry_points_name_installed_case_modules(tmp_path, monkeypatch):
    dist = tmp_path / "acme_variants-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-variants\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[flexattention_conformance.cases]\nacme = acme_variants.masks\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "acme_variants.masks" in entry_point_case_modules()
    # not importable: the line names the entry point and its package, which every run loads
    # (an outside audit: it named neither)
    with pytest.raises(ValueError) as err:
        import_case_modules(["acme_variants.masks"])
    assert str(err.value) == (
        "case module 'acme_variants.masks' cannot be found; install it or put its directory on "
        "PYTHONPATH (the module of entry point 'acme' (group flexattention_conformance.cases) "
        "of package acme-variants 1.0, which every run loads; fix or uninstall that package)")


def test_matrix_custom_lists_and_collects_only_the_modules_cases(monkeypatch, capsys):
    import subprocess
    import sys

    from conformance.cli import main

    monkeypatch.syspath_prepend(str(EXAMPLES))
    assert main(["list", "--profile", "smoke", "--matrix", "custom",
                 "--cases-module", "my_variants"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [c.id for c in load_case_modules(["my_variants"], "smoke")]
    assert main(["list", "--profile", "smoke", "--matrix", "core",
                 "--cases-module", "my_variants"]) == 0
    assert len(capsys.readouterr().out.split()) == 96 + len(listed)  # added to the 96
    repo = EXAMPLES.parent.parent
    env = {"PYTHONPATH": f"{repo}{os.pathsep}{EXAMPLES}", "PATH": os.environ["PATH"]}
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance/", "--collect-only",
                           "-q", "-p", "no:cacheprovider", "--profile", "smoke",
                           "--matrix", "custom", "--cases-module", "my_variants"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    collected = [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines()
                 if line.startswith("conformance/test_matrix.py::test_case[")]
    assert collected == listed, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_matrix_custom_without_a_case_module_is_a_one_line_error(capsys):
    from conformance.cli import main

    assert main(["list", "--matrix", "custom"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("flexconf list: error: --matrix custom runs only the cases of case modules, "
                   "and none is given; pass --cases-module MODULE (docs/cases.md)")


def test_a_custom_case_with_a_catalog_id_is_refused_naming_both(tmp_path, monkeypatch):
    (tmp_path / "steals_an_id.py").write_text(
        "from cases.model import Case, Shape\n"
        "from cases.variants import causal\n"
        "def cases(profile):\n"
        "    return [Case(causal(), Shape(1, 8, 8, 128, 128, 128))]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError) as err:
        load_case_modules(["steals_an_id"], "smoke")
    assert str(err.value) == (
        "case 'causal/b1-h8x8-s128x128-d128/bf16/fwd' of case module 'steals_an_id' has the id "
        "of a case of the catalog's core matrix (smoke profile); give the custom case another "
        "variant name, parameters or shape")


def _lazy_window(variant, shape, device):
    from cases.variants import Mods

    def mask_mod(b, h, q_idx, kv_idx):  # reads its parameter when called, not when built
        return (q_idx - kv_idx).abs() <= variant.param("w")

    return Mods(mask_mod, None)


def _whole_params(variant, shape, device):
    from cases.variants import Mods

    width = dict(variant.params)["w"]
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


def _data_dependent(variant, shape, device):
    from cases.variants import Mods

    ends = torch.arange(1, shape.Skv + 1, device=device)
    width = int(ends[variant.param("w")].item())  # no data on the meta device
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() < width, None)


def _optional_width(variant, shape, device):
    from cases.variants import Mods

    try:
        width = variant.param("width")
    except KeyError:  # an optional parameter, built without
        width = 64
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


def test_a_misspelt_optional_parameter_is_refused_and_a_correct_one_passes(monkeypatch):
    """A misspelt optional parameter was silently replaced by its default, and only changed
    the id; an extra parameter unlike any the builder asks for passes (it may be read at
    other shapes)."""
    from cases import variants
    from cases.model import Variant
    from conformance.case_file import _check_params

    monkeypatch.setitem(variants._BUILDERS, "test_optional", _optional_width)
    shape = Shape(1, 1, 1, 32, 32, 8)
    for params in ((("width", 8),), (), (("width", 8), ("stride", 2))):
        _check_params(Case(Variant("test_optional", params), shape), "case 0")
    use = variants.param_use(Variant("test_optional", (("widht", 8),)), shape)
    assert (use.read, use.missing, use.unread, use.defaulted) == (
        ("width",), (), ("widht",), ("width",))
    with pytest.raises(ValueError) as caught:
        _check_params(Case(Variant("test_optional", (("widht", 8),)), shape), "case 0")
    assert str(caught.value) == ("case 0: variant 'test_optional' did not read the parameter "
                                 "'widht', and took its default for 'width' (did you mean "
                                 "'width'?); fix its name or drop it")


def _optional_window(variant, shape, device):
    from cases.variants import Mods

    try:
        width = variant.param("w")
    except KeyError:  # an optional parameter: old ids keep their meaning
        width = 64
    ends = torch.arange(shape.Skv, device=device)
    width = int(ends[width].item())  # and no data on the meta device
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


def _long_sequences_only(variant, shape, device):
    from cases.variants import Mods

    width = variant.param("w") if shape.Skv > 1024 else shape.Skv
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


def _compares_the_variant(variant, shape, device):
    from cases.model import Variant
    from cases.variants import Mods

    width = 4 if variant == Variant("test_param_use") else variant.param("w")
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


def _paired_windows(variant, shape, device):
    from cases.variants import Mods

    local = variant.param("w")
    wide = variant.param("w2") if shape.Skv > 1024 else local  # a second window, long only
    return Mods(lambda b, h, q_idx, kv_idx: ((q_idx - kv_idx).abs() <= local)
                | ((q_idx - kv_idx).abs() == wide), None)


def _default_from_data(variant, shape, device):
    from cases.variants import Mods

    try:
        width = variant.param("w")
    except KeyError:
        width = int(torch.tensor([shape.Skv // 2], device=device).item())  # fails on meta here
    return Mods(lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= width, None)


class _LibraryError(Exception):
    def __init__(self):
        super().__init__("quota")
        self.cause = "disk quota"  # not an exception


def _raises_with_a_text_cause(variant, shape, device):
    raise _LibraryError()


@pytest.mark.parametrize("build, params, missing, unread", [
    (_paired_windows, (("w", 4), ("w2", 8)), (), ("w2",)),  # read at long shapes: passes
    (_default_from_data, (), (), None),  # failed while handling the KeyError: not missing
    (_raises_with_a_text_cause, (("w", 4),), (), None),
    (_optional_window, (), (), None),  # caught its own KeyError; then failed on meta for data
    (_long_sequences_only, (("w", 4),), (), ("w",)),  # read at long shapes: passes the file
    (_compares_the_variant, (), (), None),  # equal to the plain variant, as when built
    (_lazy_window, (("w", 4),), (), ()),
    (_lazy_window, (("w", 4), ("x", 1)), (), ("x",)),
    (_lazy_window, (), ("w",), None),  # the build failed: what else it reads is unknown
    (_whole_params, (("w", 4), ("x", 1)), (), None),  # read whole: cannot tell
    (_data_dependent, (("w", 4), ("x", 1)), (), None),  # not buildable on meta: cannot tell
    (_data_dependent, (), ("w",), None),  # but a missing parameter is still named
])
def test_param_use_sees_what_a_builder_reads_when_built_and_when_called(
        monkeypatch, build, params, missing, unread):
    """The case-file check (conformance/case_file.py) refuses a parameter that the builder
    lacks or never reads, and must not refuse one it reads only inside its mods, or reads in
    a way the check cannot follow."""
    from cases import variants
    from cases.model import Variant

    monkeypatch.setitem(variants._BUILDERS, "test_param_use", build)
    use = variants.param_use(Variant("test_param_use", params), Shape(1, 1, 1, 32, 32, 8))
    assert (use.missing, use.unread) == (missing, unread)
    from conformance.case_file import _check_params

    case = Case(Variant("test_param_use", params), Shape(1, 1, 1, 32, 32, 8))
    if missing:
        with pytest.raises(ValueError, match=f"needs the parameter '{missing[0]}'"):
            _check_params(case, "case 0")
    else:
        _check_params(case, "case 0")  # none of these is refused
    # the same mods, built for real, compute what their parameters say
    if params and missing == () and build is not _raises_with_a_text_cause:
        mods = variants.build_mods(Variant("test_param_use", params), Shape(1, 1, 1, 32, 32, 8))
        assert bool(mods.mask_mod(0, 0, torch.tensor(9), torch.tensor(5))) is True


@pytest.mark.parametrize("name", ["kausal_\u00fc", "two words", "a/b", ""])
def test_a_variant_name_a_case_id_cannot_hold_is_refused_at_registration(name):
    """pytest escapes all but printable ASCII in test ids: the records of a variant named
    'kausal_\u00fc' matched no case of the run's selection, and all were dropped (a review)."""
    from cases.variants import builder

    with pytest.raises(ValueError) as err:
        builder(name)
    assert str(err.value).startswith(f"variant name {name!r} ") and "\n" not in str(err.value)
    assert "printable ASCII" in str(err.value)
