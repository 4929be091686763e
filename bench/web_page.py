"""The web page in headless Chromium: its load time, its long tasks, its memory over time.

    python -m bench.web_page --db /tmp/t3d-2700.sqlite --out bench-out/web
        [--runs 5] [--streams 50] [--stream-s 60] [--memory-s 600] [--sample-s 30] [--switch-s 60]
        [--pin DAEMON_CPUS:BROWSER_CPUS] [--trace]
    python -m bench.web_page --screenshots docs/web

It starts ``t3d serve`` on a copy of ``--db`` (``python -m bench gen-db`` writes one of 2,700
threads) and drives it through the public API only; the page signs in through a one-time
link, as a person's browser does. Chromium is Debian's (bench/chromium.py).

1. load: from opening ``/`` (signed in) to the thread list drawn with every thread of the
   shell: the page's own mark ``t3d:list-populated``, in ms since the navigation started;
   the first run is cold (nothing cached), then ``--runs`` more.
2. long tasks: ``--streams`` new threads stream turns back to back (the benchmark's replay
   fixture at its own timing, prompts allowed), while the page shows the list and one of
   them; every main-thread task over 50 ms during ``--stream-s`` (PerformanceObserver
   ``longtask``) is counted, with the longest.
3. memory: streaming goes on for ``--memory-s``; every ``--sample-s`` the page's garbage is
   collected and its heap, DOM nodes and listeners read (CDP ``Performance.getMetrics``); the
   open thread changes every ``--switch-s``, as a person moves around.

``--pin 0:1`` runs the daemon (with its agents and this driver) on CPU 0 and Chromium on CPU
1, so the page's long tasks are its own and not the streams' load; without it they share.

``--screenshots DIR`` instead writes the docs' pictures of the main views (a fresh daemon,
the bundled five-turn replay).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
import trio

from bench import actors, long_tasks
from bench.chromium import chromium_missing, open_browser
from bench.client import HttpClient, RpcConnection
from bench.daemon import RunningDaemon, StateDir, open_daemon, prepare_state
from bench.fixture import fixture_path
from bench.profiles import TURNS_FIXTURE

REPO = Path(__file__).resolve().parent.parent
PSI_FIXTURES = REPO / "tests" / "fixtures" / "psi"
THINK_S = 0.5
STEPS = """
const at = (name) => { const m = performance.getEntriesByName(name)[0]; return m ? m.startTime : -1; };
const nav = performance.getEntriesByType('navigation')[0];
const done = performance.getEntriesByName('t3d:list-populated')[0];
return {html: nav.responseEnd, dom_content_loaded: nav.domContentLoadedEventStart, ws_create: at('t3d:ws-create'), ws_open: at('t3d:ws-open'),
        shell_snapshot: at('t3d:shell-snapshot'), populated: done.startTime, threads: done.detail.threads};
"""
WAIT_S = 120.0


class Browser:
    """A Selenium driver seen from Trio: each call in a worker thread."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)

    async def js(self, script: str, *args: Any) -> Any:
        return await self.call(self.driver.execute_script, script, *args)

    async def until(self, script: str, what: str, seconds: float = WAIT_S) -> Any:
        with trio.move_on_after(seconds):
            while True:
                value = await self.js(script)
                if value:
                    return value
                await trio.sleep(0.05)
        raise RuntimeError(f"the page did not show {what} within {seconds:g} s")

    async def cdp(self, command: str, params: dict[str, Any] | None = None) -> Any:
        return await self.call(self.driver.execute_cdp_cmd, command, params or {})


async def sign_in(browser: Browser, daemon: RunningDaemon) -> str:
    """Open a one-time link (the daemon's, asked for with the token); the page's address."""
    http = HttpClient(daemon.port, daemon.token)
    try:
        link = await http.request("POST", "/api/auth/link")
    finally:
        await http.aclose()
    await browser.call(browser.driver.get, link["url"])
    await browser.until("return document.documentElement.dataset.listPopulated", "the thread list")
    return f"http://127.0.0.1:{daemon.port}/"


