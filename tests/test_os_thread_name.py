"""The daemon's own threads carry their names to the OS (t3d/os_thread_name.py), so
``top -H``, ``ps -L`` and the benchmark's sampler (which reads the writer's CPU by its
name) can tell them from the loop's thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import trio

from t3d.os_thread_name import NAME_BYTES, name_this_thread
from t3d.store.store import open_store


def _comm(tid: int) -> str:
    return Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip()


def test_a_thread_named_for_the_os_shows_its_name_cut_to_the_kernels_limit() -> None:
    seen: list[str] = []

    def run(name: str) -> None:
        name_this_thread(name)
        seen.append(_comm(threading.get_native_id()))

    for name in ("t3d-writer", "a-name-longer-than-the-kernel-keeps"):
        thread = threading.Thread(target=run, args=(name,))
        thread.start()
        thread.join()
    assert seen == ["t3d-writer", "a-name-longer-than-the-kernel-keeps"[:NAME_BYTES]]
    assert _comm(threading.get_native_id()) != "t3d-writer"  # only the calling thread


async def test_the_stores_writer_and_checkpointer_threads_are_named(tmp_path: Path) -> None:
    async with open_store(tmp_path / "t3d.sqlite", on_writer_lost=lambda error: None):
        with trio.fail_after(10):
            while True:
                names = {_comm(int(tid)) for tid in os.listdir(f"/proc/{os.getpid()}/task")}
                if {"t3d-writer", "t3d-checkpoint"} <= names:
                    break
                await trio.sleep(0.01)
