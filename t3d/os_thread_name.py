"""Naming the daemon's own threads for the OS.

Python 3.11's ``threading`` names a thread for Python only: ``top -H``, ``ps -L`` and
``/proc/PID/task/*/comm`` show every thread of the daemon as ``python`` (trio names its
worker threads itself). `name_this_thread` gives the calling thread its name there too
(``prctl(PR_SET_NAME)``), so the writer's and the checkpointer's CPU can be told apart
from the loop's by any tool, the benchmark's sampler included. Linux keeps 15 bytes of
a name; off Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
import threading

_PR_SET_NAME = 15  # <linux/prctl.h>
NAME_BYTES = 15


def name_this_thread(name: str | None = None) -> None:
    """Give the calling OS thread ``name`` (by default its Python name; cut to
    `NAME_BYTES`); nothing where it cannot."""
    if name is None:
        name = threading.current_thread().name
    if not sys.platform.startswith("linux"):
        return
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:NAME_BYTES]), 0, 0, 0)
