"""The score's dtype as flex_attention traces it, and the mod's 16-bit and float32 arithmetic.

flex_attention does not run a score mod on the scores as it computes them: it traces the mod
first (dynamo in eager mode, then make_fx for a compiler), with the score a 0-d tensor of the
query's dtype, and runs the traced graph on its scores (float32 for bfloat16, float16 and
float32 queries). What the mod computes in Python from the score's dtype is fixed by that trace:
``torch.finfo(score.dtype).min`` is bfloat16's min in a bfloat16 case, in eager and compiled
flex_attention alike.

The golden runs mods on float64 scores, the baseline on float32 ones. Under
``ScoreDtypeAsTraced`` a read of the dtype of the score, or of a tensor made from it, gives the
dtype the trace gives it: the score's is the query's, and each operation on a tensor that reads
otherwise passes its inputs' traced dtypes on by torch's own rules (the operation run again on
zeros of those dtypes: ``score * 2`` is bfloat16, ``score.float()`` float32, ``score + t``
with a float32 ``t`` float32, ``score.double()`` float64).

What the two implementations do with 16-bit values in the mod differs (torch 2.13.0, CPU, B1 H2
S128 D32): eager flex_attention runs each such operation in 16 bits, so ``x.to(score.dtype)``
rounds (the mod ``score.to(score.dtype)`` moves eager's output by 0.004-0.008 in bfloat16 and
0.0007 in float16, two draws of inputs), and ``score.new_tensor(0.3) * (kv_idx - q_idx)`` is a
bfloat16 constant times an index in bfloat16; compiled flex_attention keeps them in float32
(Inductor does not emulate casts to 16 bits by default: the same ``.to`` moves nothing, the
product is a float32 one). Neither rounding is the mod's function, so the golden
(``keep_precision``) does that arithmetic in float64: a conversion to 16 bits keeps its value, a
16-bit constant is the rounded constant the mod names, and operations on 16-bit values run
widened. The baseline runs the mod as eager does, roundings and all, and since the verdict's
limits scale with the baseline's error, they span both implementations. A conversion to float32
keeps the golden's float64 too (Gemma's ``torch.tanh(score.float() / c) * c``): flex_attention's
scores are float32 already, and the golden's would be rounded to float32 by it; an operation
that takes one dtype (``torch.lerp``) gets the float32 tensors beside the score widened; a
float32 constant made from the score (``full_like(score, 0.1, dtype=torch.float32)``) is
float32's, then widened.

An operation in place after a conversion sees what eager's float32 scores give it: a
conversion to float32 or to the traced dtype a tensor has already returns the tensor itself
(``score.float().clamp_(-c, c)`` clamps the score), any other a new tensor
(``score.double().mul_(2)`` leaves it alone).

Not covered: the indices' dtype (flex_attention traces them as int32, eager flex_attention
computes them in int64 as the golden does); reads of a size in bytes (``element_size()``,
``itemsize``) or of ``Tensor.type()`` with no argument; a float32 tensor that the mod writes
the score into in place (it rounds in the golden); and, for an operation in place after a
conversion, values that are 16-bit when eager runs (after ``score.bfloat16()``, or a row of a
captured bfloat16 table): their ``.float()`` is a new tensor in eager and the tensor itself in
the golden, and their ``.bfloat16()`` the reverse. Covered besides
the ``dtype`` property: ``score.new_tensor(c)``, which eager makes in the traced dtype (as
``torch.tensor(c, dtype=score.dtype)``, not as ``new_full``).
"""
from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cases.inputs import TORCH_DTYPES
from cases.model import Case

#: The property whose getter a TorchFunctionMode sees as ``func`` with this ``__self__``.
_DTYPE_PROPERTY = torch.Tensor.dtype


