"""The variant catalog: one constructor (data) and one builder (mods) per variant.

A constructor returns a ``Variant`` (name + parameters) and is what the matrix uses.
A builder turns that data into FlexAttention mods for one shape on one device:
``mask_mod(b, h, q_idx, kv_idx) -> bool`` and ``score_mod(score, b, h, q_idx, kv_idx)``,
where ``score`` is the already scaled ``q.k / sqrt(D)``. Each mod is a function of one point:
0-d tensors in, a 0-d tensor out. FlexAttention evaluates it batched with torch.vmap, and so
does the float64 golden (cases/pointwise.py); it need not be correct on broadcast grids.

Adding a variant is one edit in this file: a constructor, a builder with ``@builder``.
Never change what an existing name and its parameters compute: ids must keep their meaning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from cases import torch_state
from cases.model import Shape, Variant, id_part_problem

MaskMod = Callable[..., torch.Tensor]
ScoreMod = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Mods:
    """The callables of one variant on one shape.

    ``per_batch_head`` is deprecated and ignored: what the mask depends on (b, h) is read off
    the mask itself (cases.pointwise.mask_dependence), for the block mask and the memory
    estimate alike.
    """

    mask_mod: MaskMod | None
    score_mod: ScoreMod | None
    per_batch_head: bool = False

    def __post_init__(self) -> None:
        if self.per_batch_head:
            warnings.warn("Mods(per_batch_head=True) is deprecated and ignored: the suite "
                          "finds what the mask depends on by itself; drop the argument",
                          DeprecationWarning, stacklevel=3)


Builder = Callable[[Variant, Shape, torch.device], Mods]
_BUILDERS: dict[str, Builder] = {}


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register the builder of the variant called ``name``."""

    problem = id_part_problem(name)
    if problem:
        raise ValueError(f"variant name {name!r} {problem}")

    def register(fn: Builder) -> Builder:
        if name in _BUILDERS and _BUILDERS[name] is not fn:
            first = getattr(_BUILDERS[name], "__module__", None) or "another module"
            raise ValueError(f"variant {name!r} is defined twice (first by {first}); give "
                             "one of them another name")
        _BUILDERS[name] = fn
        return fn

    return register


def registered_variants() -> list[str]:
    return sorted(_BUILDERS)


def build_mods(variant: Variant, shape: Shape, device: torch.device | str = "cpu") -> Mods:
    """The mods of ``variant`` for ``shape``, with captured tensors on ``device``."""
    try:
        build = _BUILDERS[variant.name]
    except KeyError:
        raise ValueError(
            f"unknown variant {variant.name!r}; known: {', '.join(registered_variants())}"
            " (custom variants: pass --cases-module)"
        ) from None
    before = torch_state.snapshot()
    mods = build(variant, shape, torch.device(device))
    changed = torch_state.changes(before, torch_state.snapshot())
    if changed:  # the reference and the backend would each build under other settings
        torch_state.restore(before)
        raise ValueError(f"the builder of variant {variant.name!r} left torch's global "
                         f"settings changed: {'; '.join(changed)}; a builder sets back what it "
                         "changes (or sets them when its case module is imported, where they "
                         "hold for every case)")
    if not isinstance(mods, Mods):
        raise TypeError(f"the builder of variant {variant.name!r} returned "
                        f"{type(mods).__name__}; return cases.variants.Mods(mask_mod, score_mod) "
                        "(None for a mod it does not have)")
    return mods


@dataclass(frozen=True)
class ParamUse:
    """How a variant's builder used the parameters a case gives it (``param_use``)."""

    read: tuple[str, ...]  # the keys the builder asked for, in order
    missing: tuple[str, ...]  # the key whose absence failed the build (a KeyError it let out)
    unread: tuple[str, ...] | None  # given, not read at this shape (None: cannot tell)
    defaulted: tuple[str, ...] = ()  # asked for, absent, built on without: a default taken


