"""The spawner's pure parts: frame codec, request checks, pool sizing and slots."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.__main__ import UsageError, parse_args
from spawner.pools import Pool, PoolBusyError, cgroup_cpu_limit, default_git_pool
from spawner.protocol import MAX_FRAME, FrameDecoder, FrameError, check_env, encode_frame

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(st.lists(st.dictionaries(st.text(), json_values, max_size=5), max_size=5), st.integers(1, 7))
def test_frames_round_trip_however_the_bytes_are_split(messages: list[dict[str, object]], step: int) -> None:
    stream = b"".join(encode_frame(m) for m in messages)
    decoder = FrameDecoder()
    out = []
    for start in range(0, len(stream), step):
        decoder.feed(stream[start : start + step])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == messages and decoder.pending == 0


def test_a_bad_frame_is_an_error_for_that_frame_and_an_impossible_length_is_fatal() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\0\0\0\x02[]" + encode_frame({"ok": True}))
    with pytest.raises(FrameError, match="not an object") as bad:
        decoder.next_frame()
    assert not bad.value.fatal
    assert decoder.next_frame() == {"ok": True}  # still in step
    decoder.feed((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(FrameError) as fatal:
        decoder.next_frame()
    assert fatal.value.fatal


def test_env_names_must_be_plain() -> None:
    assert check_env({"env": {"A": "1"}}) == {"A": "1"}
    for env in ({"A=B": "1"}, {"": "1"}, {"A": 1}, ["A"]):
        with pytest.raises(FrameError, match="'env' must be"):
            check_env({"env": env})


def test_git_pool_follows_the_cpus_and_cgroup_quotas_are_read(tmp_path: Path) -> None:
    assert [default_git_pool(c) for c in (1, 2, 32, 64, 96, 200)] == [8, 8, 8, 16, 24, 32]
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None


def test_a_pool_hands_a_freed_slot_to_the_first_waiter() -> None:
    pool = Pool("git", 1)
    pool.acquire()
    order: list[int] = []

    def waiter(n: int) -> None:
        pool.acquire()
        order.append(n)
        pool.release()

    threads = []
    for n in range(3):
        thread = threading.Thread(target=waiter, args=(n,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while pool.statistics()["queued"] != n + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    pool.release()
    for thread in threads:
        thread.join(5)
    stats = pool.statistics()
    assert order == [0, 1, 2]
    assert (stats["busy"], stats["queued"], stats["completed"]) == (0, 0, 4)


def test_a_full_waiting_line_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("spawner.pools.MAX_WAITING", 0)
    pool = Pool("forge", 1)
    pool.acquire()
    with pytest.raises(PoolBusyError, match="already waiting"):
        pool.acquire()


def test_options_are_checked_with_their_ranges() -> None:
    options = parse_args(["--socket", "/s", "--git-pool", "12", "--idle-exit", "30"])
    assert (options.socket, options.git_pool, options.idle_exit, options.forge_pool) == ("/s", 12, 30.0, 4)
    for argv, message in (
        (["--git-pool", "0", "--socket", "/s"], "out of range"),
        (["--socket"], "needs a value"),
        (["--forge-pool", "x", "--socket", "/s"], "not a whole number"),
        (["--git-pool", "8"], "--socket is required"),
        (["--bogus", "1"], "unknown option"),
    ):
        with pytest.raises(UsageError, match=message):
            parse_args(argv)