#: Score mods seen, in an evaluation under the lens, neither to read a tensor's dtype nor to
#: touch a 16-bit value (a 16-bit tensor or dtype, a conversion to 16 bits, a constant made in
#: the score's dtype) nor, in the golden, to turn the score's values into float32. A mod's
#: Python code takes the same path at every point of any grid (vmap refuses a branch on a
#: value, and every point is a 0-d tensor), so such a mod never does, and the lens, which costs
#: a Python call per operation, has nothing to change for it. Kept apart for each traced
#: dtype, and for the golden and the baseline (the values of ``keep_precision``):
#: ``score.float()`` changes nothing in the baseline's float32 and everything in the golden's
#: float64.
_UNTOUCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_SIXTEEN_BITS = (torch.bfloat16, torch.float16)
#: The dtypes whose arithmetic in a mod the golden does in float64.
_WIDENED = _SIXTEEN_BITS + (torch.float32,)
#: ``Tensor.type``'s names of those dtypes (on the CPU).
_SIXTEEN_BIT_TYPE_NAMES = frozenset({"torch.BFloat16Tensor", "torch.HalfTensor"})
_WIDENED_TYPE_NAMES = _SIXTEEN_BIT_TYPE_NAMES | {"torch.FloatTensor"}
#: Operations that move 16-bit values without arithmetic: the golden runs them as they are
#: (indexing a large 16-bit table in float64 would copy it at every evaluation).
_EXACT = frozenset({torch.Tensor.__getitem__, torch.ops.aten.index.Tensor})
#: Conversions with no dtype argument to widen: in the golden they keep their input.
_NARROWING = frozenset({torch.Tensor.half, torch.Tensor.bfloat16})
#: A constant made like a tensor from data: eager flex_attention (its trace bakes the constant
#: in) makes it in the traced dtype, rounded, not in the dtype its tensor has when it runs.
_CONSTANT_FROM_DATA = torch.Tensor.new_tensor
#: Operations that make a constant (of a tensor's shape): in the golden the constant is made
#: as the mod names it (``full_like(s, 0.1, dtype=torch.float32)``: float32's 0.1), then widened.
_CONSTANTS = frozenset({_CONSTANT_FROM_DATA, torch.Tensor.new_full, torch.full_like,
                        torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.zeros_like,
                        torch.ones_like})
#: Conversions to another tensor's dtype: of that tensor, only its dtype and device count.
_LIKE_A_TENSOR = frozenset({torch.Tensor.type_as, torch.Tensor.to})
#: Conversions that make a new tensor where the dtype changes, and return their input where not.
_CONVERSIONS = _LIKE_A_TENSOR | _NARROWING | frozenset({
    torch.Tensor.type, torch.Tensor.double, torch.Tensor.float})
#: Operators that write into their left operand (``x += s``).
_IN_PLACE_OPERATORS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
    "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})


