"""`tune_malloc`: glibc's mmap threshold fixed, so large freed buffers leave the process."""

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


def test_an_explicit_environment_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """With MALLOC_MMAP_THRESHOLD_ set, the operator chose: tune_malloc does nothing."""
    from t3d.malloc_tuning import tune_malloc

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert tune_malloc() is False
