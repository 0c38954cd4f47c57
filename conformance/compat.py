"""What differs in the flex_attention API between the torch versions the suite supports.

The suite supports torch >= 2.6 (the first release with compiled flex_attention on the CPU)
up to the newest. What changed, and how each difference is handled here:

- The log-sum-exp: ``return_lse=True`` until 2.8; from 2.9 ``return_aux=AuxRequest(lse=True)``
  returns ``(out, AuxOutput)`` and ``return_lse`` is deprecated (a FutureWarning, announced for
  removal). ``attention`` asks for it the way the running torch prefers.
- ``create_block_mask``'s ``device`` defaulted to ``"cuda"`` in 2.6 and to ``None`` later,
  and its keyword set grew (``separate_full_blocks``, ...). ``block_mask`` always passes the
  device and refuses, in one line, a keyword the running torch lacks.
- The device check: upstream rejects devices outside a fixed list (CUDA or CPU in 2.6; CUDA,
  CPU, HPU (and later XPU, MPS) since) with a ValueError before any kernel runs. Under
  ``torch.compile`` Dynamo re-raises it wrapped (2.13: ``Unsupported: Observed exception``),
  so ``validate_device`` runs upstream's own check eagerly first, and
  ``unsupported_device_message`` recovers upstream's exact sentence from a wrapped error.

Functions take the torch functions as optional arguments so tests can check both API
generations with stand-ins of the older signatures.
"""
from __future__ import annotations

import inspect
import logging
import re
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

MIN_TORCH = (2, 6)
#: The start of upstream's device rejection, identical in every supported version.
UNSUPPORTED_DEVICE_PREFIX = "FlexAttention is only supported on"
_UNSUPPORTED_DEVICE_RE = re.compile(
    re.escape(UNSUPPORTED_DEVICE_PREFIX) + r"[^'\"\n]*?devices\.(?: Found input tensors on \S+ device\.)?")


