"""What `t3d serve` imports before it serves, and that its lean parser is the same parser.

A restart's down time is mostly the new daemon's start, and most of that is imports: the
JSON Schema (GET /api/schema), MCP (/mcp), the Codex provider (a Codex thread's first
session) and the ``ctl``/``service`` parsers are imported on first use, never at start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from metrics_support import scrape, value
from served import serve

from t3d.cli import build_parser, main

# Imported on first use only (t3d/api/app.py, t3d/providers/registry.py, t3d/cli.py).
NOT_AT_START = ("t3d.api.schema", "t3d.api.mcp", "t3d.api.mcp_tools", "t3d.providers.codex", "t3d.ctl", "t3d.service.command")


def test_serve_start_leaves_first_use_modules_unimported() -> None:
    """What `t3d serve` imports up to serving (its parser, then t3d.daemon) holds none of
    the modules that are only imported on first use."""
    probe = (
        "import sys, t3d.cli\n"
        "t3d.cli.build_parser(serve_only=True)\n"
        "import t3d.daemon\n"
        f"print(sorted(m for m in sys.modules if m.startswith({NOT_AT_START!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


async def test_serve_freezes_the_daemons_modules_with_start_up(tmp_path: Path) -> None:
    """`t3d serve` freezes the garbage collector's view of start-up after importing the
    daemon (t3d.daemon and all it imports), so full collections never scan those objects:
    /metrics counts at least as many frozen objects as that import alone tracks."""
    probe = "import gc, t3d.cli, t3d.daemon\ngc.collect()\nprint(len(gc.get_objects()))\n"
    with trio.fail_after(120):
        done = await trio.run_process([sys.executable, "-c", probe], capture_stdout=True)
    imported = int(done.stdout)
    with trio.fail_after(60):
        async with serve(tmp_path / "state") as daemon:
            frozen = value(await scrape(daemon.port, daemon.token), "t3d_gc_frozen_objects")
    assert frozen >= 0.95 * imported, (frozen, imported)


def _serve_parser(serve_only: bool) -> object:
    parser = build_parser(serve_only=serve_only)
    subparsers = next(a for a in parser._actions if a.dest == "command")
    return subparsers.choices["serve"]  # type: ignore[attr-defined]


def test_serve_only_parser_helps_and_parses_as_the_whole_one() -> None:
    """`t3d serve`'s parser built alone has the same help text and parses the same flags
    as the one inside the whole `t3d` parser."""
    alone, whole = _serve_parser(True), _serve_parser(False)
    assert alone.format_help() == whole.format_help()  # type: ignore[attr-defined]
    argv = ["serve", "--port", "0", "--state-dir", "/tmp/x", "--log-level", "debug"]
    picked = {k: v for k, v in vars(build_parser(serve_only=True).parse_args(argv)).items() if k not in ("usage_parser", "root_parser")}
    expected = {k: v for k, v in vars(build_parser().parse_args(argv)).items() if k not in ("usage_parser", "root_parser")}
    assert picked == expected


def test_serve_unknown_flag_names_serve_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown flag after `serve` still exits 2 with serve's usage line."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: t3d serve ") and "unrecognized arguments: --bogus" in err