class ScoreDtypeAsTraced(TorchFunctionMode):
    """Within one evaluation of ``score_mod`` (run as ``wrap`` returns it), the dtype of its
    score reads as ``traced_dtype``, and the dtype of every tensor computed from it as
    flex_attention's trace would have it (see the module). With ``keep_precision`` (the
    golden), an operation that the trace makes 16-bit, or that would turn the score's values
    into float32, runs in float64 instead."""

    def __init__(self, score_mod: Callable, traced_dtype: torch.dtype, keep_precision: bool):
        super().__init__()
        self.score_mod = score_mod
        self.traced_dtype = traced_dtype
        self.keep_precision = keep_precision
        # what the lens changed in this evaluation: a mod for which it changed nothing is
        # cached as one it need not see again
        self.read_a_dtype = self.made_16_bits = self.narrowed_float64 = False
        self.copied_a_conversion = False
        self._traced: dict[int, tuple[weakref.ref, torch.dtype]] = {}

    def wrap(self) -> Callable:
        """The score mod, with its score (the 0-d tensor that vmap hands it) marked."""
        def traced_score_mod(score, *index):
            # not _remember: reading score.dtype here, under the mode, would count as the mod's
            self._traced[id(score)] = (weakref.ref(score), self.traced_dtype)
            return self.score_mod(score, *index)
        return traced_score_mod

    def __exit__(self, exc_type, exc, traceback):
        super().__exit__(exc_type, exc, traceback)
        if exc_type is None and not (self.read_a_dtype or self.made_16_bits
                                     or self.narrowed_float64 or self.copied_a_conversion):
            try:
                _UNTOUCHED.setdefault(self.score_mod, set()).add(
                    (self.traced_dtype, self.keep_precision))
            except TypeError:  # a mod that cannot be weakly referenced: asked every time
                pass

    def traced_dtype_of(self, tensor: torch.Tensor) -> torch.dtype:
        entry = self._traced.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return tensor.dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DTYPE_PROPERTY and len(args) == 1:
            self.read_a_dtype = True
            return self.traced_dtype_of(args[0])
        if func is _CONSTANT_FROM_DATA and self._is_marked(args[0]) and "dtype" not in kwargs:
            self.read_a_dtype = True  # what it makes depends on the traced dtype (the cache)
            kwargs = dict(kwargs, dtype=self.traced_dtype_of(args[0]))
        leaves = pytree.tree_leaves((args, kwargs))
        touches_16_bits = func in _NARROWING or _has_16_bits(leaves)
        if not (touches_16_bits or any(self._is_marked(leaf) for leaf in leaves
                                       if isinstance(leaf, torch.Tensor))):
            return func(*args, **kwargs)
        self.made_16_bits |= touches_16_bits
        traced = self._traced_dtypes(func, args, kwargs)
        marked = [a for a in leaves if isinstance(a, torch.Tensor) and self._is_marked(a)]
        if (self.keep_precision and touches_16_bits and traced is not None
                and any(d in _SIXTEEN_BITS for d in traced)):
            out = self._as_eager_converts(func, self._in_float64(func, args, kwargs, leaves),
                                          traced, args, kwargs)
        elif self.keep_precision and marked:
            out = self._as_eager_converts(func, self._golden_run(func, args, kwargs, leaves,
                                                                 traced), traced, args, kwargs)
        else:
            out = func(*args, **kwargs)
        return self._pass_on(out, traced, marked)

    def _as_eager_converts(self, func, out, traced, args, kwargs):
        """A conversion's result, as eager flex_attention's float32 scores make it: the tensor
        itself where the conversion is to float32 (the scores' own: ``score.float().clamp_(-c,
        c)`` clamps the score too) or to the traced dtype it has (``.to(device)``), a new
        tensor otherwise (``score.double().mul_(2)`` leaves the score alone, and so does
        ``score.bfloat16()`` in a bfloat16 case: it names 16 bits, which eager's float32
        scores are not), which the
        golden's float64 values need not have made (``.double()`` of float64 returns its
        input; a conversion that changed the golden's dtype made a new tensor already)."""
        if (func not in _CONVERSIONS or traced is None or len(traced) != 1
                or not isinstance(out, torch.Tensor) or out.dtype != args[0].dtype
                or traced[0] == torch.float32):
            return out
        if traced[0] == self.traced_dtype_of(args[0]) and not _names_16_bits(func, args, kwargs):
            return out  # a conversion to the dtype it has: the tensor itself
        self.copied_a_conversion = True
        return torch.Tensor.clone(out)

    def _golden_run(self, func, args, kwargs, leaves, traced):
        """``func`` on the golden's values, made from the score: as it is, unless it turns them
        into float32 (``score.float()``: float32 values in flex_attention, with no rounding) or
        cannot take float64 beside float32 (``torch.lerp(score.float(), t32, w)``); then with
        its float32 widened. An operation that the trace refuses too (``traced`` is None:
        ``torch.lerp(score, t32, w)`` in a bfloat16 case) raises, as flex_attention does."""
        try:
            out = func(*args, **kwargs)
        except RuntimeError:
            if traced is None or _in_place(func, kwargs) or not _has_float32(leaves):
                raise
            self.narrowed_float64 = True
            return func(*self._widened(args), **self._widened(kwargs))
        if _narrowed(out, leaves):
            self.narrowed_float64 = True
            out = self._in_float64(func, args, kwargs, leaves)
        return out

    def _traced_dtypes(self, func, args, kwargs) -> list[torch.dtype] | None:
        """The dtypes of the outputs of ``func`` as the trace makes them (run on zeros of the
        traced dtypes); None where it cannot run so."""
        try:
            traced = pytree.tree_leaves(func(*self._stand_ins(args), **self._stand_ins(kwargs)))
        except Exception:  # noqa: BLE001 - not on zeros (in place on a broadcast, say)
            return None
        return [t.dtype for t in traced if isinstance(t, torch.Tensor)]

    def _in_float64(self, func, args, kwargs, leaves):
        """What ``func`` makes, with the 16-bit or float32 arithmetic the trace gives it done
        in float64: a conversion to 16 bits or to float32 keeps its input; an operation that
        moves values (indexing) or makes a constant (``torch.tensor(0.3, dtype=score.dtype)``,
        ``score.new_tensor(0.3)``: the constant rounded, as the mod names it) runs as it is
        and its result is widened; any other runs on its inputs and dtypes widened."""
        if func in _NARROWING or func is torch.Tensor.float:  # the value it converts
            source = args[0]
            # an alias, as eager's float32 scores give it: ``score.float().clamp_(-c, c)``
            # clamps the score too, in eager flex_attention
            return source.double() if source.dtype in _WIDENED else \
                torch.Tensor.view_as(source, source)
        if (func in _EXACT or func in _CONSTANTS
                or not any(isinstance(leaf, torch.Tensor) for leaf in leaves)):
            return self._widened(func(*args, **kwargs))
        if func in _LIKE_A_TENSOR and len(args) > 1 and isinstance(args[1], torch.Tensor):
            template = args[1]  # its dtype and device: a large table is not widened whole
            dtype = torch.float64 if template.dtype in _WIDENED else template.dtype
            return torch.Tensor.to(self._widened(args[0]), template.device, dtype, *args[2:],
                                   **kwargs)
        return func(*self._widened(args), **self._widened(kwargs))

    @staticmethod
    def _widened(tree):
        """``tree`` with 16-bit and float32 tensors, dtypes and tensor type names
        (``Tensor.type``'s) made float64 (the golden's precision; float32 values widen
        exactly)."""
        return pytree.tree_map(
            lambda a: a.double() if isinstance(a, torch.Tensor) and a.dtype in _WIDENED
            else torch.float64 if isinstance(a, torch.dtype) and a in _WIDENED
            else "torch.DoubleTensor" if isinstance(a, str) and a in _WIDENED_TYPE_NAMES
            else a,
            tree)

    def _pass_on(self, out, traced: list[torch.dtype] | None, marked: list[torch.Tensor]):
        """``out``, its tensors whose traced dtype differs from their own marked. A tensor
        that the call returned as it was (``score.double()`` of a float64 score) but that the
        trace makes anew in another dtype comes back as an alias, marked apart."""
        outputs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if not outputs:
            return out
        if traced is None or len(traced) != len(outputs):
            if not marked:
                return out
            # an output in a marked input's dtype (the golden's float64) reads as that input
            first = marked[0]
            traced = [self.traced_dtype_of(first) if o.dtype == first.dtype else o.dtype
                      for o in outputs]
        dtype_of = dict(zip(map(id, outputs), traced))

        def passed_on(real: torch.Tensor) -> torch.Tensor:
            dtype = dtype_of[id(real)]
            if self._is_marked(real) and dtype != self.traced_dtype_of(real):
                real = torch.Tensor.view_as(real, real)  # returned as is: an alias apart
            self._remember(real, dtype)
            return real
        return pytree.tree_map_only(torch.Tensor, passed_on, out)

    def _stand_ins(self, tree):
        """``tree`` with each tensor replaced by zeros of its shape (at a point, under vmap)
        in its traced dtype: the operation on them gives the traced dtypes for the price of
        one on 0-d tensors (meta tensors would give them too, but their first use imports
        torch's meta kernels, 1 s)."""
        def stand_in(t: torch.Tensor) -> torch.Tensor:
            if self._is_marked(t):
                return torch.zeros(t.shape, dtype=self.traced_dtype_of(t), device=t.device)
            return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)
        return pytree.tree_map_only(torch.Tensor, stand_in, tree)

    def _is_marked(self, tensor: torch.Tensor) -> bool:
        entry = self._traced.get(id(tensor))
        return entry is not None and entry[0]() is tensor

    def _remember(self, tensor: torch.Tensor, dtype: torch.dtype) -> None:
        """Mark ``tensor`` as read in ``dtype``; in the golden, every floating tensor made from
        the score is marked (``score.double()`` too), so that a later conversion to float32
        keeps its float64 (``score.double().float()`` is exact in flex_attention)."""
        if dtype != tensor.dtype or (self.keep_precision and tensor.is_floating_point()):
            self._traced[id(tensor)] = (weakref.ref(tensor), dtype)


