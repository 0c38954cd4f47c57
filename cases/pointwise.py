"""How a mod is read: point by point, as flex_attention reads it.

flex_attention defines ``mask_mod(b, h, q_idx, kv_idx)`` and ``score_mod(score, b, h, q_idx,
kv_idx)`` as functions of 0-d tensors, one point of the [B, H, Sq, Skv] grid at a time, and
evaluates them batched with four nested ``torch.vmap`` (kv_idx innermost, then q_idx, h, b;
``_vmap_for_bhqkv`` in torch/nn/attention/flex_attention.py) under ``TransformGetItemToIndex``,
its rule that ``table[idx]`` with tensor indices is ``aten.index`` (not a Python int index;
``IndexAsAten`` below applies the same rule).
Everything here evaluates mods exactly that way, on any sub-grid: vmap applies the mod to each
point of the grid it is given, so the values on a sub-grid are the values at those points.

A mod that is correct point by point need not be correct on broadcast index grids
(``table[b, q_idx] == table[b, kv_idx]``, ``torch.where`` on shapes that only line up for
scalars, a sum over an indexed slice): calling it once on broadcast grids can build another
mask, or raise. A mod that vmap cannot run (``.item()``, ``int()``, a Python ``if`` on a tensor
value) is rejected by flex_attention too; ``check_mods`` says so in one line. A mod that
catches exceptions to choose what it computes (``try: 1 // b ... except: ...``) is not a
function of its point: vmap raises for the whole grid it is given, so eager flex_attention (one
grid) and the golden (chunk by chunk) can take different branches, and so can
``mask_dependence``'s two-point grid; such mods are outside these semantics.

vmap runs an operation that has no batching rule (``clamp_``, ``special.log_ndtr``) once per
point, in a loop: the same values, but about 10^4 times slower, so the golden of a mod with
``score.float().clamp_(-c, c)`` on a gating case would take hours. The evaluations here run
with that fallback off, and ``IndexAsAten`` takes each operation it refuses, where the mod
called it: an in-place one as its out-of-place twin on a copy, copied back (batched; the same
values), any other with the fallback on for that call alone (per point, as vmap runs it). An
evaluation is not started again (a mod that changed its score in place before the operation
would see the change twice), except where an operation the mode never sees met the fallback
off (``Tensor.set_``, code under ``DisableTorchFunction``).
"""
from __future__ import annotations

import inspect
import threading
import types
from functools import cache
from typing import Callable, TypeVar

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from cases.score_dtype import with_traced_dtype
from cases.vmap_fallback import (FALLBACK_OFF, FALLBACK_SWITCH, fallback_refused_in,
                                 without_batching_rule)

T = TypeVar("T")

#: The index arguments of a mod, in flex_attention's order (vmapped outermost first).
INDEX_NAMES = ("b", "h", "q_idx", "kv_idx")

_HOW_TO_WRITE = ("write it as tensor code on 0-d tensors: torch.where(...) instead of a Python "
                 "if/and/or on a tensor value, no .item(), int() or bool(); flex_attention "
                 "applies the same rule")


class PointwiseModError(ValueError):
    """A mod that cannot be evaluated point by point (under torch.vmap)."""


class MaskNotBool(TypeError):
    """A mask_mod that returned another dtype than bool."""

    def __init__(self, dtype: torch.dtype):
        super().__init__(f"mask_mod returned {dtype}; a mask_mod returns a bool tensor")
        self.dtype = dtype


class ModRaised(PointwiseModError):
    """A mod raised while evaluated point by point, from inside its own call: mostly the
    case's fault (an index out of its captured table's bounds at some points, a ValueError of
    its own), which flex_attention meets as well; ``cause`` is what it raised. Running out of
    memory is never counted as the mod's, nor is what the suite's own code raises around it."""

    def __init__(self, mod_name: str, cause: Exception):
        text = str(cause).strip().splitlines()
        super().__init__(f"its {mod_name} raised {type(cause).__name__}"
                         + (f": {text[0]}" if text else ""))
        self.mod_name, self.cause = mod_name, cause


def _raising_as_the_mod(mod: Callable, mod_name: str) -> Callable:
    """``mod``, with what its own call raises as ModRaised (running out of memory stays what
    it is; the BaseException ``_SuiteError`` passes, as any non-Exception)."""
    from records.errors import is_out_of_memory

    def call(*args):
        try:
            return mod(*args)
        except ModRaised:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's mod: say which raised what
            if is_out_of_memory(exc):
                raise
            raise ModRaised(mod_name, exc) from exc
    return call


