"""Keep the golden's freed memory in the process, so each chunk reuses the pages of the last.

The golden allocates the same few tens of MB chunk after chunk (the scores, each score_mod
intermediate, the probabilities). glibc's malloc gives a free block at the top of its heap
back to the kernel once it passes the trim threshold (dynamic: twice the mmap threshold, so
about 64 MB at most), and the next chunk then page-faults every page of it in again, zeroed:
that cost more than the golden's own arithmetic on ALiBi (docs/performance.md). Raising the
trim threshold keeps the pages; the process then holds its peak heap instead of giving it
back, which is the peak it needed anyway. The golden runs in the suite's own processes, never
in a backend's child, so nothing measured of a backend sees this setting.

Only glibc on Linux has these knobs; anywhere else nothing changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

#: mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Setting the trim threshold fixes the mmap threshold too (glibc stops adjusting it), so it is
#: set to the largest value glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB), the
#: value its dynamic threshold would reach: blocks up to it come from the heap.
_MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free memory at the top of the heap is given back to the kernel only beyond this.
_TRIM_THRESHOLD = 1 << 30


@functools.cache
def keep_freed_heap() -> bool:
    """Raise glibc's trim threshold for this process (once); True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        # glibc only (AttributeError elsewhere): musl's mallopt does nothing
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) \
        and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
