"""Getting a sign-in link from the command line: `t3d ctl open` and `t3d serve`'s banner on a
terminal (real subprocesses, a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import trio
from served import base_env, serve
from test_web_auth import raw

LINK = re.compile(rb"http://127\.0\.0\.1:(\d+)/auth\?code=[A-Za-z0-9_-]+")


async def ctl(state_dir: Path, port: int, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "t3d", "ctl", "open", "--state-dir", str(state_dir), "--port", str(port), *args]
    return await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, env=env or base_env())


async def redeem(url: str) -> int:
    """The status of opening a sign-in link (303 signs in)."""
    parts = urlsplit(url)
    status, _, _ = await raw(parts.port, "GET", f"{parts.path}?{parts.query}")
    return status


async def test_ctl_open_prints_a_link_that_signs_in_once(tmp_path: Path) -> None:
    """`t3d ctl open` prints one link on stdout (and how long it lasts on stderr); the link
    signs a browser in once; --json says the same as an object; --browser hands the link to
    the browser $BROWSER names; the daemon's stderr (a log here, not a terminal) never
    carried a link."""
    with trio.fail_after(60):
        async with serve(tmp_path / "state") as served:
            done = await ctl(served.state_dir, served.port)
            assert done.returncode == 0, done.stderr
            url = done.stdout.decode().strip()
            assert LINK.fullmatch(url.encode()) and urlsplit(url).port == served.port
            assert b"works once" in done.stderr
            assert await redeem(url) == 303
            assert await redeem(url) == 410
            done = await ctl(served.state_dir, served.port, "--json")
            answer = orjson.loads(done.stdout)
            assert answer["expires_in_s"] == 60 and LINK.fullmatch(answer["url"].encode())
            opened = tmp_path / "opened.txt"
            browser = tmp_path / "fake-browser"
            browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > "{opened}"\n')
            browser.chmod(0o755)
            done = await ctl(served.state_dir, served.port, "--browser", env=base_env(BROWSER=str(browser)))
            assert done.returncode == 0, done.stderr
            url = done.stdout.decode().strip()
            assert opened.read_text() == url
            assert await redeem(url) == 303
        assert b"auth?code=" not in served.stderr


async def test_ctl_open_without_a_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    """No daemon: exit 2 and the usual message naming `t3d serve`."""
    state = tmp_path / "state"
    (state / "auth").mkdir(parents=True)
    (state / "auth" / "token").write_text("x\n")
    done = await ctl(state, 9)
    assert done.returncode == 2
    assert b"t3d serve" in done.stderr


async def test_serve_on_a_terminal_prints_a_sign_in_link(tmp_path: Path) -> None:
    """`t3d serve` (as `make run` runs it) whose stderr is a terminal prints a one-time link
    after its address; the link works."""
    main, secondary = pty.openpty()
    argv = [sys.executable, "-m", "t3d", "serve", "--port", "0", "--replay-speed", "0", "--state-dir", str(tmp_path / "state")]
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=secondary, env=base_env())
    os.close(secondary)
    seen = b""
    try:
        with trio.fail_after(60):
            while not (found := LINK.search(seen)):
                await trio.lowlevel.wait_readable(main)
                seen += os.read(main, 4096)
            assert b"t3d serving on http://127.0.0.1:" + found.group(1) in seen
            assert await redeem(found.group(0).decode()) == 303
    finally:
        with trio.CancelScope(shield=True):
            process.terminate()
            await process.wait()
            os.close(main)