#: The running torch's rule for int indices (``_rule_takes_ints``), once a mod has needed it;
#: None until then: asking imports all of torch._dynamo (0.85-2.4 s), which the mods that
#: index only with tensors, or not at all, never need.
_takes_ints: bool | None = None


class _SuiteError(BaseException):
    """What the suite's own code raised from inside a mod's call (asking torch's indexing
    rule): a BaseException, so that neither the mod's ``except Exception`` nor ModRaised takes
    it for the mod's; the mode keeps it too, for a mod whose bare ``except:`` caught it."""

    def __init__(self, cause: Exception):
        super().__init__(cause)
        self.cause = cause


class IndexAsAten(TorchFunctionMode):
    """flex_attention's indexing rule, ``TransformGetItemToIndex`` (torch/_dynamo/
    _trace_wrapped_higher_order_op.py): ``table[i, j]`` whose indices are all tensors is
    ``aten.index(table, [i, j])``; so are ints among them (as 0-d int64 tensors) where the
    running torch's rule takes them (``_rule_takes_ints``); any other ``__getitem__`` (a slice,
    None, ...) is Python's. The two differ, for example, on a list of ints: ``table[[1, 2]]``
    is ``table[1, 2]`` under the rule that takes ints. Entered through
    ``_under_flex_indexing``, which learns that rule when an index first needs it.

    torch calls that ``aten.index`` through an autograd.Function (``ModIndex``, whose forward is
    exactly it, and whose backward is the scatter-add that aten.index's own derivative is) with
    a generated vmap rule, which torch builds again at every call: 1.4 ms per evaluation of a
    mod that indexes, more than the arithmetic of a score mod on [8, 96, 4096] scores. Calling
    ``aten.index`` directly gives the same values, and the same gradients through a table that
    does not depend on the score, which is what every mod of the suite indexes
    (tests/test_pointwise_mods.py compares both rules on mods that index in each way). Through
    a tensor made from the score (``torch.stack([s, -s])[h % 2]``) torch's generated rule gives
    other gradients; ours gives the analytic ones (tested).
    """

    def __init__(self):
        super().__init__()
        self.suite_error: Exception | None = None  # raised as _SuiteError, even if swallowed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__:
            table, indices = args[0], pytree.tree_leaves(args[1])
            if all(isinstance(i, torch.Tensor) for i in indices):
                return torch.ops.aten.index(table, indices)
            if all(isinstance(i, (torch.Tensor, int)) for i in indices) and self._takes_ints():
                return torch.ops.aten.index(table, [
                    torch.tensor(i, dtype=torch.int64, device=table.device)
                    if isinstance(i, int) else i for i in indices])
        try:
            return func(*args, **kwargs)
        except RuntimeError as exc:
            if FALLBACK_OFF not in str(exc):
                raise
        return without_batching_rule(func, args, kwargs)

    def _takes_ints(self) -> bool:
        """The running torch's rule for int indices, asked where a mod first needs it."""
        global _takes_ints
        if _takes_ints is None:
            try:
                _takes_ints = _rule_takes_ints()
            except Exception as exc:  # noqa: BLE001 - the suite's failure, not the mod's
                self.suite_error = exc
                raise _SuiteError(exc) from exc
        return _takes_ints


#: .depth: an evaluation inside another keeps the outer one's fallback switch
_nesting = threading.local()


def _under_flex_indexing(evaluate: Callable[[], T]) -> T:
    """``evaluate()`` (which builds its vmaps with ``_vmap_bhqkv``) under IndexAsAten, with
    vmap's per-point fallback off but for the operations that need it (module docstring). The
    suite's own failure inside a mod's call (``_SuiteError``) is raised as itself, even where
    the mod's bare ``except:`` caught it and returned what its except branch computes."""
    from torch._C import _functorch

    if getattr(_nesting, "depth", 0):
        return _indexed(evaluate)
    with FALLBACK_SWITCH:
        fallback_was = _functorch._is_vmap_fallback_enabled()
        _nesting.depth = 1
        try:
            _functorch._set_vmap_fallback_enabled(False)
            try:
                return _indexed(evaluate)
            except Exception as exc:
                if not fallback_refused_in(exc):
                    raise
            # An operation the mode never sees (Tensor.set_, code under DisableTorchFunction)
            # met the fallback off: the evaluation again with it on, as vmap runs it. Only
            # there is an evaluation started again (a change the mod made in place before it
            # is made twice; a mod that catches that refusal takes its except branch).
            _functorch._set_vmap_fallback_enabled(True)
            return _indexed(evaluate)
        finally:
            _nesting.depth = 0
            _functorch._set_vmap_fallback_enabled(fallback_was)