async def load_times(browser: Browser, page: str, runs: int) -> dict[str, Any]:
    """Open the page afresh ``runs + 1`` times: ms from navigation start to the list drawn."""
    times: list[float] = []
    steps: list[dict[str, float]] = []
    threads = 0
    for _ in range(runs + 1):
        await browser.call(browser.driver.get, "about:blank")
        await browser.call(browser.driver.get, page)
        await browser.until("return document.documentElement.dataset.listPopulated", "the thread list")
        mark = await browser.js(STEPS)
        times.append(round(float(mark["populated"]), 1))
        steps.append({k: round(float(v), 1) for k, v in mark.items() if k != "threads"})
        threads = int(mark["threads"])
    warm = times[1:] or times
    return {
        "threads": threads,
        "cold_ms": times[0],
        "warm_ms": warm,
        "warm_median_ms": statistics.median(warm),
        "max_ms": max(times),
        # ms since navigation start: the page's HTML, its modules run, the WebSocket open,
        # the shell snapshot whole, the list drawn
        "steps_of_the_last": steps[-1],
    }


async def start_streams(nursery: trio.Nursery, daemon: RunningDaemon, project_id: str, count: int, seconds: float) -> list[actors.Session]:
    """``count`` threads that start a turn as soon as their last one ends, for ``seconds``."""
    errors = actors.Errors()
    start = time.monotonic()
    window = actors.Window(start, start, start + seconds)
    sessions = [actors.Session(i, window, errors, answer_prompts=True) for i in range(count)]
    for i, session in enumerate(sessions):
        rpc: RpcConnection = await nursery.start(session.open, daemon.port, daemon.token, project_id)
        nursery.start_soon(session.run, rpc, start + i * 0.1, THINK_S)
    return sessions


async def metrics(browser: Browser) -> dict[str, float]:
    """The page's live heap after a full collection, its DOM nodes and listeners."""
    await browser.cdp("HeapProfiler.collectGarbage")
    got = await browser.cdp("Performance.getMetrics")
    wanted = ("JSHeapUsedSize", "JSHeapTotalSize", "Nodes", "JSEventListeners", "Documents")
    return {m["name"]: m["value"] for m in got["metrics"] if m["name"] in wanted}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)  # made by main
    state = prepare_state(out / f"state-{int(time.time())}", Path(args.db) if args.db else None)
    summary: dict[str, Any] = {"db": args.db, "streams": args.streams, "pin": args.pin}
    daemon_cpus, browser_cpus = _cpus(args.pin)
    async with open_daemon(state, fixture_path(TURNS_FIXTURE), {}, out / "daemon.log", cpus=daemon_cpus) as daemon:
        with pinned_browser(browser_cpus, daemon_cpus, trace=args.trace) as driver:
            browser = Browser(driver)
            await browser.cdp("Performance.enable")
            page = await sign_in(browser, daemon)
            summary["load"] = await load_times(browser, page, args.runs)
            print(f"load: {summary['load']}", file=sys.stderr)
            http = HttpClient(daemon.port, daemon.token)
            project = await http.request("POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": "project.create", "params": {"path": str(state.project)}})
            await http.aclose()
            async with trio.open_nursery() as nursery:
                total_s = args.stream_s + args.memory_s
                sessions = await start_streams(nursery, daemon, project["result"]["project_id"], args.streams, total_s + 30)
                await browser.js("location.hash = '#/t/' + arguments[0]", sessions[0].thread_id)
                await browser.until("return document.querySelector('.turn')", "a streaming turn")
                await browser.js("window.__t3d.longTasks.length = 0")
                if args.trace:  # the trace holds the whole session: its window starts at this mark
                    await browser.js(f"performance.mark('{long_tasks.WINDOW_MARK}')")
                await trio.sleep(args.stream_s)
                tasks = await browser.js("return window.__t3d.longTasks")
                if args.trace:
                    summary["long_task_trace"] = await traced_long_tasks(browser, out)
                turns = sum(1 for s in sessions for t in s.turns if t.end is not None)
                summary["long_tasks"] = {
                    "window_s": args.stream_s,
                    "count": len(tasks),
                    "over_50_ms": len([t for t in tasks if t["duration"] > 50]),
                    "longest_ms": round(max((t["duration"] for t in tasks), default=0.0), 1),
                    "turns_finished": turns,
                }
                print(f"long tasks: {summary['long_tasks']}", file=sys.stderr)
                samples = [{"t_s": 0.0, **await metrics(browser)}]
                began = time.monotonic()
                next_switch = began + args.switch_s
                shown = 0
                while (elapsed := time.monotonic() - began) < args.memory_s:
                    await trio.sleep(min(args.sample_s, args.memory_s - elapsed))
                    if time.monotonic() >= next_switch:
                        shown = (shown + 1) % len(sessions)
                        await browser.js("location.hash = '#/t/' + arguments[0]", sessions[shown].thread_id)
                        next_switch += args.switch_s
                    samples.append({"t_s": round(time.monotonic() - began, 1), **await metrics(browser)})
                    print(f"memory: {samples[-1]}", file=sys.stderr)
                summary["memory"] = {
                    "minutes": round(args.memory_s / 60, 1),
                    "samples": samples,
                    "heap_first_mib": round(samples[0]["JSHeapUsedSize"] / 2**20, 2),
                    "heap_last_mib": round(samples[-1]["JSHeapUsedSize"] / 2**20, 2),
                    "heap_max_mib": round(max(s["JSHeapUsedSize"] for s in samples) / 2**20, 2),
                    "nodes_first": samples[0].get("Nodes"),
                    "nodes_last": samples[-1].get("Nodes"),
                }
                summary["turns_finished"] = sum(1 for s in sessions for t in s.turns if t.end is not None)
                nursery.cancel_scope.cancel()
            await browser.call(driver.get, "about:blank")
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


