"""Estimated peak memory of a case, for the memory gate (and cost, for balancing shards).

Rough on purpose, and erring high: a case counts what its child allocates (inputs, output,
block mask, the score matrix an unfused eager path materialises, compiler working memory)
plus what the parent holds for the verdict (float64 golden, baseline, observed output, and the
reference's bounded chunk workspace), and the host copies of the results of a backend whose
timed calls each give another answer (every one is kept and judged: conformance/child.py).
``create_block_mask`` evaluates the mask over the whole
[B?, H?, Sq, Skv] grid in several temporaries, measured here at ~9 bytes per element; which
of B and H the grid has follows what the mask depends on (``block_mask_batch_heads``).
"""
from __future__ import annotations

from cases.model import Case, Shape
from reference.partial_sums import partial_sums_sized

GiB = 1 << 30
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
#: Bytes per element of the grid create_block_mask evaluates (measured, rounded up).
_MASK_BYTES_PER_ELEMENT = 10
#: Working memory of a compiler in the child (Inductor measured ~0.6 GiB; rounded up).
_COMPILER_BYTES = 1 * GiB
#: The reference's chunk workspace (score chunks of 3 Mi float64 elements, a few copies,
#: and a shared plan's mask of up to 64 MiB: reference/chunk_plan.py).
_REFERENCE_WORKSPACE = 512 << 20


def tensor_bytes(case: Case) -> tuple[int, int, int]:
    """Elements of q (and the output), of k plus v, and of one full score matrix."""
    s = case.shape
    q = s.B * s.Hq * s.Sq * s.D
    kv = 2 * s.Bkv * s.Hkv * s.Skv * s.D
    scores = s.B * s.Hq * s.Sq * s.Skv
    return q, kv, scores


def block_mask_batch_heads(shape: Shape,
                           mask_depends_on: frozenset[str]) -> tuple[int | None, int | None]:
    """B and H to pass to create_block_mask (None: one mask shared by every batch or head).

    The batch when the mask depends on ``b``, or when key/value are broadcast over the batch
    (flex_attention then requires a block mask of the query batch); the query heads when the
    mask depends on ``h``. ``mask_depends_on`` is cases.pointwise.mask_dependence's answer.
    """
    batch = shape.B if "b" in mask_depends_on or shape.Bkv != shape.B else None
    heads = shape.Hq if "h" in mask_depends_on else None
    return batch, heads


def result_bytes(case: Case) -> int:
    """Bytes of one call's result: the output, with its float32 log-sum-exp (``fwd+lse``) or
    with dQ, dK and dV (``fwd+bwd``)."""
    q, kv, _ = tensor_bytes(case)
    s = case.shape
    if case.mode == "fwd+bwd":
        return (2 * q + kv) * _DTYPE_BYTES[case.dtype]
    lse = s.B * s.Hq * s.Sq * 4 if case.mode == "fwd+lse" else 0
    return q * _DTYPE_BYTES[case.dtype] + lse


def kept_results_bytes(case: Case, timed_runs: int) -> int:
    """The results a case keeps beyond the one each side's estimate counts, at worst (a
    nondeterministic backend, whose every timed call gives another answer): the child holds
    the first call's host copy and one per timed call, the parent loads one per timed call
    too. None in a compile-only pass (``timed_runs`` 0)."""
    return (2 * timed_runs + 1) * result_bytes(case) if timed_runs > 0 else 0


def child_peak_bytes(case: Case, compiled: bool,
                     mask_depends_on: frozenset[str] = frozenset()) -> int:
    q, kv, scores = tensor_bytes(case)
    s = case.shape
    item = _DTYPE_BYTES[case.dtype]
    batch, heads = block_mask_batch_heads(s, mask_depends_on)
    mask_grid = (batch or 1) * (heads or 1) * s.Sq * s.Skv
    total = (2 * q + kv) * item + mask_grid * _MASK_BYTES_PER_ELEMENT
    if compiled:
        total += _COMPILER_BYTES
    else:  # eager flex_attention materialises scores, mask and probabilities in float32
        total += 3 * scores * 4
    if case.mode != "fwd":
        total *= 2
    return total


def parent_peak_bytes(case: Case) -> int:
    q, kv, _ = tensor_bytes(case)
    # float64 copies of q, k, v and the golden output, the float32 baseline, observed output
    total = (2 * q + kv) * 8 + q * (4 + _DTYPE_BYTES[case.dtype]) + _REFERENCE_WORKSPACE
    if case.mode == "fwd+bwd":  # dO, and dQ, dK, dV: golden (float64), baseline, observed
        total += q * _DTYPE_BYTES[case.dtype] + (q + kv) * (8 + 4 + _DTYPE_BYTES[case.dtype])
        if partial_sums_sized(case):  # one batch's dK and dV per query head, float64
            s = case.shape
            total += 2 * s.Hq * s.Skv * s.D * 8
    return total


def case_peak_bytes(case: Case, compiled: bool,
                    mask_depends_on: frozenset[str], timed_runs: int) -> int:
    """Estimated bytes a case needs at its peak, child and parent together; ``mask_depends_on``
    are the index arguments its mask depends on (cases.pointwise.mask_dependence);
    ``timed_runs`` bounds the results kept when the calls differ (0: a compile-only pass)."""
    return (child_peak_bytes(case, compiled, mask_depends_on) + parent_peak_bytes(case)
            + kept_results_bytes(case, timed_runs))


def relative_cost(case: Case) -> float:
    """A unitless cost of running a case (score elements plus a fixed compile share), for
    balancing work across shards and workers."""
    _, _, scores = tensor_bytes(case)
    return scores * case.shape.D / 1e9 + 1.0