def _indexed(evaluate: Callable[[], T]) -> T:
    mode = IndexAsAten()
    try:
        with mode:
            result = evaluate()
    except _SuiteError as exc:
        raise exc.cause from None
    # torch's own rule, which tests put in IndexAsAten's place, keeps no suite_error
    if getattr(mode, "suite_error", None) is not None:
        raise mode.suite_error
    return result


@cache
def _rule_takes_ints() -> bool:
    """Whether the running torch's TransformGetItemToIndex takes int indices (newer releases:
    ``t[1]`` is then aten.index, a new tensor) or leaves them to Python (older ones: a view).
    A rule that cannot take the probe at all counts as the newer one. Asked only when a mod
    first indexes with ints (``IndexAsAten._takes_ints``): the rule's module imports all of
    torch._dynamo (0.85-2.4 s here), which PyTorch's own golden imports on its first call,
    and which the catalog's mods, a process that evaluates none (the CLI, a run's controller
    whose goldens the cache serves) and the golden's first call do not need."""
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    try:
        with TransformGetItemToIndex():
            return not torch.arange(3)[1]._is_view()
    except Exception:  # noqa: BLE001 - a torch whose rule refuses a plain int index
        return True



def evaluate_mask(mask_mod: Callable, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                  kv_idx: torch.Tensor) -> torch.Tensor:
    """``mask_mod`` at every point of the grid b x h x q_idx x kv_idx (1-d index tensors):
    a bool tensor [len(b), len(h), len(q_idx), len(kv_idx)]. Dimensions the mask does not
    depend on come back expanded (stride 0, no copy)."""
    mod = _raising_as_the_mod(mask_mod, "mask_mod")
    mask = _under_flex_indexing(lambda: _vmap_bhqkv(mod, score=False)(b, h, q_idx, kv_idx))
    if mask.dtype != torch.bool:
        raise MaskNotBool(mask.dtype)
    return mask


