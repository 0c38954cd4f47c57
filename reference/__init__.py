"""The oracle: float64 golden (golden.py) and the verdict (verdict.py). No backends, no pytest.
``load_case_outputs`` reads a case's kept tensors (outputs.py)."""
from reference.outputs import CaseOutputs, load_case_outputs, save_case_outputs  # noqa: F401
