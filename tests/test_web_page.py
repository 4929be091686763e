"""The web page in a real headless Chromium (tests/browser.py), against a real daemon.

Each test signs in through a one-time link, as a person would, and then uses only the
page: the composer, the buttons, the keyboard. The daemon runs in the test's Trio run;
every browser call runs in a worker thread, so the daemon serves meanwhile. Skipped, with
the reason, where Debian's chromium and chromium-driver (or selenium) are missing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from browser import Page, chromium_missing, open_browser
from git_support import make_repo
from harness import Daemon, RpcClient, http, new_thread, open_client, run_turn, start_daemon

READ, EDIT, BASH, COUNT = (
    "Please READ notes.txt",
    "Now EDIT notes.txt",
    "Now run BASH to create a file",
    "COUNT to 200 slowly",
)
PSI = Path(__file__).resolve().parent / "fixtures" / "psi"

pytestmark = pytest.mark.skipif(chromium_missing() is not None, reason=chromium_missing() or "")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """One Chromium for the module (it takes seconds to start); each test signs in to its own
    daemon, on its own port, so their cookies never meet."""
    with open_browser() as chromium:
        chromium.set_script_timeout(20)
        chromium.set_page_load_timeout(30)
        yield chromium


@pytest.fixture
def replay_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's COUNT turn waits up to 60 s for its interrupt (not the default 10)."""
    monkeypatch.setenv("T3D_REPLAY_INTERRUPT_TIMEOUT", "60")


@asynccontextmanager
async def signed_in(driver: Any, daemon: Daemon, width: int = 1280, height: int = 860) -> AsyncIterator[Page]:
    """The page, signed in through a fresh one-time link, its thread list populated; it is
    left (for a blank page) before the daemon stops."""
    page = Page(driver)
    await page.run(driver.set_window_size, width, height)
    status, link = await http(daemon, "POST", "/api/auth/link")
    assert status == 200, link
    await page.get(link["url"])
    await page.wait_js("return document.documentElement.dataset.listPopulated !== undefined", what="the thread list")
    try:
        yield page
    finally:
        with trio.CancelScope(shield=True):
            await page.get("about:blank")


async def open_thread(page: Page, thread_id: str) -> None:
    await page.click(f'.row-link[data-id="{thread_id}"]')
    await page.wait_js("return document.querySelector('#thread-title') && document.querySelector('.composer')", what="the thread view")


async def send(page: Page, text: str) -> None:
    box = await page.css("#composer-text")
    await page.run(box.click)
    await page.run(box.send_keys, text)
    await page.click(".composer button[type=submit]")


TURN_CLASS = (
    "const s = [...document.querySelectorAll('.turn')].find(s => s.querySelector('.turn-title').textContent === 'Turn ' + arguments[0]);"
    "return s ? s.className : ''"
)


async def turn_status(page: Page, ordinal: int) -> str:
    """The classes of turn ``ordinal``'s section ('' while it is not shown)."""
    return str(await page.js(TURN_CLASS, ordinal))


async def wait_turn(page: Page, ordinal: int, status: str, seconds: float = 30) -> None:
    await page.wait(
        lambda: f"st-{status}" in str(page.driver.execute_script(TURN_CLASS, ordinal)).split(),
        seconds,
        f"turn {ordinal} to be {status}",
    )


async def thread_with(client: RpcClient, project: Path, *turns: str, title: str = "notes") -> str:
    thread_id = await new_thread(client, project, title=title)
    for text in turns:
        outcome = await run_turn(client, thread_id, text, decide=lambda r: "allow" if r["data"]["tool_name"] == "Edit" else "deny")
        assert outcome.turn["status"] == "completed"
    return thread_id