async def traced_long_tasks(browser: Browser, out: Path) -> list[str]:
    """The trace events, saved whole (trace.json, for chrome://tracing or Perfetto), and the
    parts of each long task since the window began (bench/long_tasks.py), printed.
    Chromedriver hands the trace over once, at the first ``get_log``."""
    entries = await browser.call(browser.driver.get_log, "performance")
    events = []
    for entry in entries:
        message = orjson.loads(entry["message"])["message"]
        if message.get("method") == "Tracing.dataCollected":
            events.append(message["params"])
    (out / "trace.json").write_bytes(orjson.dumps({"traceEvents": events}))
    lines = long_tasks.report(events)
    for line in lines:
        print(f"trace: {line}", file=sys.stderr)
    return lines


def _cpus(pin: str | None) -> tuple[str | None, str | None]:
    if not pin:
        return None, None
    daemon, _, browser = pin.partition(":")
    if not daemon or not browser:
        raise SystemExit(f"web_page: --pin {pin!r}: give DAEMON_CPUS:BROWSER_CPUS, e.g. 0:1")
    return daemon, browser


def _cpu_set(cpus: str) -> set[int]:
    out: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


@contextmanager
def pinned_browser(browser: str | None, rest: str | None, *, trace: bool = False) -> Iterator[Any]:
    """A browser whose processes run on ``browser``'s CPUs (they keep the affinity of the
    thread that started them); this thread then goes back to ``rest``'s."""
    with ExitStack() as stack:
        if browser is None:
            yield stack.enter_context(open_browser(trace=trace))
            return
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, _cpu_set(browser))
        try:
            driver = stack.enter_context(open_browser(trace=trace))
        finally:
            os.sched_setaffinity(0, _cpu_set(rest) if rest else before)
        yield driver


# --- the docs' pictures -------------------------------------------------------------------


def use_psi(root: Path, name: str) -> None:
    path = root / "proc" / "pressure" / "memory"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".new")
    temporary.write_bytes((PSI_FIXTURES / name).read_bytes())
    os.replace(temporary, path)


