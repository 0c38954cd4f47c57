"""Which exceptions are running out of memory: a MemoryError, torch's OutOfMemoryError (a
RuntimeError; torch.cuda.OutOfMemoryError is the same class, and a plugin may raise it with
any text), or an error whose text says so (torch's allocators raise RuntimeErrors: "CUDA out
of memory", "DefaultCPUAllocator: can't allocate memory", a device runtime's "failed to
allocate host memory"). One rule for the child (the label OUT_OF_MEMORY) and the reference
(never the case's own fault). No torch here: the class is known by its name."""
from __future__ import annotations

OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "(oom)",
             "failed to allocate host memory")


#: Exception classes that are running out of memory whatever their text (torch.OutOfMemoryError).
OOM_CLASS_NAMES = ("OutOfMemoryError",)


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or any(t in text for t in OOM_TEXTS) \
        or any(cls.__name__ in OOM_CLASS_NAMES for cls in type(exc).__mro__)