async def test_sign_in_by_link_then_a_turn_streams_and_completes(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """The one-time link signs the browser in and leaves the address bar at /, with the cookie
    out of scripts' reach; a turn started from the composer streams its assistant text into
    the page as it arrives (seen mid-stream) and completes, its tool call collapsed with the
    result inside; the used link then shows the page that says to run `t3d ctl open`."""
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_speed=1)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, make_repo(tmp_path / "project"), title="Read the notes")
        status, link = await http(daemon, "POST", "/api/auth/link")
        assert status == 200
        page = Page(driver)
        await page.get(link["url"])
        await page.wait_js("return document.documentElement.dataset.listPopulated === '1'", what="one thread listed")
        assert driver.current_url == f"http://127.0.0.1:{daemon.info.port}/"
        assert await page.js("return document.cookie") == ""  # HttpOnly
        assert "Read the notes" in await page.text_of("#thread-list")
        await open_thread(page, thread_id)
        await page.js(
            "window.__seen = [];"
            "new MutationObserver(() => { for (const el of document.querySelectorAll('.msg.assistant')) __seen.push([el.className, el.textContent]); })"
            ".observe(document.getElementById('turns'), {subtree: true, childList: true, characterData: true, attributes: true});"
        )
        await send(page, READ)
        await wait_turn(page, 1, "completed", 60)
        seen = await page.js("return window.__seen")
        assert any("streaming" in cls for cls, _ in seen), seen
        final = await page.js("return [...document.querySelectorAll('.msg.assistant .text')].map(e => e.textContent)")
        assert final == ["I'll read the file.", "Done. The tool returned: 1\thello | 2\t"]
        assert await page.js("return document.querySelector('.tool-item details').open") is False
        await page.click(".tool-item summary")  # the body is drawn on the toggle event, just after
        await page.wait_js("return document.querySelector('.tool-item .tool-body').textContent.includes('hello')", what="the tool's result")
        assert await page.js("return document.getElementById('composer-text').value") == ""
        await page.get(link["url"])
        body = await page.text_of("body")
        assert "This sign-in link no longer works" in body and "t3d ctl open" in body
        assert "signed in already" in body
        await page.get("about:blank")
        daemon.stop()


async def test_prompts_answered_inline_and_the_turns_diff(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """A prompt shows inline with Allow, Allow for the session and Deny; the title counts it;
    Allow lets the turn finish, whose checkpoint shows the file it changed and, asked, the
    diff; the next prompt is denied from the keyboard (d, a message, Enter) and shows the
    message. Reverting to the first turn's checkpoint (asked first) puts the file back and
    marks the later turns reverted."""
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state")
        project = make_repo(tmp_path / "project")
        async with open_client(daemon) as client:
            thread_id = await thread_with(client, project, READ)
        async with signed_in(driver, daemon) as page:
            await open_thread(page, thread_id)
            await send(page, EDIT)
            allow = await page.css(".prompt-item.pending button.primary")
            assert "Edit" in await page.text_of(".prompt-item.pending .prompt-question")
            await page.wait(lambda: driver.title.startswith("(1)"), what="the prompt counted in the title")
            await page.run(allow.click)
            await wait_turn(page, 2, "completed")
            assert "Allowed" in await page.text_of(".prompt-item .prompt-outcome")
            await page.wait(lambda: driver.title == "t3d", what="the count gone from the title")
            checkpoint = ".turn:last-of-type .checkpoint-item"
            await page.wait_js(f"return document.querySelector('{checkpoint} .checkpoint-title')?.textContent.includes('1 file changed')", what="the checkpoint")
            assert "notes.txt" in await page.text_of(f"{checkpoint} .files")
            await page.click(f"{checkpoint} .checkpoint-actions button")
            await page.wait_js(f"return document.querySelector('{checkpoint} .diff .dl-add')", what="the diff")
            added = await page.js(f"return [...document.querySelectorAll('{checkpoint} .diff .dl-add')].map(e => e.textContent)")
            removed = await page.js(f"return [...document.querySelectorAll('{checkpoint} .diff .dl-del')].map(e => e.textContent)")
            assert "+hello, world" in added and "-hello" in removed
            await send(page, BASH)
            await page.css(".prompt-item.pending")
            await page.js("document.activeElement.blur()")
            await page.keys("d")
            assert await page.js("return document.activeElement.classList.contains('deny-message')")
            await page.keys("not now\n")
            await wait_turn(page, 3, "completed")
            assert "Denied: not now" in await page.text_of(".turn:last-of-type .prompt-outcome")
            assert await trio.Path(project / "notes.txt").read_text() == "hello, world\n"
            await page.click(".turn:first-of-type .checkpoint-actions button:last-child")
            await page.css("dialog#confirm[open]")
            await page.click("#confirm-yes")
            await page.wait(lambda: (project / "notes.txt").read_text() == "hello\n", what="the file put back")
            await page.wait_js("return document.querySelectorAll('.turn.reverted').length === 2", what="turns 2 and 3 marked reverted")
        daemon.stop()


async def test_interrupt_a_long_turn(tmp_path: Path, nursery: trio.Nursery, driver: Any, replay_waits: None) -> None:
    """The replay's long COUNT turn, started from the page, streams until Interrupt is
    pressed, then ends interrupted; the button is off once nothing runs."""
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await thread_with(client, make_repo(tmp_path / "project"), READ, EDIT, BASH)
        async with signed_in(driver, daemon) as page:
            await open_thread(page, thread_id)
            await send(page, COUNT)
            await wait_turn(page, 4, "running")
            await page.wait_js("return !document.querySelector('.thread-actions button').disabled", what="Interrupt enabled")
            await page.click(".thread-actions button")
            await wait_turn(page, 4, "interrupted")
            await page.wait_js("return document.querySelector('.thread-actions button').disabled", what="Interrupt off again")
        daemon.stop()


def use_psi(root: Path, name: str) -> None:
    """Point the host's PSI file at a fixture (atomically, as the kernel's files are)."""
    path = root / "proc" / "pressure" / "memory"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".new")
    temporary.write_bytes((PSI / name).read_bytes())
    os.replace(temporary, path)