def torch_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` (default: the running torch), e.g. '2.13.0+cpu' -> (2, 13)."""
    if text is None:
        import torch

        text = torch.__version__
    m = re.match(r"(\d+)\.(\d+)", str(text))
    if not m:
        raise ValueError(f"cannot read a torch version from {text!r}; expected like '2.13.0'")
    return int(m.group(1)), int(m.group(2))


def require_supported_torch(text: str | None = None) -> None:
    """Raise RuntimeError (one line) when the running torch is older than the suite supports."""
    version = torch_version(text)
    if version < MIN_TORCH:
        raise RuntimeError(
            f"torch {text or _running_torch()} is too old for this suite (flex_attention needs "
            f">= {MIN_TORCH[0]}.{MIN_TORCH[1]}); install torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}")


@dataclass(frozen=True)
class FlexApi:
    """How one torch version's flex_attention hands back the log-sum-exp."""

    lse_via_aux: bool  # return_aux=AuxRequest(lse=True) exists (torch >= 2.9)
    lse_via_flag: bool  # return_lse=True exists (deprecated from 2.9)


def flex_api(flex_attention: Callable | None = None) -> FlexApi:
    """The API of ``flex_attention`` (default: the running torch's, computed once)."""
    if flex_attention is None:
        return _running_api()
    params = inspect.signature(flex_attention).parameters
    return FlexApi(lse_via_aux="return_aux" in params, lse_via_flag="return_lse" in params)


@lru_cache(maxsize=1)
def _running_api() -> FlexApi:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_api(flex_attention)


def attention(fn: Callable, q, k, v, score_mod=None, block_mask=None, *, enable_gqa: bool = False,
              return_lse: bool = False, api: FlexApi | None = None) -> Any:
    """Call ``fn`` (flex_attention or a compiled flex_attention): the output, or
    ``(output, lse)`` when ``return_lse``, whichever way the running torch returns the lse.
    ``api`` describes ``fn``'s torch (default: the running one)."""
    api = api or flex_api()
    kwargs: dict[str, Any] = {"score_mod": score_mod, "block_mask": block_mask}
    if enable_gqa:
        kwargs["enable_gqa"] = True
    if not return_lse:
        return fn(q, k, v, **kwargs)
    if api.lse_via_aux:
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = fn(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        return out, aux.lse
    if api.lse_via_flag:
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
        return out, lse
    raise RuntimeError(f"this torch ({_running_torch()}) offers neither return_aux nor return_lse "
                       "on flex_attention; report it with `python -m torch.utils.collect_env`")


def block_mask(mask_mod: Callable, B: int | None, H: int | None, q_len: int, kv_len: int,
               device: str, *, create: Callable | None = None, **options: Any):
    """``create_block_mask`` (or ``create``, a stand-in) with the device always given (its
    default changed from 'cuda' to None after 2.6); every keyword in ``options`` (e.g.
    BLOCK_SIZE) must exist in the running version, else a one-line TypeError."""
    if create is None:
        from torch.nn.attention.flex_attention import create_block_mask as create
    unknown = sorted(set(options) - set(inspect.signature(create).parameters))
    if unknown:
        raise TypeError(f"create_block_mask of torch {_running_torch()} has no parameter "
                        f"{unknown[0]!r}; drop it or upgrade torch")
    return create(mask_mod, B, H, q_len, kv_len, device=device, **options)


def validate_device(q, k, v) -> None:
    """Run upstream's own device check eagerly (the exact ValueError it raises for a device
    it does not support); nothing when this torch has no such check."""
    from torch.nn.attention import flex_attention as module

    check = getattr(module, "_validate_device", None)
    if check is not None:
        check(q, k, v)


#: Upstream flex_attention's own sentences declaring something unsupported, matched whole:
#: its device check, backward on the CPU or MPS, the lse of compiled CPU flex_attention.
UNSUPPORTED_SENTENCES = (
    _UNSUPPORTED_DEVICE_RE,
    re.compile(r"FlexAttention does not support backward on (?:CPU|MPS)\. Please set the input "
               r"requires_grad to False or use another device\."),
    re.compile(r"torch\.compile on CPU only supports inference and `return_lse` is not "
               r"supported yet\."),
)


#: What CPU flex_attention refuses in every torch from MIN_TORCH to NEWEST_CHECKED_TORCH, in
#: upstream's words (matched by UNSUPPORTED_SENTENCES): backends declare these before running
#: (``unsupported_reason``), so the fuzzer never spends an example on them. A newer torch runs
#: the case, and its own error (or its success) decides. 2.14.1 refuses both with these
#: sentences (its eager and compiled backward, and Inductor's CPU template with the
#: log-sum-exp: the extended matrix's 17 such cases at smoke sizes, 2026-12-07), and so does
#: 2.15.0 (its eager and compiled backward and compiled log-sum-exp raised each, 2026-12-07).
#: The tests also pin, up to this release, which releases refuse a score mod that changes its
#: score in place (tests/test_vmap_fallback.py).
NEWEST_CHECKED_TORCH = (2, 15)
CPU_BACKWARD_SENTENCE = ("FlexAttention does not support backward on CPU. Please set the input "
                         "requires_grad to False or use another device.")
CPU_COMPILED_LSE_SENTENCE = ("torch.compile on CPU only supports inference and `return_lse` is "
                             "not supported yet.")


def known_cpu_refusal(mode: str, compiled: bool, version: tuple[int, int] | None = None) -> str | None:
    """Upstream's sentence refusing ``mode`` on the CPU (eager or compiled) in this torch (or
    ``version``), when it is a version this suite has checked; else None."""
    if (version or torch_version()) > NEWEST_CHECKED_TORCH:
        return None
    if mode == "fwd+bwd":
        return CPU_BACKWARD_SENTENCE
    if mode == "fwd+lse" and compiled:
        return CPU_COMPILED_LSE_SENTENCE
    return None


def unsupported_sentence(exc: BaseException) -> str | None:
    """Upstream's exact sentence declaring the case unsupported, if ``exc`` carries one in its
    text (also as Dynamo or Inductor word a wrapped error) or in an exception it was raised
    from (``__cause__`` only: an error raised while handling another is its own error)."""
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for sentence in UNSUPPORTED_SENTENCES:
            m = sentence.search(str(current))
            if m:
                return m.group(0)
        current = current.__cause__
    return None


def unsupported_device_message(exc: BaseException) -> str | None:
    """Upstream's exact device-rejection sentence carried by ``exc`` (see unsupported_sentence)."""
    sentence = unsupported_sentence(exc)
    return sentence if sentence and _UNSUPPORTED_DEVICE_RE.fullmatch(sentence) else None


def _running_torch() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "(not installed)"


# -- compile anatomy --------------------------------------------------------------------------
#: torch's CompilationMetrics fields, nested: each contains the next. The first name present
#: is read (microsecond counters since about 2.5, seconds before), summed over every
#: compilation since ``clear_compile_metrics`` (a backward case compiles twice).
_NESTED_COMPILE_TIMERS = (
    ("dynamo_cumulative_compile_time_us", "entire_frame_compile_time_s"),  # the whole frame
    ("aot_autograd_cumulative_compile_time_us", "backend_compile_time_s"),  # the backend
    ("inductor_cumulative_compile_time_us", "inductor_compile_time_s"),  # Inductor
    ("inductor_code_gen_cumulative_compile_time_us", "code_gen_time_s"),  # its code generation
)
#: Waiting for kernels compiled by a pool of compile workers (in code generation).
_ASYNC_KERNEL_WAIT = ("triton_compile_time_us",)
#: ``dynamo_timed`` regions (torch._dynamo.utils.compilation_time_metrics) of in-process
#: kernel compiles: every C++ compile (``compile_file``), during lowering (the template's
#: autotuning choices) and code generation; every Triton kernel's compile with one compile
#: thread (``async_compile.precompile``: CUDA, as the suite runs it; without it a CUDA
#: breakdown put all of Triton's compile in ``inductor_codegen``, an outside review); and the
#: load of the generated module, which compiles what is left.
_IN_PROCESS_COMPILES = ("compile_file", "async_compile.precompile")
_MODULE_LOAD = "PyCodeCache.load_by_key_path"


def clear_compile_metrics() -> None:
    """Forget earlier compilations' metrics (before a case's first call)."""
    from torch._dynamo import utils

    clear = getattr(utils, "clear_compilation_metrics", None)
    if clear is not None:
        clear()
    timed = getattr(utils, "compilation_time_metrics", None)
    if isinstance(timed, dict):
        timed.clear()


def inductor_compile_stages(kernel_compile: str) -> dict[str, float] | None:
    """The first call's compile time by stage, from torch's own timers, in stages that do not
    overlap (so they sum to the frame's compile time; the caller adds ``other``):

    - ``dynamo_tracing``: the frame less its backend; ``aot_autograd``: the backend less Inductor;
    - ``inductor_lowering`` and ``inductor_codegen``: Inductor's two parts, each less the kernel
      compiles inside it;
    - ``kernel_compile`` (named by the caller: ``cxx_compile`` on the CPU, ``triton_compile`` on
      CUDA): compiling kernels. In-process compiles (one compile thread, as the suite's CPU
      workers run) are torch's ``compile_file`` regions: those during code generation are
      bounded by the generated module's load, the rest fell in lowering (autotuning). With a
      pool of compile workers it is the wait for them, inside code generation (compiles the
      pool ran while lowering went on stay in lowering: they overlap it).

    None when this torch keeps no such metrics. Kernel compiles that torch does not time (a
    backend compiling inside its own call) stay in the stage they happen in.
    """
    from torch._dynamo import utils

    get = getattr(utils, "get_compilation_metrics", None)
    entries = list(get()) if get is not None else []
    if not entries:
        return None
    frame, backend, inductor, codegen = (_timer_total(entries, names)
                                         for names in _NESTED_COMPILE_TIMERS)
    if frame is None:
        return None
    stages = {"dynamo_tracing": max(0.0, frame - (backend or 0.0))}
    if backend is None:
        return stages
    stages["aot_autograd"] = max(0.0, backend - (inductor or 0.0))
    if inductor is None:
        return stages
    codegen = codegen or 0.0
    # torch 2.6 times a wait for compiles of one thread too (0.4 ms: they ran as the module
    # loaded), and its compile_file regions were then dropped as a pool's (cxx_compile 0.0004 s,
    # the compiles left in codegen): a wait is the pool's only where there is a pool
    waited = (_timer_total(entries, _ASYNC_KERNEL_WAIT) or 0.0) if _compile_pool() else 0.0
    timed = getattr(utils, "compilation_time_metrics", {}) or {}
    # with a pool, compile_file regions overlap (threads) and outlast the wall time: only the
    # wait for the pool is the compile's own share then
    in_process = 0.0 if waited else sum(sum(timed.get(region, ()))
                                        for region in _IN_PROCESS_COMPILES)
    module_load = min(sum(timed.get(_MODULE_LOAD, ())), codegen) if in_process else 0.0
    in_lowering = max(0.0, in_process - module_load)
    in_codegen = module_load + waited
    stages["inductor_lowering"] = max(0.0, inductor - codegen - in_lowering)
    stages["inductor_codegen"] = max(0.0, codegen - in_codegen)
    if in_lowering or in_codegen:
        stages[kernel_compile] = in_lowering + in_codegen
    return stages


def _compile_pool() -> bool:
    """Whether Inductor compiles kernels in a pool of workers (more than one compile thread)."""
    from torch._inductor import async_compile

    threads = getattr(async_compile, "get_compile_threads", None)
    return threads is None or threads() > 1  # without the function: as before, by the wait


def _timer_total(entries: list, names: tuple[str, ...]) -> float | None:
    """Seconds of the first of ``names`` present in the metrics, summed; None if absent."""
    for name in names:
        values = [getattr(entry, name, None) for entry in entries]
        if any(v is not None for v in values):
            scale = 1e-6 if name.endswith("_us") else 1.0
            return sum(v for v in values if v is not None) * scale
    return None


#: torch's structured-trace logger (torch/_logging/_internal.py: always at DEBUG, never
#: propagating; tlparse reads what its handler writes).
TORCH_TRACE_LOGGER = "torch.__trace"


class _TorchTraceWritesSomewhere:
    """A filter on torch's structured-trace logger: a record passes only while a handler of
    it has a directory to write to (TORCH_TRACE, or TORCH_COMPILE_DEBUG's): torch's
    LazyTraceHandler and its subclasses (draft_export's CaptureStructuredTrace) hold one,
    pytest's capture handlers none."""

    def __init__(self, trace_log: logging.Logger):
        self.trace_log = trace_log

    def filter(self, record) -> bool:  # noqa: ARG002 - the logger's handlers decide
        return any(getattr(handler, "root_dir", None) is not None
                   for handler in self.trace_log.handlers)


def keep_torch_trace_to_itself() -> None:
    """Keep torch's structured-trace records away from pytest's log capture when torch writes
    no trace. pytest >= 9 attaches its capture to every non-propagating logger, this one too,
    and the records have empty messages (their payload is for tlparse): each failing case's
    "Captured log call" showed dozens of empty ``DEBUG torch.__trace:meta_utils.py`` lines from
    make_fx traces (the worker traced each mask so until 2026-12-04; torch.compile traces so).
    With TORCH_TRACE set they still pass, everywhere."""
    trace_log = logging.getLogger(TORCH_TRACE_LOGGER)
    if not any(isinstance(f, _TorchTraceWritesSomewhere) for f in trace_log.filters):
        trace_log.addFilter(_TorchTraceWritesSomewhere(trace_log))


#: Inductor's and AOTAutograd's caches of whole compiled graphs (config module, name), where
#: the torch version has them.
_GRAPH_CACHES = (("torch._inductor.config", "fx_graph_cache"),
                 ("torch._functorch.config", "enable_autograd_cache"))


@contextmanager
def graph_caches_off():
    """Within: no cache of whole compiled graphs serves a torch.compile, so every stage
    (tracing, AOTAutograd, lowering, code generation) runs in the process; caches of the
    compiler's outputs (Inductor's shared objects) still can. Yields whether that holds: an
    environment variable that forces a cache on (TORCHINDUCTOR_FX_GRAPH_CACHE=1,
    TORCHINDUCTOR_AUTOGRAD_CACHE=1) wins over code. Set back exactly on exit (the config's
    own ``patch``)."""
    import importlib

    with ExitStack() as patches:
        patched = []
        for module_name, name in _GRAPH_CACHES:
            module = importlib.import_module(module_name)
            if hasattr(module, name):
                patches.enter_context(module.patch(**{name: False}))
                patched.append((module, name))
        yield all(getattr(module, name) is False for module, name in patched)


def clear_inductor_caches() -> bool:
    """Clear Inductor's in-memory caches (code already loaded, paths into a cache directory):
    ``torch._inductor.utils.clear_caches`` on newer torch, ``clear_inductor_caches`` on older
    (2.6, 2.7); False where the torch version has neither."""
    from torch._inductor import utils

    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is None:
        return False
    clear()
    return True


#: cuBLAS's TF32 switch for the whole process, whatever torch's flags say (ATen reads it once).
TF32_OVERRIDE_ENV = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


@contextmanager
def ieee_float32_matmul():
    """float32 matrix products in IEEE float32 on CUDA inside the block (the dtype baseline is
    a float32 kernel: with TF32 its products round to 10 bits and the verdict's limits, scaled
    by its error, would loosen), the setting put back after: ``fp32_precision`` where this torch
    has it (2.9 and later), else ``allow_tf32``."""
    import torch

    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(torch._C, "_get_fp32_precision_getter") else "allow_tf32"
    before = getattr(matmul, name)
    setattr(matmul, name, "ieee" if name == "fp32_precision" else False)
    try:
        yield
    finally:
        setattr(matmul, name, before)
