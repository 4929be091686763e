"""The C allocator in a serving process: large buffers go back to the OS once freed, and
the threads share two arenas.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` (128 KiB at first) with
its own mmap, which free() returns to the OS at once. But the threshold is dynamic: each
time such a block is freed it rises to that block's size, up to 32 MiB, and from then on
blocks that size come from the heap, where freed memory mostly stays in the process.
Measured with three 30 MiB provider lines (``python -m bench.large_lines``): the daemon
kept ~65 MB more than it started with after the turns ended, and none with the
threshold fixed.

glibc also gives each new thread that allocates an arena of its own (up to eight per
core), and freed memory stays in the arena it came from: the writer, the readers, the
checkpointer and trio's worker threads each keep their own. Capped at `ARENA_MAX` (2),
PRIMARY 250's daemon RSS peak fell from 119-121 to 107 MiB, with CPU per turn and
latency within the noise (docs/benchmarks.md).

`tune_malloc` (called once by ``t3d serve``, before the loop and any thread start) fixes
the threshold at `MMAP_THRESHOLD` (fixing it turns the dynamic rise off) and caps the
arenas. Blocks that large are rare here (a large provider line, a large item's body, a
large snapshot), so the extra mmap/munmap per block costs nothing measurable. Not on
glibc (no ``mallopt``) it does nothing; ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_ARENA_MAX`` in the environment leaves that setting to it.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 1 << 20
ARENA_MAX = 2
_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>
_M_ARENA_MAX = -8


def tune_malloc() -> tuple[str, ...]:
    """Fix glibc's mmap threshold at `MMAP_THRESHOLD` and cap its arenas at `ARENA_MAX`;
    the environment variables of the settings it made (none off glibc)."""
    if not sys.platform.startswith("linux"):
        return ()
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return ()
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = (
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENA_MAX),
    )
    return tuple(
        name for name, option, value in settings if name not in os.environ and mallopt(option, value)
    )