def _narrowed(out, leaves) -> bool:
    """Whether ``out``, made from ``leaves`` (among them a float64 score's values) by an
    operation other than in place, has a float32 or 16-bit tensor: a conversion to float32
    (or an operation with a float32 dtype argument) that flex_attention's float32 scores make
    without rounding, or one to 16 bits by a name the dtype check does not see
    (``.type("torch.BFloat16Tensor")``), which the golden's float64 values would round."""
    outputs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    return (any(o.dtype in _WIDENED for o in outputs)
            and not any(o is leaf for o in outputs for leaf in leaves))


def _names_16_bits(func, args, kwargs) -> bool:
    """Whether a conversion names a 16-bit target: ``.half()``, a 16-bit dtype or type name,
    or a 16-bit tensor to take the dtype of (its source, ``args[0]``, aside). A tensor made from
    the score is float32 when eager runs, whatever its traced dtype (``score.type_as(score)``
    is the score itself), so a tensor's own dtype counts: a captured 16-bit table's, not a
    16-bit constant's that the golden made float64."""
    targets = pytree.tree_leaves((args[1:], kwargs))
    return (func in _NARROWING or _has_16_bits(targets)
            or any(isinstance(a, str) and a in _SIXTEEN_BIT_TYPE_NAMES for a in targets))


