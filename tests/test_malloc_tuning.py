"""`tune_malloc`: glibc's mmap threshold fixed, so large freed buffers leave the process,
and its arenas capped, so threads do not each keep one."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = r"""
import sys
from t3d.malloc_tuning import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
def rss():
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024
start = rss()
for _ in range(3):  # the first freed block raises glibc's dynamic threshold to its size,
    block = b"x" * (30 << 20)  # so the next ones come from the heap and stay there
    del block
print(rss() - start)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_large_freed_buffers_go_back_to_the_os_once_tuned() -> None:
    """In a fresh process, 30 MiB buffers made and freed one after another: with glibc's
    dynamic threshold one of them stays in the process once freed; with the threshold
    fixed (`tune_malloc`) none does."""
    def kept(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    untuned, tuned = kept("default"), kept("tuned")
    assert tuned < 8 << 20, tuned
    assert untuned > 25 << 20, untuned  # what the tuning is for (if glibc changes, revisit it)


_ARENAS = r"""
import ctypes, os, sys, threading
from t3d.malloc_tuning import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc() == ("MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")
together = threading.Barrier(8)
def work(kept):  # blocks over pymalloc's 512 bytes come from malloc, in this thread's arena
    together.wait()  # all eight alive at once: an exited thread's arena goes to the next
    kept.append([bytearray(4096) for _ in range(100)])
    together.wait()
kept = []
threads = [threading.Thread(target=work, args=(kept,)) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
os.dup2(1, 2)  # malloc_stats writes to stderr: one "Arena N:" per arena
ctypes.CDLL(None).malloc_stats()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_threads_share_at_most_two_arenas_once_tuned() -> None:
    """Eight threads that allocate: by default glibc gives each an arena of its own (nine
    in all); tuned, they share `ARENA_MAX` (2)."""
    from t3d.malloc_tuning import ARENA_MAX

    def arenas(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True, text=True, check=True)
        return sum(line.startswith("Arena ") for line in done.stdout.splitlines())

    untuned, tuned = arenas("default"), arenas("tuned")
    assert tuned == ARENA_MAX, tuned
    assert untuned > ARENA_MAX, untuned  # what the cap is for (if glibc changes, revisit it)


def test_an_explicit_environment_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """With MALLOC_MMAP_THRESHOLD_ set, the operator chose: tune_malloc leaves the threshold
    and caps only the arenas; with MALLOC_ARENA_MAX set too, it does nothing."""
    from t3d.malloc_tuning import tune_malloc

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert tune_malloc() == ("MALLOC_ARENA_MAX",)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert tune_malloc() == ()
