"""A case file's bad case specs: each one line naming the field and the fix (load_case_file),
and a run given one says that line and runs nothing."""
from __future__ import annotations

import json
import sys

import pytest

from tests.test_bad_input import _error_lines
from tests.test_plugin_runs import CASES, run


@pytest.mark.parametrize("spec, missing", [
    ({}, "shape"),
    ({**CASES[0].to_json(), "shape": {"B": 1, "Hq": 2, "Hkv": 2, "Skv": 64, "D": 16}},
     "shape.Sq"),
])
def test_a_case_spec_without_a_field_names_it(tmp_path, spec, missing):
    from conformance.case_file import load_case_file

    path = tmp_path / "case.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError) as caught:
        load_case_file(str(path))
    assert str(caught.value) == (
        f"--case-file {str(path)!r}: case 0 is not a valid case spec (the field {missing!r} is "
        "missing); write the fields of Case.to_json (docs/cases.md)")


@pytest.mark.parametrize("change, line", [
    ({"input_scal": 4}, "case 0 has an unknown field 'input_scal' (did you mean 'input_scale'?); "
                        "its fields are id, variant, params, shape, dtype, mode, input_scale"),
    ({"shape": {"B": 1, "Hq": 2, "Hkv": 2, "Sq": 64, "Skv": 64, "D": 16, "Dv": 16}},
     "case 0: shape has an unknown field 'Dv' (did you mean 'D'?); its fields are B, Bkv, Hq, "
     "Hkv, Sq, Skv, D"),
    ({"shape": {"B": 1, "Hq": 2, "Hkv": 2, "Sq": "64", "Skv": 64, "D": 16}},
     'case 0: shape.Sq is "64" (a JSON string); give a whole number, e.g. 64'),
    ({"input_scale": 2.5}, "case 0: input_scale is 2.5 (a JSON number); give a whole number, "
                           "e.g. 64"),
    ({"shape": [1, 2, 2, 64, 64, 16]}, "case 0: 'shape' is a JSON array; give an object with the "
                                       "fields B, Bkv, Hq, Hkv, Sq, Skv, D"),
    ({"variant": "casual"}, "case 0 names variant 'casual', which no builder registers (did you "
                            "mean 'causal'?); a custom variant needs its --cases-module "
                            "(docs/cases.md)"),
    ({"variant": "sliding_window", "params": {"window": 16}},
     "case 0: variant 'sliding_window' needs the parameter 'w', which 'params' does not give (it "
     "gives window); give the parameters it reads: w"),
    ({"variant": "prefix_lm", "params": {"pp": 16}},  # it named the misspelling as the fix
     "case 0: variant 'prefix_lm' needs the parameter 'p', which 'params' does not give (it "
     "gives pp; did you mean 'p' instead of 'pp'?); give the parameters it reads: p"),
    # an outside audit: these ran, each a HARNESS_ERROR with a traceback, or masking every key
    ({"variant": "sliding_window", "params": {"w": "x"}},
     'case 0: params.w is "x"; give a finite number, e.g. 256'),
    ({"variant": "sliding_window", "params": {"w": float("nan")}},
     "case 0: params.w is NaN; give a finite number, e.g. 256"),
    ({"variant": "sliding_window", "params": {"w": -5}},
     "case 0: variant 'sliding_window': its w is -5; give a whole number from 1 to 2147483647 "
     "(the window's length in keys)"),
    # an outside audit: a D of 10^20 ran, a HARNESS_ERROR (torch's size overflowed) with a
    # C++ stack after it
    ({"shape": {"B": 1, "Hq": 2, "Hkv": 2, "Sq": 64, "Skv": 64, "D": 10 ** 20}},
     "case 0 is not a valid case spec (shape D=100000000000000000000 is above 2147483647; give "
     "a size a device can hold); write the fields of Case.to_json (docs/cases.md)"),
    ({"shape": {"B": 4096, "Hq": 4096, "Hkv": 1, "Sq": 2 ** 31 - 1, "Skv": 64, "D": 4096}},
     "case 0 is not a valid case spec (shape B*Hq*Sq*D = 147573952520956936192 elements of q, "
     "above 2^56; give smaller dimensions); write the fields of Case.to_json (docs/cases.md)"),
    ({"shape": {"B": 1, "Hq": 1, "Hkv": 1, "Sq": 2 ** 31 - 1, "Skv": 2 ** 31 - 1, "D": 1}},
     "case 0 is not a valid case spec (shape B*Hq*Sq*Skv = 4611686014132420609 scores, above "
     "2^60; give smaller dimensions); write the fields of Case.to_json (docs/cases.md)"),
])
def test_a_case_spec_with_a_misspelt_or_mistyped_field_is_one_line(tmp_path, change, line):
    """A misspelt input_scale made an x4 case an x1 case that passed; an unknown variant was
    a HARNESS_ERROR of the run; a string length named no field; a parameter the builder
    lacked was a HARNESS_ERROR of the case, and one it ignored changed only the id."""
    from cases.variants import registered_variants
    from conformance.case_file import load_case_file

    spec = {k: v for k, v in CASES[1].to_json().items() if k != "id"}
    path = tmp_path / "case.json"
    path.write_text(json.dumps({**spec, **change}))
    with pytest.raises(ValueError) as caught:
        load_case_file(str(path), registered_variants())
    assert str(caught.value) == f"--case-file {str(path)!r}: {line}"
    path.write_text(json.dumps({"cases": [spec], "fuz": {}}))
    with pytest.raises(ValueError, match=r"the file has an unknown field 'fuz' \(did you mean "):
        load_case_file(str(path))
    path.write_text(json.dumps([spec, {**spec, **change}]))  # the second case: case 1
    with pytest.raises(ValueError) as caught:
        load_case_file(str(path), registered_variants())
    assert str(caught.value) == f"--case-file {str(path)!r}: " + line.replace("case 0", "case 1")


def test_a_cases_field_that_is_not_a_list_is_named(tmp_path):
    """{"cases": "x"} was read as one spec: "case 0 is a JSON string" (an outside audit)."""
    from conformance.case_file import load_case_file

    path = tmp_path / "case.json"
    for value, kind in (("x", "string"), ({"variant": "causal"}, "object"), (None, "null")):
        path.write_text(json.dumps({"cases": value}))
        with pytest.raises(ValueError) as caught:
            load_case_file(str(path))
        assert str(caught.value) == (f"--case-file {str(path)!r}: its 'cases' is a JSON {kind}; "
                                     "give a list of case specs (Case.to_json, docs/cases.md)")


@pytest.mark.parametrize("change", [{"input_scal": 4}, {"variant": "sliding_window",
                                                        "params": {"w": -5}}])
def test_a_run_given_a_bad_case_spec_says_load_case_files_one_line_and_runs_nothing(tmp_path,
                                                                                   change):
    """The run's side of the test above (one run per kind of check: a field's name, a
    catalog parameter's range): what load_case_file says is the whole error, exit 4."""
    from cases.variants import registered_variants
    from conformance.case_file import load_case_file

    spec = {k: v for k, v in CASES[1].to_json().items() if k != "id"}
    path = tmp_path / "case.json"
    path.write_text(json.dumps([spec, {**spec, **change}]))
    with pytest.raises(ValueError) as caught:
        load_case_file(str(path), registered_variants())
    proc = run([sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider",
                "--backend", "cpu-eager", "--case-file", str(path),
                "--report-dir", str(tmp_path / "report")])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _error_lines(proc) == [f"ERROR: {caught.value}"]
    assert not (tmp_path / "report" / "results.json").exists()
