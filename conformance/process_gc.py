"""Python's cyclic garbage collector in a run's processes: its pytest processes and its
backend children.

With torch loaded, a process holds over a million objects that live as long as it does
(modules, functions, torch's operator tables). Every full collection walks them all, and so
does the one Python runs at exit, finding nothing to free: in a process that imports torch,
torch._dynamo and flex_attention and exits, a third of its CPU time (docs/performance.md).
So:

- ``imported_for_good()``: imports that stay to the process's end (torch, the backend's
  module) run with the collector paused, and what lives after them is frozen out of its sight
  (``gc.freeze``) for good, in a process that had not imported torch yet (not a
  ``pytest.main()`` inside one that had: what it froze would include its earlier garbage);
- ``warming_up()``: a child's warm-up runs with the collector paused, then one full collection
  frees what it left (counted in the warm-up's seconds, not in the first case's phases).
  Nothing of the warm-up is frozen: a backend drops what it compiled before a case
  (``torch._dynamo.reset()``), and frozen it would never be freed;
- ``freeze_at_exit()``: as a pytest process of a run exits (after pytest's own last
  collection, which reports errors in finalizers), everything is frozen, so that Python's
  collection at exit walks nothing.

A case's phases run with the collector on, as in a user's process: cpu-inductor's cold
compile seconds were the same (docs/performance.md)."""
from __future__ import annotations

import atexit
import functools
import gc
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block, then as it was (left off where it was off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def imported_for_good() -> Iterator[None]:
    """Imports that stay to the process's end: see the module. Where torch was imported
    already, the block runs as it is."""
    if "torch" in sys.modules:
        yield
        return
    with gc_paused():
        yield
    gc.collect(0)  # what the imports left unreachable (everything they made is young)
    gc.freeze()


@contextmanager
def warming_up() -> Iterator[None]:
    """A child's warm-up: see the module."""
    try:
        with gc_paused():
            yield
    finally:
        gc.collect()


@functools.cache
def freeze_at_exit() -> None:
    """Freeze everything as the process exits (an ``atexit`` hook, registered once)."""
    atexit.register(gc.freeze)