def param_use(variant: Variant, shape: Shape) -> ParamUse:
    """Which of ``variant``'s parameters its builder reads, found by building its mods for
    ``shape`` on the meta device (no memory; no data) and calling them at one point, with a
    variant that records each ``param(key)``. The suite's own builders (the catalog's and the
    composed variants') are built on the CPU instead, as a worker builds every case it runs:
    any operation on meta tensors imports torch._dynamo, 1.8 s in every process that reads a
    case file, and nothing else the suite's own processes do needs it. A parameter is missing
    only when the KeyError of its absence is what failed the build (a builder may catch it: an
    optional parameter). A builder that reads ``params`` whole (or the token, or compares or
    hashes the variant), or that fails where it is built (on meta tensors: one that reads
    data), is not judged on what it leaves unread; a builder may also read a parameter at some
    shapes only (``unread`` is this shape's). ``defaulted``: the keys it asked for, did not
    get, and built on without (an optional parameter's default)."""
    from cases.pointwise import check_mods

    recorder = _ParamRecorder(variant.name, variant.params)
    build = _BUILDERS[variant.name]
    own = getattr(build, "__module__", None) in _OWN_MODULES
    device = torch.device("cpu" if own and max(shape.Sq, shape.Skv) <= _CPU_CHECK_MAX_LENGTH
                          else "meta")
    failure = None
    try:
        mods = build(recorder, shape, device)
        check_mods(mods.mask_mod, mods.score_mod, variant.name, device)
    except Exception as exc:  # noqa: BLE001 - the case's own builder; it runs for real later
        failure = exc
    reads = tuple(dict.fromkeys(object.__getattribute__(recorder, "_reads")))
    absent = object.__getattribute__(recorder, "_absent")  # (the KeyError raised, its key)
    missing = next((key for e in _causes(failure) for error, key in absent if e is error),
                   None)
    given = [key for key, _ in variant.params]
    judged = failure is None and not object.__getattribute__(recorder, "_read_whole")
    return ParamUse(reads, (missing,) if missing is not None else (),
                    tuple(k for k in given if k not in reads) if judged else None,
                    tuple(dict.fromkeys(key for _, key in absent if key != missing)))


#: The modules whose builders param_use builds on the CPU: the suite's own, whose captured
#: tables are per head, per bucket or per position.
_OWN_MODULES = (__name__, "cases.composed")
#: ... up to this sequence length (document's ids are 8 bytes a token): a longer one, most
#: likely a typo in a case file, is checked on meta, where nothing is allocated.
_CPU_CHECK_MAX_LENGTH = 1 << 20


def _causes(exc: BaseException | None):
    """``exc`` and what it was raised from: its ``cause`` (cases.pointwise.ModRaised) and
    ``__cause__``; not ``__context__``: an error raised while handling the KeyError of an
    optional parameter is not that KeyError's."""
    seen = set()
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        cause = getattr(exc, "cause", None)
        exc = cause if isinstance(cause, BaseException) else exc.__cause__


class _ParamRecorder(Variant):
    """A variant that notes the parameters read through ``param``, and any reading of
    ``params`` itself (then everything may have been read)."""

    def __init__(self, name, params):
        super().__init__(name, params)
        object.__setattr__(self, "_reads", [])
        object.__setattr__(self, "_absent", [])
        object.__setattr__(self, "_read_whole", False)

    def __getattribute__(self, attribute):
        if attribute == "params":
            object.__setattr__(self, "_read_whole", True)
        return object.__getattribute__(self, attribute)

    def __eq__(self, other):  # compares as the plain variant does (and may read it whole)
        return self._plain() == other

    def __hash__(self):
        return hash(self._plain())

    def _plain(self) -> Variant:
        object.__setattr__(self, "_read_whole", True)
        return Variant(self.name, object.__getattribute__(self, "params"))

    def param(self, key):
        object.__getattribute__(self, "_reads").append(key)
        for k, v in object.__getattribute__(self, "params"):
            if k == key:
                return v
        error = KeyError(f"variant {self.name!r} has no parameter {key!r}")
        object.__getattribute__(self, "_absent").append((error, key))
        raise error


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


# --- 1. full ---------------------------------------------------------------------------
def full() -> Variant:
    """Plain softmax attention: every query sees every key, no score change."""
    return Variant("full")