def evaluate_score(score_mod: Callable, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor,
                   q_idx: torch.Tensor, kv_idx: torch.Tensor,
                   traced_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``score_mod`` at every point of the grid: ``score`` is [len(b), len(h), len(q_idx),
    len(kv_idx)], each point's score in the same place; the result has that shape too. With
    ``traced_dtype`` (the query's dtype, as flex_attention traces the mod), the score's dtype
    reads as that (cases/score_dtype.py)."""
    def evaluate():
        lens, mod = with_traced_dtype(score_mod, traced_dtype, score.dtype)
        with lens:
            return _vmap_bhqkv(_raising_as_the_mod(mod, "score_mod"), score=True)(
                score, b, h, q_idx, kv_idx)
    return _under_flex_indexing(evaluate)


def _vmap_bhqkv(fn: Callable, score: bool) -> Callable:
    """``fn`` vmapped over b, h, q_idx and kv_idx as flex_attention does (kv_idx innermost);
    the score, when there is one, is mapped at every level."""
    prefix = (0,) if score else ()
    for level in reversed(range(len(INDEX_NAMES))):  # kv_idx first: the innermost vmap
        dims = tuple(0 if i == level else None for i in range(len(INDEX_NAMES)))
        fn = torch.vmap(fn, in_dims=prefix + dims)
    return fn


def check_mods(mask_mod: Callable | None, score_mod: Callable | None, variant: str,
               device: torch.device | str = "cpu",
               traced_dtype: torch.dtype | None = None) -> None:
    """Raise PointwiseModError (one line: the variant, the reason, how to write it) when a mod
    cannot be evaluated point by point, or returns something else than a scalar per point
    (a bool one for the mask). Runs each mod on a one-point grid (all indices 0), the score
    mod on a float64 score whose dtype reads as ``traced_dtype`` (``evaluate_score``)."""
    point = torch.zeros(1, dtype=torch.int64, device=device)
    refused = None if mask_mod is None else _block_mask_refusal(mask_mod)
    if refused:
        raise PointwiseModError(f"variant {variant!r}: its mask_mod {refused}")
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is None:
            continue
        try:
            if name == "mask_mod":
                out = evaluate_mask(mod, point, point, point, point)
            else:
                score = torch.zeros(1, 1, 1, 1, dtype=torch.float64, device=device)
                out = evaluate_score(mod, score, point, point, point, point, traced_dtype)
            if not isinstance(out, torch.Tensor) or out.shape != (1, 1, 1, 1):
                raise TypeError(f"it returned {_shape_of(out)} per point, not a 0-d tensor")
        except Exception as exc:  # noqa: BLE001 - the user's mod: say which and why
            raise PointwiseModError(f"variant {variant!r}: its {name} "
                                    + _why_not_pointwise(name, mod, exc)) from exc


#: Points of the grid ``score_mod_raises`` evaluates at most (2**26: about a second), and at
#: most at once (32 MiB of float64 scores).
SCORE_CHECK_POINTS = 2 ** 26
SCORE_CHECK_CHUNK = 2 ** 22


def score_mod_raises(score_mod: Callable, shape, traced_dtype: torch.dtype | None = None,
                     max_points: int = SCORE_CHECK_POINTS) -> ModRaised | None:
    """What ``score_mod`` raises from its own call somewhere on the grid (ModRaised), or None.

    Eager flex_attention applies the score mod to the whole score matrix, masked points
    included, before it masks (a compiled one skips fully masked blocks only), while the
    golden evaluates it only on the keys each chunk's mask keeps: a captured table indexed out
    of bounds only where the mask hides meets flex_attention's error, not the golden's. This
    looks for it, on a score of zeros: first every (q_idx, kv_idx) at b = h = 0, then every
    point, in row chunks, up to ``max_points`` (what lies beyond is not looked at). Any other
    failure (memory, vmap) is not the mod's own: None."""
    b_all, h_all = torch.arange(shape.B), torch.arange(shape.Hq)
    kv_idx = torch.arange(shape.Skv)
    budget = max_points
    for b, h in ((b_all[:1], h_all[:1]), (b_all, h_all)):
        per_row = len(b) * len(h) * shape.Skv
        rows = max(1, SCORE_CHECK_CHUNK // per_row)
        for start in range(0, shape.Sq, rows):
            q_idx = torch.arange(start, min(start + rows, shape.Sq))
            if budget < per_row * len(q_idx):
                return None
            budget -= per_row * len(q_idx)
            score = torch.zeros(len(b), len(h), len(q_idx), shape.Skv, dtype=torch.float64)
            try:
                evaluate_score(score_mod, score, b, h, q_idx, kv_idx, traced_dtype)
            except ModRaised as exc:  # vmap's limits are check_mods's to tell, at point 0
                return None if "vmap" in str(exc.cause).lower() else exc
            except Exception:  # noqa: BLE001 - not the mod's own error: nothing to say
                return None
    return None


def _block_mask_refusal(mask_mod: Callable) -> str | None:
    """Why flex_attention's ``create_block_mask`` refuses ``mask_mod`` before it calls it, and
    the fix; None when it takes it. It tells a mask_mod from a score_mod by its positional
    parameters, counted from its code (``__code__.co_argcount`` less its defaults), else from
    its signature, and needs 4: a bound method counts its self, a ``*args`` wrapper (a
    decorator's) counts none, an ``nn.Module``'s call counts its ``*args, **kwargs``. Asked of
    torch's own rule where it has one (``_get_mod_type``). A mod that cannot take the four
    arguments at all is left to the evaluation, whose message names its parameters."""
    if _parameters(mask_mod) is not None and not _can_take(mask_mod, len(INDEX_NAMES)):
        return None
    if _takes_four_plain_parameters(mask_mod):  # torch's rule takes it, unasked: importing
        return None  # flex_attention imports sympy in torch 2.14 (0.9 s in every worker)
    try:
        from torch.nn.attention.flex_attention import _get_mod_type, _ModificationType
    except ImportError:  # a torch without the private helper: nothing to ask
        return None
    try:
        kind = _get_mod_type(mask_mod)
    except (AssertionError, TypeError, ValueError) as exc:
        counted = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    else:
        if kind == _ModificationType.MASK_MOD:
            return None
        counted = "counted 5 positional parameters, a score_mod's"
    name = getattr(mask_mod, "__qualname__", type(mask_mod).__name__)
    return (f"{name} is refused by flex_attention's create_block_mask ({counted}): it "
            "counts a mask_mod's positional parameters from its code and needs exactly 4; pass "
            "a plain function, e.g. lambda b, h, q_idx, kv_idx: mod(b, h, q_idx, kv_idx)")


def _takes_four_plain_parameters(mod: Callable) -> bool:
    """Whether ``mod`` is a plain function of exactly 4 parameters, all positional, none with
    a default: no ``*args``, ``**kwargs`` or keyword-only ones, nothing that says another
    signature (``__wrapped__``, ``__signature__``). Both of torch's rules take it as a
    mask_mod: 2.13 and 2.14 count ``__code__``'s positional parameters less their defaults,
    2.6 to 2.9 the parameters of ``inspect.signature`` without a default, which counts
    ``*args`` and ``**kwargs`` too and follows ``__wrapped__`` (an outside review)."""
    if not isinstance(mod, types.FunctionType) or hasattr(mod, "__wrapped__") \
            or hasattr(mod, "__signature__"):
        return False
    code = mod.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        return False
    return code.co_argcount == len(INDEX_NAMES) and not mod.__defaults__


def _why_not_pointwise(name: str, mod: Callable, exc: Exception) -> str:
    """Why ``mod`` failed on the one-point grid, and the fix that applies: its signature, an
    error of its own, or a construct vmap (and so flex_attention) cannot run."""
    if isinstance(exc, MaskNotBool):
        return (f"returned a {exc.dtype} tensor, and flex_attention needs a bool one per "
                "point; return a comparison (or .bool() of the value)")
    arguments = ("score", *INDEX_NAMES) if name == "score_mod" else INDEX_NAMES
    takes = _parameters(mod)
    if takes is not None and not _can_take(mod, len(arguments)):
        return (f"takes ({', '.join(takes)}), and flex_attention calls {name}"
                f"({', '.join(arguments)}); give it those {len(arguments)} arguments")
    cause = exc.cause if isinstance(exc, ModRaised) else exc
    text = str(cause).strip().splitlines()
    reason = f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
    if isinstance(exc, ModRaised) and "vmap" not in reason.lower():
        widened = (" (on a float64 score that reads as the query's dtype: a bit-level view of "
                   "the score is beyond the suite's reference)") \
            if name == "score_mod" and _about_dtypes(reason) else ""
        where = (" (it applies the score mod at every point, masked or not)"
                 if name == "score_mod" else "")
        return (f"raised {reason} at the point b = h = q_idx = kv_idx = 0, where eager "
                f"flex_attention calls it too{where}{widened}; fix the mod")
    return f"cannot be evaluated point by point under torch.vmap ({reason}); {_HOW_TO_WRITE}"


def _about_dtypes(reason: str) -> bool:
    """Whether an error's text is about dtypes or views (a bit-level view of the score), not
    an index or a value of the mod's own."""
    text = reason.lower()
    return any(word in text for word in ("dtype", "view", "float64", "double"))


def _parameters(mod: Callable) -> list[str] | None:
    import inspect

    try:
        return list(inspect.signature(mod).parameters)
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return None


def _can_take(mod: Callable, count: int) -> bool:
    import inspect

    try:
        inspect.signature(mod).bind(*range(count))
    except TypeError:
        return False
    return True


def _shape_of(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"shape {tuple(out.shape[4:])}"
    return f"a {type(out).__name__}"


def mask_dependence(mask_mod: Callable, device: torch.device | str = "cpu") -> frozenset[str]:
    """The index arguments (``INDEX_NAMES``) the value of ``mask_mod`` depends on (its
    captured tensors on ``device``).

    Why it is exact: the mask is evaluated as every mask is (``evaluate_mask``: four nested
    vmaps, flex_attention's indexing rule) on a grid of two points in each dimension. vmap
    carries a dimension only through the operations that read it, and returns a result that
    none of them reached expanded along it: stride 0, one value for every point. Nothing else
    brings a dimension in, and nothing depends on which points the grid holds: vmap refuses a
    mod whose Python code branches on, or converts, an index's value, so the same operations
    run on any grid. The converse need not hold (``q_idx * 0`` counts as a dependence): the
    answer errs only towards more dimensions, which costs memory, never correctness. A mask
    that vmap cannot evaluate counts as depending on everything, for the same reason. (No
    trace with make_fx: its fake tensors import all of torch._dynamo, 0.95 s of a golden's
    first call here, and the vmaps are what the golden evaluates anyway.)
    """
    two_points = torch.zeros(2, dtype=torch.int64, device=device)
    try:
        mask = evaluate_mask(mask_mod, two_points, two_points, two_points, two_points)
    except Exception:  # noqa: BLE001 - not evaluable: assume the worst (see above)
        return frozenset(INDEX_NAMES)
    if mask.dim() != len(INDEX_NAMES):  # not one value a point: check_mods says so
        return frozenset(INDEX_NAMES)
    return frozenset(name for name, stride in zip(INDEX_NAMES, mask.stride()) if stride != 0)
