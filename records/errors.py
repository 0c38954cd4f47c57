"""Which exceptions are running out of memory: a MemoryError, torch's OutOfMemoryError (a
RuntimeError; torch.cuda.OutOfMemoryError is the same class, and a plugin may raise it with
any text), or an error whose text says so (torch's allocators raise RuntimeErrors: "CUDA out
of memory", "DefaultCPUAllocator: can't allocate memory", a device runtime's "failed to
allocate host memory"). One rule for the child (the label OUT_OF_MEMORY) and the reference
(never the case's own fault). No torch here: the class is known by its name.

And which are a full disk (``is_disk_full``): a case that met one was not judged, whatever
label its error would have had (docs/labels.md, HARNESS_ERROR)."""
from __future__ import annotations

import errno

OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "(oom)",
             "failed to allocate host memory")


#: Exception classes that are running out of memory whatever their text (torch.OutOfMemoryError).
OOM_CLASS_NAMES = ("OutOfMemoryError",)


#: A write the disk refused for want of room: ENOSPC, and EDQUOT (a quota that is full).
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: The metrics key of a record the environment kept from being judged (the disk was full):
#: its HARNESS_ERROR is no outcome of the case, so ``--resume`` runs the case again.
NOT_JUDGED_KEY = "not_judged"


#: What a compiler or linker run as a subprocess prints when its disk is full (g++, ld:
#: "final link failed: No space left on device"), read only in that tool's own output.
DISK_FULL_TOOL_TEXTS = ("no space left on device", "disk quota exceeded")
#: The exceptions that carry a subprocess tool's output: subprocess's, and Inductor's
#: CppCompileError (its ``output``: g++'s), known by name (no torch here).
TOOL_FAILURES = ("CalledProcessError", "CppCompileError")


def _chain(exc: BaseException | None):
    """``exc``, then what it was raised from or during, and so on."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__


def os_error_in(exc: BaseException) -> OSError | None:
    """The first OSError in ``exc``'s chain: torch.save into a full disk raises a RuntimeError
    ("unexpected pos ...") whose context is the OSError, when it writes through a Python
    file."""
    return next((e for e in _chain(exc) if isinstance(e, OSError)), None)


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk's: the errno of an OSError in its chain, or the words of
    a compiler or linker subprocess in the chain (Inductor's C++ build: InductorError from
    CppCompileError from CalledProcessError, no OSError: a review); never the words of any
    other error, which a mod's own message or a log could hold."""
    for error in _chain(exc):
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(cls.__name__ in TOOL_FAILURES for cls in type(error).__mro__):
            said = " ".join(_text(getattr(error, name, None)) for name in ("output", "stderr"))
            if any(t in said.lower() for t in DISK_FULL_TOOL_TEXTS):
                return True
    return False


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else ""


def is_not_judged(record) -> bool:
    """Whether ``record`` (records.results.Record) is of a case the environment kept from
    being judged (NOT_JUDGED_KEY): no outcome of the case, never a known failure, and the run
    is not one to gate until ``--resume`` has judged it."""
    return bool((record.metrics or {}).get(NOT_JUDGED_KEY))


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(t in text for t in OOM_TEXTS) \
        or any(cls.__name__ in OOM_CLASS_NAMES for cls in type(exc).__mro__)