async def screenshots(out: Path) -> list[Path]:
    """The main views, from a fresh daemon playing the bundled replay: the list with a thread
    and its prompt, a turn's diff, the memory banner, a phone's width, the dark scheme."""
    from replay_fixtures import DEFAULT_FIXTURE

    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"t3d-web-shots-{os.getpid()}"
    state: StateDir = prepare_state(work, None)
    psi = work / "psi"
    use_psi(psi, "calm.txt")
    settings = {"T3D_PSI_ROOT": str(psi), "T3D_PRESSURE_INTERVAL": "0.2", "T3D_AGENT_SCOPES": "off"}
    written: list[Path] = []
    async with open_daemon(state, DEFAULT_FIXTURE, settings, work / "daemon.log") as daemon:
        http = HttpClient(daemon.port, daemon.token)

        async def rpc(method: str, **params: Any) -> Any:
            reply = await http.request("POST", "/api/dispatch", {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            return reply["result"]

        project = (await rpc("project.create", path=str(state.project), title="notes"))["project_id"]
        main = (await rpc("thread.create", project_id=project, provider="replay", title="Tidy the notes file"))["thread_id"]
        for title in ("Fix the flaky upload test", "Port the CLI to argparse", "Write the release notes", "Profile the startup", "Rename the config keys"):
            await rpc("thread.create", project_id=project, provider="replay", title=title)
        await http.aclose()

        async def shot(browser: Browser, name: str) -> None:
            await trio.sleep(0.4)  # let the last frame paint
            path = out / f"{name}.png"
            await browser.call(browser.driver.save_screenshot, str(path))
            written.append(path)

        async def send(browser: Browser, text: str) -> None:
            await browser.js("const t = document.getElementById('composer-text'); t.value = arguments[0];"
                             "document.querySelector('.composer button[type=submit]').click()", text)

        for dark in (False, True):
            with open_browser(1120, 700, dark=dark) as driver:
                browser = Browser(driver)
                await sign_in(browser, daemon)
                await browser.js("location.hash = '#/t/' + arguments[0]", main)
                if dark:
                    await browser.until("return document.querySelector('.checkpoint-item:not(.unchanged)')", "a checkpoint")
                    await shot(browser, "thread-dark")
                    continue
                await browser.until("return document.getElementById('composer-text')", "the composer")
                await send(browser, "Please READ notes.txt")
                await browser.until("return document.querySelector('.turn.st-completed')", "turn 1 done")
                await send(browser, "Now EDIT notes.txt")
                await browser.until("return document.querySelector('.prompt-item.pending')", "the prompt")
                await shot(browser, "prompt")
                await browser.js("document.querySelector('.prompt-item.pending button.primary').click()")
                await browser.until("return document.querySelector('.checkpoint-item:not(.unchanged) .checkpoint-actions button')", "the checkpoint")
                await browser.js("document.querySelector('.checkpoint-item:not(.unchanged) .checkpoint-actions button').click()")
                await browser.until("return document.querySelector('.diff .dl-add')", "the diff")
                await shot(browser, "diff")
                use_psi(psi, "host_severe.txt")
                await browser.until("return document.querySelector('#pressure[data-level=severe] a')", "the memory banner")
                await shot(browser, "memory")
                use_psi(psi, "calm.txt")
                await browser.until("return document.getElementById('pressure').hidden", "the banner gone")
                await browser.call(driver.set_window_size, 390, 760)
                await shot(browser, "phone-thread")
                await browser.js("location.hash = '#/'")
                await shot(browser, "phone-list")
                await browser.call(driver.get, "about:blank")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_page", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="the database to start from (copied; never changed); python -m bench gen-db writes one")
    parser.add_argument("--out", default="bench-out/web", help="output directory (default bench-out/web)")
    parser.add_argument("--runs", type=int, default=5, help="page loads after the first, cold one (default 5)")
    parser.add_argument("--streams", type=int, default=50, help="threads streaming turns meanwhile (default 50)")
    parser.add_argument("--stream-s", type=float, default=60, help="seconds of long-task watching (default 60)")
    parser.add_argument("--memory-s", type=float, default=600, help="seconds of streaming for the memory samples (default 600)")
    parser.add_argument("--sample-s", type=float, default=30, help="seconds between memory samples (default 30)")
    parser.add_argument("--switch-s", type=float, default=60, help="seconds between changes of the open thread (default 60)")
    parser.add_argument("--pin", metavar="DAEMON:BROWSER", help="CPUs for the daemon (and this driver) and for Chromium, e.g. 0:1 (default: shared)")
    parser.add_argument("--trace", action="store_true", help="trace the renderer while the long tasks are watched: trace.json, and what each long task ran")
    parser.add_argument("--screenshots", metavar="DIR", help="write the docs' screenshots into DIR instead")
    args = parser.parse_args(argv)
    missing = chromium_missing()
    if missing is not None:
        print(f"web_page: {missing}", file=sys.stderr)
        return 2
    Path(args.screenshots or args.out).mkdir(parents=True, exist_ok=True)
    if args.screenshots:
        for path in trio.run(screenshots, Path(args.screenshots)):
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
        return 0
    summary = trio.run(measure, args)
    print(orjson.dumps({k: v for k, v in summary.items() if k != "memory"} | {"memory": {k: v for k, v in summary["memory"].items() if k != "samples"}}, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