async def test_memory_banner_appears_names_the_agent_and_clears(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """While the fixture PSI says severe, a banner names the live agent with a link to its
    thread and a force stop (which asks, then kills it); when the fixture is calm again the
    banner goes."""
    root = tmp_path / "psi"
    use_psi(root, "calm.txt")
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state", psi_root=str(root), pressure_interval=0.1, agent_scopes="off")
        async with open_client(daemon) as client:
            thread_id = await thread_with(client, make_repo(tmp_path / "project"), READ, title="Heavy agent")
        async with signed_in(driver, daemon) as page:
            assert await page.js("return document.getElementById('pressure').hidden") is True
            use_psi(root, "host_severe.txt")
            banner = await page.css("#pressure[data-level=severe]")
            await page.wait_js(f"return document.querySelector('#pressure a[href=\"#/t/{thread_id}\"]')", what="the agent's link")
            text = await page.run(lambda: banner.text)
            assert "severe" in text and "Heavy agent" in text
            await page.click("#pressure button.danger")
            await page.css("dialog#confirm[open]")
            await page.click("#confirm-yes")
            await page.wait_js("return [...document.querySelectorAll('.toast')].some(t => t.textContent.includes('Killed the agent'))", what="the force stop's notice")
            use_psi(root, "calm.txt")
            await page.wait_js("return document.getElementById('pressure').hidden", what="the banner gone")
        daemon.stop()


async def test_reconnect_catches_up_and_sign_out(tmp_path: Path, nursery: trio.Nursery, driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped connection comes back by itself, resuming the thread with after_sequence:
    the turn that ran meanwhile is there, and only the indicator said so. After a gap too
    long to replay the daemon sends a snapshot, merged into the page: the tool call the
    reader opened stays open. Signing out ends the session: the page says how to sign in
    again, and so does a reload."""
    monkeypatch.setenv("T3D_REPLAY_INTERRUPT_TIMEOUT", "0.2")  # the COUNT turn goes on alone
    with trio.fail_after(120):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await thread_with(client, make_repo(tmp_path / "project"), READ)
            async with signed_in(driver, daemon) as page:
                await open_thread(page, thread_id)
                await wait_turn(page, 1, "completed")
                await page.run(driver.execute_cdp_cmd, "Network.enable", {})
                offline = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
                await page.run(driver.execute_cdp_cmd, "Network.emulateNetworkConditions", offline)
                await page.js("window.__t3d.rpc.ws.close()")
                await page.wait_js("return document.getElementById('conn').dataset.state === 'reconnecting'", what="the indicator")
                outcome = await run_turn(client, thread_id, EDIT)
                assert outcome.turn["status"] == "completed"
                online = {**offline, "offline": False}
                await page.run(driver.execute_cdp_cmd, "Network.emulateNetworkConditions", online)
                await page.wait_js("return document.getElementById('conn').dataset.state === 'live'", what="live again")
                await wait_turn(page, 2, "completed")
                bases = await page.js("return window.__t3d.rpc.replies.filter(r => r.method === 'subscribe.thread').map(r => r.base)")
                assert bases[-1] == "replay", bases
                await page.click(".turn:first-of-type .tool-item summary")
                await page.js("document.querySelector('.turn:first-of-type .tool-item').dataset.marked = 'yes'")
                await page.run(driver.execute_cdp_cmd, "Network.emulateNetworkConditions", offline)
                await page.js("window.__t3d.rpc.ws.close()")
                await page.wait_js("return document.getElementById('conn').dataset.state === 'reconnecting'", what="the indicator")
                for text in (BASH, COUNT, "ok", READ, EDIT) * 2:  # more than 128 events
                    await run_turn(client, thread_id, text)
                await page.run(driver.execute_cdp_cmd, "Network.emulateNetworkConditions", online)
                await wait_turn(page, 12, "completed")
                bases = await page.js("return window.__t3d.rpc.replies.filter(r => r.method === 'subscribe.thread').map(r => r.base)")
                assert bases[-1] == "snapshot", bases
                assert await page.js("const el = document.querySelector('[data-marked=yes]'); return !!el && el.querySelector('details').open") is True
                await page.click("#signout")
                await page.css("#signed-out")
                assert await page.js("return document.getElementById('app').hidden") is True
                await page.run(driver.refresh)
                await page.css("#signed-out")
                assert "t3d ctl open" in await page.text_of("#signed-out")
        daemon.stop()


async def test_many_threads_filters_search_and_keyboard(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """With 400 threads the list draws only the rows in view; search and the project filter
    narrow it; j and k open the next and previous thread, and the arrow keys move through
    the list with Enter opening the one in focus."""
    with trio.fail_after(180):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            first = (await client.call("project.create", path=str(tmp_path)))["project_id"]
            (tmp_path / "other").mkdir()
            second = (await client.call("project.create", path=str(tmp_path / "other")))["project_id"]
            for n in range(400):
                await client.call("thread.create", project_id=second if n % 4 == 0 else first, provider="replay", title=f"thread number {n:03d}")
        async with signed_in(driver, daemon) as page:
            await page.wait_js("return document.querySelector('.list-summary .count').textContent === '400 threads'", what="400 threads")
            rows = await page.js("return document.querySelectorAll('.row:not([hidden])').length")
            assert 5 < rows < 60
            await page.js("document.getElementById('thread-list').scrollTop = 1e9")
            await page.wait_js("return [...document.querySelectorAll('.row-title')].some(e => e.textContent === 'thread number 000')", what="the oldest row after scrolling")
            search = await page.css("#thread-search")
            await page.run(search.send_keys, "number 123")
            await page.wait_js("return document.querySelector('.list-summary .count').textContent === '1 of 400 threads'", what="one match")
            await page.run(search.clear)
            await page.run(search.send_keys, " ")
            await page.js("const s = document.getElementById('filter-project'); s.value = arguments[0]; s.dispatchEvent(new Event('change'))", second)
            await page.wait_js("return document.querySelector('.list-summary .count').textContent === '100 of 400 threads'", what="one project's threads")
            await page.js("document.activeElement.blur()")
            await page.keys("j")
            await page.wait_js("return document.getElementById('thread-title')?.textContent === 'thread number 396'", what="j opens the first")
            await page.keys("j")
            await page.wait_js("return document.getElementById('thread-title').textContent === 'thread number 392'", what="j opens the next")
            await page.keys("k")
            await page.wait_js("return document.getElementById('thread-title').textContent === 'thread number 396'", what="k goes back")
            await page.keys("l")
            assert await page.js("return document.activeElement.dataset.id") is not None
            await page.keys("\ue015", "\ue015", "\ue007")  # ArrowDown twice, Enter
            await page.wait_js("return document.getElementById('thread-title').textContent === 'thread number 388'", what="Enter opens the focused row")
        daemon.stop()


async def test_phone_width_shows_one_pane_at_a_time(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """At a phone's width the list fills the screen; opening a thread shows only the thread,
    with a way back to the list."""
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, tmp_path, title="On the phone")
        async with signed_in(driver, daemon, width=390, height=844) as page:
            assert await page.js("return document.getElementById('thread-view').offsetWidth") == 0
            await open_thread(page, thread_id)
            assert await page.js("return document.getElementById('threads-pane').offsetWidth") == 0
            await page.click("a.back")
            await page.wait_js("return document.getElementById('threads-pane').offsetWidth > 300", what="the list again")
        daemon.stop()


def big_edit_fixture(tmp_path: Path, size: int) -> Path:
    """The bundled five-turn recording, its Edit's new text ``size`` characters longer (so the
    wire cuts the tool call's input and the page has to ask item.detail for the rest)."""
    import replay_fixtures

    text = replay_fixtures.DEFAULT_FIXTURE.read_text()
    assert text.count(", world") == 6  # the deltas, the call, the prompt and its answer
    path = tmp_path / "big_edit.jsonl"
    path.write_text(text.replace(", world", ", " + "w" * size))
    return path


async def test_a_cut_result_is_fetched_on_demand_and_older_turns_load(tmp_path: Path, nursery: trio.Nursery, driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool call's input over the wire's 16 KiB arrives cut; opened, the tool call offers
    the rest, which item.detail brings whole. A thread of 12 turns opens with its last 10 and
    a button that loads the first."""
    monkeypatch.setenv("T3D_REPLAY_INTERRUPT_TIMEOUT", "0.2")  # the COUNT turns go on alone
    with trio.fail_after(180):
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(big_edit_fixture(tmp_path, 30_000)))
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, make_repo(tmp_path / "project"), title="Eleven turns")
            for n in range(12):
                await run_turn(client, thread_id, [READ, EDIT, BASH, COUNT, "ok"][n % 5])
        async with signed_in(driver, daemon) as page:
            await open_thread(page, thread_id)
            await wait_turn(page, 12, "completed")
            assert await turn_status(page, 1) == ""
            await page.click(".turn:last-of-type .tool-item summary")
            button = ".turn:last-of-type .tool-body button"
            await page.css(button)  # drawn on the toggle event, just after the click
            assert "Show all of input" in await page.text_of(button)
            pre = ".turn:last-of-type .tool-body pre"
            assert len(await page.text_of(pre)) < 5000
            await page.click(button)
            await page.wait_js(f"return document.querySelector('{pre}').textContent.includes('w'.repeat(30000))", what="the whole input")
            await page.click("button.older")
            await wait_turn(page, 1, "completed")
            await page.wait_js("return document.querySelector('button.older').hidden", what="no more older turns")
        daemon.stop()


async def test_a_subagent_is_reached_from_its_parents_call_and_links_back(tmp_path: Path, nursery: trio.Nursery, driver: Any) -> None:
    """The real CLI's subagent recording: the parent's Agent call links to the subagent's
    thread; that thread's view says whose subagent it is (a link back to the parent) and shows
    the subagent's own prompt, with Interrupt, Force stop and Send disabled (its parent's agent
    runs it: the hint says so); its row in the list says "subagent"."""
    from test_replay_recordings import project_dir, read_recording
    from test_subagent_threads import SUBAGENT

    with trio.fail_after(120):
        project = project_dir(tmp_path)
        daemon = await start_daemon(nursery, tmp_path / "state", replay_fixture=str(SUBAGENT))
        (recorded,) = read_recording(SUBAGENT, project)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project, title="Parent of a subagent")
            outcome = await run_turn(client, thread_id, recorded.prompt or "go")
            assert outcome.turn["status"] == "completed"
        [call] = [i for i in outcome.items if (i.get("data") or {}).get("child_thread_id")]
        child_id = call["data"]["child_thread_id"]
        async with signed_in(driver, daemon) as page:
            await open_thread(page, thread_id)
            link = await page.css(".tool-item .subagent-link")
            assert await page.js("return arguments[0].getAttribute('href')", link) == f"#/t/{child_id}"
            await page.run(link.click)
            await page.wait_js("return !document.querySelector('.thread-parent').hidden", what="the subagent's thread")
            assert "Subagent of Parent of a subagent" in await page.text_of(".thread-parent")
            await page.wait_js("return document.querySelector('.msg.user')", what="the subagent's prompt")
            assert recorded_prompt_start(call) in await page.text_of(".msg.user")
            assert "subagent" in await page.text_of(f'.row-link[data-id="{child_id}"] .row-meta')
            controls = "return ['.thread-actions button', '.composer button[type=submit]'].flatMap(q => [...document.querySelectorAll(q)]).map(b => b.disabled)"
            assert await page.js(controls) == [True, True, True]  # its parent's agent runs it
            assert "its parent's agent runs it" in await page.text_of("#composer-hint")
            await page.click(".thread-parent a")
            await page.wait_js(f"return location.hash === '#/t/{thread_id}' && document.querySelector('.thread-parent').hidden", what="back on the parent")
        daemon.stop()


def recorded_prompt_start(call: dict[str, Any]) -> str:
    """The first words of the prompt the parent gave its subagent (the child's first item)."""
    return str(call["data"]["input"]["prompt"]).split("\n")[0][:40]
