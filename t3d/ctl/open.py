"""`t3d ctl open`: a one-time sign-in link for the web page (and a browser, if asked).

The daemon makes the link (``POST /api/auth/link``, with the token); it works once, within
60 seconds, and the page trades it for a session cookie, so the token itself never reaches
the browser, its history or a log.
"""

from __future__ import annotations

import argparse
import webbrowser

import orjson
import trio

from t3d.ctl.client import EXIT_OK, CtlError, Endpoint, http_get_json, read_token
from t3d.ctl.terminal import err, out


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    opener = commands.add_parser(
        "open",
        parents=[common],
        help="print a one-time sign-in link for the web page (--browser: open it)",
        description="Ask the daemon for a one-time link to its web page: it works once, within "
        "60 seconds, and signs that browser in with a cookie (the token never leaves this machine's "
        "terminal). Run it again for another link.",
    )
    opener.add_argument(
        "--browser",
        action="store_true",
        help="also open the link in a web browser (the one $BROWSER names, else the system's)",
    )
    opener.set_defaults(handler=_open)


async def _open(args: argparse.Namespace, endpoint: Endpoint) -> int:
    token = read_token(endpoint.token_path)
    answer = await http_get_json(endpoint, "/api/auth/link", token=token, method="POST")
    url = answer.get("url") if isinstance(answer, dict) else None
    if not isinstance(url, str):
        raise CtlError(f"{endpoint.url}/api/auth/link did not answer with a link; is the daemon older than this client?")
    seconds = answer.get("expires_in_s", 60)
    if args.json:
        out(orjson.dumps({"url": url, "expires_in_s": seconds}).decode() + "\n")
    else:
        out(f"{url}\n")
        err(f"open it within {seconds:g} s; it works once (run `t3d ctl open` again for another)\n")
    if args.browser:
        opened = await trio.to_thread.run_sync(webbrowser.open, url)
        if not opened:
            err("no web browser found here; open the link above yourself (or set $BROWSER)\n")
    return EXIT_OK