def _has_float32(leaves) -> bool:
    return any(isinstance(leaf, torch.Tensor) and leaf.dtype == torch.float32 for leaf in leaves)


def _in_place(func, kwargs) -> bool:
    """Whether ``func`` writes into a tensor it was given (``add_``, ``aten.add_.Tensor``,
    ``x += s``, ``out=``, ``inplace=True``)."""
    name = getattr(func, "__name__", "").split(".")[0]
    return ("out" in kwargs or kwargs.get("inplace") is True or name in _IN_PLACE_OPERATORS
            or (name.endswith("_") and not name.endswith("__")))


def _has_16_bits(leaves) -> bool:
    """Whether a 16-bit tensor or a 16-bit dtype is among ``leaves``."""
    return any(leaf.dtype in _SIXTEEN_BITS if isinstance(leaf, torch.Tensor)
               else isinstance(leaf, torch.dtype) and leaf in _SIXTEEN_BITS for leaf in leaves)


def traced_score_dtype(case: Case) -> torch.dtype:
    """The dtype flex_attention traces ``case``'s score mod with: its query's."""
    return TORCH_DTYPES[case.dtype]


def with_traced_dtype(score_mod: Callable, traced_dtype: torch.dtype | None,
                      score_dtype: torch.dtype):
    """(context, mod): ``score_mod`` to run on scores of ``score_dtype`` within the context so
    that it reads the score's dtype as ``traced_dtype`` (and, on float64 scores, keeps its
    16-bit and float32 arithmetic in float64); the mod itself and a context that does nothing
    where the two dtypes are the same, ``traced_dtype`` is None, or the mod is known to need
    neither."""
    keep_precision = score_dtype == torch.float64
    if (traced_dtype is None or traced_dtype == score_dtype
            or _untouched(score_mod, traced_dtype, keep_precision)):
        return nullcontext(), score_mod
    lens = ScoreDtypeAsTraced(score_mod, traced_dtype, keep_precision)
    return lens, lens.wrap()


def _untouched(score_mod: Callable, traced_dtype: torch.dtype, keep_precision: bool) -> bool:
    try:
        return (traced_dtype, keep_precision) in _UNTOUCHED.get(score_mod, ())
    except TypeError:  # not hashable, or not weakly referenceable
        return False
