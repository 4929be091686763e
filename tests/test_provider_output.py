"""`ProviderOutput` over a real child's stdout pipe (the direct spawner)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
import trio.lowlevel

from t3d.providers.lines import LineTooLong
from t3d.providers.output import ProviderOutput
from t3d.spawn.direct import DirectSpawner

# Writes LINES numbered lines (one block of BLOCK, over and over) as fast as it can.
BLOCK = 10_000
FLOOD = """
import os
block = b"".join(b'{{"n":%d}}\\n' % n for n in range({block}))
for _ in range({lines} // {block}):
    view = memoryview(block)
    while view:
        view = view[os.write(1, view):]
"""


async def test_a_provider_that_never_pauses_gets_every_line_without_holding_the_loop(tmp_path: Path) -> None:
    """200,000 lines written faster than they are read (the pipe is never empty): every
    line arrives once, in order,
    with the offset just past it, and the loop keeps running other tasks meanwhile (a
    read that did not wait yields first)."""
    lines = 200_000
    child = await DirectSpawner().spawn(
        [sys.executable, "-c", FLOOD.format(lines=lines, block=BLOCK)], cwd=str(tmp_path), env=dict(os.environ)
    )
    output = ProviderOutput(child)
    seen: list[int] = []
    offsets_ok = True
    size = 0
    ticks = 0

    async def on_line(line: bytes | LineTooLong) -> None:
        nonlocal offsets_ok, size
        assert isinstance(line, bytes)
        size += len(line) + 1
        offsets_ok = offsets_ok and output.offset == size
        seen.append(int(line[5:-1]))
        for _ in range(20):  # slower than the child, so the pipe is always full
            pass

    async def tick() -> None:  # counts the loop's turns while lines are being read
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 0 < len(seen) < lines

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            await output.run(on_line)
            nursery.cancel_scope.cancel()
    assert seen == list(range(BLOCK)) * (lines // BLOCK) and offsets_ok
    # The reader took tens of reads (64 KiB each); the other task ran between them.
    assert ticks >= size // (64 * 1024) // 2, (ticks, size // (64 * 1024))
    await child.wait()
