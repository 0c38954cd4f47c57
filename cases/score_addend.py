"""Score mods that add to the score: ``score_mod(score, b, h, q_idx, kv_idx)`` is ``score +
addend(b, h, q_idx, kv_idx)``, the addend computed without the score.

ALiBi, relative and T5 bucketed position biases and the like are such mods. For them the
golden need not hand the mod its scores: it evaluates the addend, point by point as the mod
computes it, and makes it the accumulator of the q k^T product (reference/kernel.py), which
saves passes over each chunk's scores and a second buffer for them.

A mod counts as one (``adds_to_score``) when, run as every mod is run (flex_attention's four
vmaps and indexing rule, cases/pointwise.py):
- its last operation is an add of the score itself and a plain tensor (not a subclass, whose
  ``__torch_function__`` could make ``+`` anything), ``score + x``, ``x + score`` or
  ``torch.add(score, x)`` with no ``alpha`` and no ``out``, and it returns that add's result;
  after the add it only reads metadata (a dtype, a shape, a device);
- the score goes into no other operation, reading its metadata aside: not even in place
  (``score.mul_(2)`` would change what is added), nor into a view;
- the addend is 0-d at each point, of a dtype that the score's absorbs (a float, an int, a bool:
  ``score + x`` is then ``score + x.to(score.dtype)``);
- the addend's values do not depend on the score's: evaluated under a fifth vmap that maps the
  score alone, it comes back expanded along that dimension (stride 0). vmap carries a dimension
  through every operation that reads it, whatever route the mod takes (torch.ops, code run with
  torch-function modes disabled), the same argument as cases.pointwise.mask_dependence;
- on that grid (indices 0 and 1, where the case's dimension has them) of random scores, the
  scores are unchanged afterwards and the mod's output is bit for bit the scores plus the
  addend.
The first three are read off the calls that a TorchFunctionMode sees (all of a mod's
Python-level torch calls); the last two off vmap's dimensions and off values, so they also
catch what a mod hides from the mode (code run under ``torch._C.DisableTorchFunction``), where
the grid of two points shows it. A mod that hides an operation from torch-function modes
and makes its effect depend on the index values could pass the grid and not be an add
elsewhere: such code is outside what this guarantees, as mods that catch exceptions to choose
their value are outside the semantics (cases/pointwise.py). Under vmap the same operations run
whatever the values (vmap refuses a mod that branches on them), so a mod that passes is ``score
+ addend`` at every point, for any score. A mod that is not found to add is evaluated with its
scores, as before, which costs time, never correctness.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cases.pointwise import _under_flex_indexing, _vmap_bhqkv
from cases.score_dtype import with_traced_dtype

#: The calls that add two tensors as ``score + x`` does (``x + score`` and ``score + 1.0`` come
#: as Tensor.add too).
_ADDS = frozenset({torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__, torch.add,
                   torch.ops.aten.add.Tensor})

#: Properties and methods that read a tensor's metadata, never its values.
_METADATA_PROPERTIES = (torch.Tensor.dtype, torch.Tensor.shape, torch.Tensor.device,
                        torch.Tensor.ndim, torch.Tensor.layout)
_METADATA_METHODS = frozenset({torch.Tensor.size, torch.Tensor.dim,
                               torch.Tensor.is_floating_point})


class _NotAnAdd(Exception):
    """This evaluation of the mod did not add an addend to its score (see the module)."""


class _AddWatch(TorchFunctionMode):
    """Watches the calls of one evaluation of a score mod (``start`` names its score): the
    add of the score and its addend, and any other use of the score or call after the add.
    With ``compute_add`` False the add is not computed: it returns a view of the addend, which
    the mod must return as it is (the scores are then a placeholder that is never read)."""

    def __init__(self, compute_add: bool):
        super().__init__()
        self.compute_add = compute_add
        self.start(None)

    def start(self, score: torch.Tensor | None) -> None:
        self.score, self.addend, self.added, self.broken = score, None, None, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.score is None or _reads_metadata(func):
            return func(*args, **kwargs)
        if self.added is not None:  # anything after the add
            self.broken = True
        elif func in _ADDS and not kwargs and len(args) == 2 and any(
                a is self.score for a in args):
            other = args[1] if args[0] is self.score else args[0]
            # a plain tensor: a subclass's __torch_function__ could make "+" anything else
            if type(other) is torch.Tensor and other is not self.score:
                self.addend = other
                self.added = (func(*args) if self.compute_add
                              else torch.Tensor.view_as(other, other))
                return self.added
            self.broken = True
        elif any(a is self.score for a in pytree.tree_leaves((args, kwargs))):
            self.broken = True
        return func(*args, **kwargs)


def _reads_metadata(func) -> bool:
    if func in _METADATA_METHODS:
        return True
    return getattr(func, "__name__", "") == "__get__" and any(
        getattr(func, "__self__", None) is prop for prop in _METADATA_PROPERTIES)


def _addend_of(score_mod: Callable, watch: _AddWatch, with_output: bool = False) -> Callable:
    """A function of (score, b, h, q_idx, kv_idx) that runs ``score_mod`` under ``watch`` and
    returns what it added to the score (with ``with_output``, the mod's output too), or raises
    _NotAnAdd."""
    def addend(score, b, h, q_idx, kv_idx):
        watch.start(score)
        try:
            out = score_mod(score, b, h, q_idx, kv_idx)
            added, value, broken = watch.added, watch.addend, watch.broken
        finally:
            watch.start(None)
        if (broken or added is None or out is not added or type(out) is not torch.Tensor
                or value.dim() != 0):
            raise _NotAnAdd
        return (out, value) if with_output else value
    return addend


def adds_to_score(score_mod: Callable, score_dtype: torch.dtype, sizes: tuple[int, ...],
                  device: torch.device | str = "cpu",
                  traced_dtype: torch.dtype | None = None) -> bool:
    """Whether ``score_mod`` on scores of ``score_dtype`` is ``score + addend(b, h, q_idx,
    kv_idx)`` with the addend computed without the score (see the module), for a grid of
    ``sizes`` (B, Hq, Sq, Skv); the score's dtype reads as ``traced_dtype``
    (cases/score_dtype.py)."""
    # indices 0 and 1 where a dimension has them (0 twice where it has one: never an index
    # the mod need not take, which on a GPU would be a device-side assert, not an exception):
    # an addend of zero at every point would hide what happens to it
    grids = [torch.tensor([0, min(1, size - 1)], device=device) for size in sizes]
    seeded = torch.Generator(device=device).manual_seed(0)  # not the global generator's draws
    scores = torch.randn(2, 2, 2, 2, 2, device=device, generator=seeded).to(score_dtype)
    scores_before = scores.clone()
    watch = _AddWatch(compute_add=True)

    def evaluate():
        lens, mod = with_traced_dtype(score_mod, traced_dtype, score_dtype)
        per_score = torch.vmap(_vmap_bhqkv(_addend_of(mod, watch, with_output=True),
                                           score=True), in_dims=(0, None, None, None, None))
        with lens, watch:  # the lens outside: it must not see the watch's own calls
            return per_score(scores, *grids)

    try:
        out, addend = _under_flex_indexing(evaluate)
    except Exception:  # noqa: BLE001 - not an add, or not evaluable: evaluated as before
        return False
    if (addend.dim() != 5 or addend.stride(0) != 0 or addend.is_complex()
            or torch.promote_types(score_dtype, addend.dtype) != score_dtype):
        return False
    # What the calls said, seen in the values (a change hidden from the mode: see the module)
    return (torch.equal(scores, scores_before)
            and _same_values(out, scores_before + addend.to(score_dtype)))


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit equal values of one dtype, NaN equal to NaN."""
    return a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def score_addend(score_mod: Callable, score_dtype: torch.dtype, b: torch.Tensor,
                 h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor,
                 traced_dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """What ``score_mod`` adds to the score at every point of the grid b x h x q_idx x kv_idx,
    [len(b), len(h), len(q_idx), len(kv_idx)] in the addend's own dtype (dimensions it does not
    depend on expanded), for a mod that ``adds_to_score``; the score is not computed. None where
    this evaluation does not add to the score after all (then evaluate the mod with its
    scores)."""
    score = torch.zeros((), dtype=score_dtype, device=b.device)
    watch = _AddWatch(compute_add=False)

    def evaluate():
        lens, mod = with_traced_dtype(score_mod, traced_dtype, score_dtype)
        addend_at = _addend_of(mod, watch)
        per_point = _vmap_bhqkv(lambda *index: addend_at(score, *index), score=False)
        with lens, watch:
            return per_point(b, h, q_idx, kv_idx)

    try:
        return _under_flex_indexing(evaluate)
    except Exception:  # noqa: BLE001 - _NotAnAdd, or what a placeholder score set off
        return None
