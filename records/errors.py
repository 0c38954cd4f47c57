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


def os_error_in(exc: BaseException) -> OSError | None:
    """The first OSError in ``exc``'s chain (itself, then what it was raised from or during):
    torch.save into a full disk raises a RuntimeError ("unexpected pos ...") whose context is
    the OSError, when it writes through a Python file."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk's: by the errno of an OSError in its chain, never by
    its text, which a mod's own error or a log could hold."""
    error = os_error_in(exc)
    return error is not None and error.errno in DISK_FULL_ERRNOS


def is_not_judged(record) -> bool:
    """Whether ``record`` (records.results.Record) is of a case the environment kept from
    being judged (NOT_JUDGED_KEY): no outcome of the case, never a known failure, and the run
    is not one to gate until ``--resume`` has judged it."""
    return bool((record.metrics or {}).get(NOT_JUDGED_KEY))


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(t in text for t in OOM_TEXTS) \
        or any(cls.__name__ in OOM_CLASS_NAMES for cls in type(exc).__mro__)
