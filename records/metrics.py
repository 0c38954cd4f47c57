"""What a verdict's metrics say beyond pass or fail, read the same way by the controller and the
reports. The metrics are written by reference/verdict.py (and ``masked_answer_calls`` by
conformance/decision.py); this module owns the reading, so neither side imports the other."""


def took_masked_answer(metrics: dict) -> bool:
    """Whether a verdict (its metrics) took the fully masked answer somewhere, on rows a score
    mod hides by overflow (reference/overflow_rows.py); ``masked_answer_calls`` names the calls
    that did where a case's calls gave different results (conformance/decision.py)."""
    return bool(metrics.get("overflow_rows_zero")) \
        or bool((metrics.get("lse") or {}).get("overflow_rows_minus_inf")) \
        or any((metrics.get(name) or {}).get("as_masked_overflow")
               for name in ("dq", "dk", "dv")) \
        or bool(metrics.get("masked_answer_calls"))
