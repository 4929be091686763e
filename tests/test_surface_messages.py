"""What `t3d serve` says when it cannot start: listen failures by cause, and usage errors
reported with the usage of the command they were given to."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from served import base_env

from t3d.api.transport import ListenError, listen_failure, serve_api_transport


async def _app(request: object) -> object:  # never called: nothing connects
    raise AssertionError("no request expected")


async def listen_error(host: str, port: int) -> str:
    with pytest.raises(ListenError) as failed:
        await serve_api_transport(_app, host, port)  # type: ignore[arg-type]
    return str(failed.value)


async def test_a_taken_port_says_another_process_holds_it() -> None:
    """Listening on a port another socket holds says so and suggests another port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        message = await listen_error("127.0.0.1", port)
    assert message.startswith(f"could not listen on 127.0.0.1:{port}: Address already in use;")
    assert "stop the server that holds it" in message


async def test_an_address_this_host_lacks_is_unavailable_not_taken() -> None:
    """An address no interface has (192.0.2.1, ::2) is reported as unavailable with a hint to
    pick one the host has, not as a port someone holds; IPv6 is written [::2]:port."""
    message = await listen_error("192.0.2.1", 4000)
    assert message.startswith("could not listen on 192.0.2.1:4000: Cannot assign requested address;")
    assert "no interface of this host has that address" in message and "holds it" not in message
    if socket.has_ipv6:
        try:
            socket.socket(socket.AF_INET6).close()
        except OSError:
            return  # IPv6 sockets are off on this host
        message = await listen_error("::2", 4000)
        assert message.startswith("could not listen on [::2]:4000:"), message
        assert "holds it" not in message


def test_a_permission_error_gets_its_own_hint() -> None:
    """EACCES names privileged ports for a port below 1024, and otherwise says this user may
    not listen there; neither talks of a server holding the port."""
    denied = OSError(errno.EACCES, "Permission denied")
    low = listen_failure("127.0.0.1", 80, denied)
    assert low == (
        "could not listen on 127.0.0.1:80: Permission denied; ports below 1024 need privileges; "
        "pick a port from 1024 up with --port (or T3D_PORT)"
    )
    high = listen_failure("::1", 5000, denied)
    assert high.startswith("could not listen on [::1]:5000: Permission denied; this user may not listen there")


async def test_serve_on_an_unavailable_address_exits_1_with_the_reason(tmp_path: Path) -> None:
    """`t3d serve --host 192.0.2.1` stops with exit status 1 and the listen failure's text."""
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "t3d", "serve", "--host", "192.0.2.1", "--port", "0",
             "--state-dir", str(tmp_path / "state")],
            stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
        )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "t3d: stopped: could not listen on 192.0.2.1:0: Cannot assign requested address; no interface" in err


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["serve", "--bogus"], "usage: t3d serve "),
        (["ctl", "status", "--bogus"], "usage: t3d ctl status "),
        (["ctl", "run", "--bogus", "hello"], "usage: t3d ctl run "),
        (["ctl", "stop", "THREAD", "--bogus"], "usage: t3d ctl stop "),
    ],
)
async def test_an_unknown_argument_prints_its_commands_usage(argv: list[str], usage: str) -> None:
    """An argument no parser knows exits 2 with the usage of the command it was given to
    (`t3d serve --bogus` shows serve's flags, not the top-level usage) and names it."""
    with trio.fail_after(30):
        done = await trio.run_process(
            [sys.executable, "-m", "t3d", *argv],
            stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False, env=base_env(),
        )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.startswith(usage), err
    assert "error: unrecognized arguments: --bogus" in err
