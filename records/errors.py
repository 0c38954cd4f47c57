"""Which exceptions are running out of memory: a MemoryError, or an error whose text says so
(torch's allocators raise RuntimeErrors: "CUDA out of memory", "DefaultCPUAllocator: can't
allocate memory", a device runtime's "failed to allocate host memory"). One rule for the child
(the label OUT_OF_MEMORY) and the reference (never the case's own fault). No torch here."""
from __future__ import annotations

OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "(oom)",
             "failed to allocate host memory")


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(t in text for t in OOM_TEXTS)
