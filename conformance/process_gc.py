"""Python's cyclic garbage collector in a run's long-lived processes: its pytest processes
and its backend children.

With torch loaded, a process holds over a million objects that live as long as it does
(modules, functions, torch's operator tables). Every full collection walks them all, and so
does the one Python runs at exit, finding nothing to free: about 0.7 s of a pytest process's
end, and 0.2-0.3 s of a child's start (importing torch and torch._dynamo, tracing the warm-up
case). So the collector is paused while a process imports torch and while a child warms up,
and what is alive after them, and when a pytest process ends, is frozen out of its sight for
good (``gc.freeze``). Never inside a case's phases: a case's compile runs with the collector
on, as in a user's process; only the start-up objects it would have walked again are frozen
(cpu-inductor's cold compile seconds were the same either way, docs/performance.md)."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block, then as it was (left off where it was off). What the
    block left unreachable is collected by the collector's next run, or stays if it is
    frozen before that (bounded: what an import or a warm-up leaves)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def keep_for_the_process() -> None:
    """Move every object alive now out of the collector's sight (``gc.freeze``): later
    collections, and the one at exit, walk only what is made after this."""
    gc.freeze()