@builder("full")
def _build_full(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    return Mods(None, None)


# --- 2. causal -------------------------------------------------------------------------
def causal() -> Variant:
    """Causal: query i sees key j iff j <= i (itself included: i + 1 keys)."""
    return Variant("causal")


@builder("causal")
def _build_causal(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    return Mods(_causal, None)


# --- 3. sliding_window -----------------------------------------------------------------
def sliding_window(window: int) -> Variant:
    """Causal look-back window: query i sees key j iff i - window < j <= i, i.e.
    0 <= i - j < window: ``window`` keys, itself included (fewer for the first window - 1
    queries). attention-gym's ``sliding_window`` (``q - kv <= window``) sees window + 1."""
    return Variant("sliding_window", (("w", window),))


@builder("sliding_window")
def _build_sliding_window(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    window = int(variant.param("w"))

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return Mods(sliding_window_mask, None)


# --- 4. prefix_lm ----------------------------------------------------------------------
def prefix_lm(prefix: int) -> Variant:
    """Prefix LM: query i sees key j iff j < prefix (the first ``prefix`` keys, seen by every
    query, so the prefix is bidirectional) or j <= i (causal)."""
    return Variant("prefix_lm", (("p", prefix),))


@builder("prefix_lm")
def _build_prefix_lm(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    prefix = int(variant.param("p"))

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (kv_idx <= q_idx)

    return Mods(prefix_lm_mask, None)


# --- 5. document -----------------------------------------------------------------------
#: Relative document lengths, in units of S/64; they sum to 64, so the documents tile the
#: sequence exactly, and none starts on a 128-token block boundary past the first.
DOCUMENT_LENGTH_PATTERN = (5, 11, 3, 17, 8, 13, 7)


def document() -> Variant:
    """Packed documents, causal within each document, none across: query i sees key j iff
    doc(i) == doc(j) and j <= i.

    Document lengths are ``DOCUMENT_LENGTH_PATTERN`` x (S // 64), the last one taking the
    remainder (for S=1024: 80, 176, 48, 272, 128, 208, 112); for S < 64, one document. The
    document id of every token is held in a captured tensor. Needs Sq == Skv.
    """
    return Variant("document")


def document_lengths(seq_len: int) -> list[int]:
    """Lengths of the packed documents of a sequence of ``seq_len`` tokens (sum = seq_len)."""
    unit = seq_len // sum(DOCUMENT_LENGTH_PATTERN)
    lengths = [n * unit for n in DOCUMENT_LENGTH_PATTERN] if unit else [seq_len]
    lengths[-1] += seq_len - sum(lengths)
    return lengths


@builder("document")
def _build_document(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    if shape.Sq != shape.Skv:
        raise ValueError(f"document masking needs Sq == Skv, got {shape.Sq} and {shape.Skv}")
    lengths = document_lengths(shape.Skv)
    doc_ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device),
        torch.tensor(lengths, device=device),
    )

    def document_causal_mask(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (kv_idx <= q_idx)

    return Mods(document_causal_mask, None)


# --- 6. alibi --------------------------------------------------------------------------
def alibi() -> Variant:
    """Causal plus ALiBi: score + slope_h * (j - i) with slope_h = 2^(-8 (h+1) / H), h the
    query head (0-based) and H the number of query heads. The slopes are a float32 tensor, so
    slope_h * (j - i) is a float32 product, then added to the score."""
    return Variant("alibi")


def alibi_slopes(num_heads: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]


@builder("alibi")
def _build_alibi(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    slopes = torch.tensor(alibi_slopes(shape.Hq), dtype=torch.float32, device=device)

    def alibi_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return Mods(_causal, alibi_bias)


# --- 7. softcap ------------------------------------------------------------------------
def softcap(cap: float) -> Variant:
    """Causal plus tanh soft-capping of the scaled scores: score -> cap * tanh(score / cap)."""
    return Variant("softcap", (("cap", cap),))


@builder("softcap")
def _build_softcap(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    cap = float(variant.param("cap"))

    def tanh_softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return Mods(_causal, tanh_softcap)


# --- 8. rel_bias -----------------------------------------------------------------------
#: Seed of the deterministic "learned" bias table (fixed: it is part of the variant's meaning).
REL_BIAS_TABLE_SEED = 20240917


def rel_bias(num_buckets: int) -> Variant:
    """Causal plus a learned relative-position bias per head, T5 style.

    score + table[h, bucket(|i - j|)], with e = num_buckets // 2: a distance d < e has bucket
    d; a longer one has bucket min(e + 2k + u, num_buckets - 1), where k = bitlen(d) - bitlen(e)
    counts its doublings past e and u = 1 in the upper half of its octave (d >= 3 *
    2^(bitlen(d) - 2)), else 0. For a power-of-two e: two buckets per octave, [e 2^k, 1.5 e 2^k)
    and [1.5 e 2^k, e 2^(k+1)). (T5's own buckets spread log-spaced up to a max distance
    instead, and are directional.) ``table`` is a deterministic float32 N(0, 1) [Hq,
    num_buckets] tensor (``REL_BIAS_TABLE_SEED``); the bucket of each distance is a captured
    lookup tensor.
    """
    return Variant("rel_bias", (("nb", num_buckets),))


def relative_buckets(max_distance: int, num_buckets: int) -> list[int]:
    """Bucket of every distance 0..max_distance-1 (exact below nb/2, log2-spaced above)."""
    exact = num_buckets // 2
    buckets = []
    for d in range(max_distance):
        if d < exact:
            buckets.append(d)
            continue
        octave = d.bit_length() - exact.bit_length()  # how many doublings past `exact`
        half = 1 if 4 * d >= (3 << d.bit_length()) else 0  # d >= 1.5 * 2^(bitlen - 1)
        buckets.append(min(exact + 2 * octave + half, num_buckets - 1))
    return buckets


@builder("rel_bias")
def _build_rel_bias(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    num_buckets = int(variant.param("nb"))
    if num_buckets < 1:
        raise ValueError(f"rel_bias needs nb >= 1 buckets, got {num_buckets}")
    gen = torch.Generator().manual_seed(REL_BIAS_TABLE_SEED)
    table = torch.randn(shape.Hq, num_buckets, generator=gen).to(device)
    max_distance = max(shape.Sq, shape.Skv)
    bucket_of = torch.tensor(relative_buckets(max_distance, num_buckets), device=device)

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + table[h, bucket_of[(q_idx - kv_idx).abs()]]

    return Mods(_causal, relative_bias)


# --- padded_causal (extended matrix: fully masked rows) -------------------------------------
def padded_causal(valid: int) -> Variant:
    """Causal over the first ``valid`` tokens; the rest is padding: query i sees key j iff
    i < valid and j <= i. Padded keys (j >= valid) are never seen and padded queries see
    nothing: their rows are fully masked (output 0, lse -inf)."""
    return Variant("padded_causal", (("v", valid),))


@builder("padded_causal")
def _build_padded_causal(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    valid = int(variant.param("v"))

    def padded_causal_mask(b, h, q_idx, kv_idx):
        return (q_idx < valid) & (kv_idx <= q_idx)

    return Mods(padded_causal_mask, None)


# --- activation_gelu (extended matrix: an activation in place of softmax) -----------------------
def activation_gelu() -> Variant:
    """attention-gym's activation attention with its defaults: score -> log(gelu(score) + 1),
    so the softmax weighs each key by gelu(score) + 1 (attention-gym recovers gelu(S) V from
    the output and the lse); no mask. gelu is ``torch.nn.functional.gelu`` (the erf form), whose
    decomposition computes a 16-bit score in float32 and rounds back: docs/findings.md,
    finding 13, is why it is in the extended matrix."""
    return Variant("activation_gelu")


@builder("activation_gelu")
def _build_activation_gelu(variant: Variant, shape: Shape, device: torch.device) -> Mods:
    def gelu_activation(score, b, h, q_idx, kv_idx):
        return torch.log(torch.nn.functional.gelu(score) + 1.0)

    return Mods(None, gelu_activation)


# --- composed (masks with and/or/not, score chains; what the fuzzer draws) ------------------
from cases import composed as _composed  # noqa: E402,F401  (registers its builder)
