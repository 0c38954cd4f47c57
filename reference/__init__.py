"""The oracle: float64 golden (golden.py) and the verdict (verdict.py). No backends, no pytest."""
