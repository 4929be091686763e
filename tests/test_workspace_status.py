"""Workspace status through the daemon: real repositories, the real spawner, the fake CLI
applying its recorded edits, and a fake `gh` (tests/fixtures/fake_gh) on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from git_support import git, make_repo, real
from harness import (
    TEST_FIXTURES,
    Daemon,
    RpcClient,
    RpcFailed,
    http,
    new_thread,
    open_client,
    run_turn,
    start_daemon,
    wait_until,
)

from t3d.git import forge

READ, EDIT = "Please READ notes.txt", "Now EDIT notes.txt"


async def workspace_note(client: RpcClient, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The next workspace.updated whose status satisfies ``predicate`` (other notifications are read past)."""
    while True:
        note = await client.next_notification()
        if note["kind"] == "workspace.updated" and predicate(note["data"]):
            return dict(note["data"])


async def stats(daemon: Daemon) -> dict[str, Any]:
    _, report = await http(daemon, "GET", "/api/health")
    return {**report["workspace_status"], "checkpoint_git": report["checkpoints"]["git_processes"]}


async def git_processes(daemon: Daemon) -> int:
    s = await stats(daemon)
    return int(s["git_processes"] + s["checkpoint_git"])


async def checks_pass(daemon: Daemon, count: int) -> None:
    """Wait until the service has looked at the watched workspaces ``count`` more times."""
    start = (await stats(daemon))["checks"]

    async def done() -> bool:
        return bool((await stats(daemon))["checks"] >= start + count)

    await wait_until(done)


def install_fake_gh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake gh first on PATH (seen by the daemon started after this); its fixture dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    gh_dir = tmp_path / "gh"
    gh_dir.mkdir()
    wrapper = bin_dir / "gh"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{TEST_FIXTURES / "fake_gh"}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GH_DIR", str(gh_dir))
    return gh_dir


def on_github(repo: Path, branch: str = "main") -> None:
    """``branch`` tracks origin/<branch>, origin being a GitHub URL (no network is used)."""
    if git(repo, "remote") != "origin":
        git(repo, "remote", "add", "origin", "https://github.com/acme/widgets.git")
    git(repo, "update-ref", f"refs/remotes/origin/{branch}", "HEAD")
    git(repo, "config", f"branch.{branch}.remote", "origin")
    git(repo, "config", f"branch.{branch}.merge", f"refs/heads/{branch}")


def gh_calls(gh_dir: Path) -> int:
    path = gh_dir / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_a_watching_shell_gets_each_thread_s_status_and_an_edit_moves_it(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A shell subscription asking for workspaces gets rows carrying each thread's
    ``workspace``, then ``workspace.updated`` with the branch, counts and last commit; a turn
    that edits a file is followed by a status with it unstaged, and shell rows carry it too."""
    project = make_repo(tmp_path / "repo")
    (project / "scratch.txt").write_text("untracked\n")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.2)
        async with open_client(daemon) as actor, open_client(daemon) as watcher:
            thread_id = await new_thread(actor, project)
            reply = await watcher.call("subscribe.shell", workspace=True)
            assert reply["workspace"] is True
            status = await workspace_note(watcher, lambda w: w["state"] == "ok")
            assert status["path"] == str(project) and status["repository"] == str(project)
            assert (status["branch"], status["detached"], status["upstream"]) == ("main", False, None)
            assert (status["staged"], status["unstaged"], status["untracked"], status["conflicted"]) == (0, 0, 1, 0)
            assert status["last_commit"]["subject"] == "initial" and status["head"] == git(project, "rev-parse", "HEAD")
            assert status["in_process"] is True and "pr" not in status  # no upstream on a forge
            _, shell = await http(daemon, "GET", "/api/shell")
            [row] = [t for t in shell["threads"] if t["id"] == thread_id]
            assert row["workspace"] == status

            await run_turn(actor, thread_id, READ)
            await run_turn(actor, thread_id, EDIT)
            edited = await workspace_note(watcher, lambda w: w["unstaged"] == 1)
            assert (edited["staged"], edited["untracked"]) == (0, 1)
            await actor.call("thread.rename", thread_id=thread_id, title="renamed")
            row_event = await watcher.wait_event(lambda d: d["kind"] == "shell.updated" and d["entity"]["title"] == "renamed")
            assert row_event["entity"]["workspace"]["unstaged"] == 1
        daemon.stop()


async def test_a_steady_turn_costs_one_git_process_and_idle_watching_costs_none(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With a shell and a thread subscription watching: a turn that edits a file costs its
    checkpoint's 4 git processes and one git status; a turn that changes no file costs the
    checkpoint's 1 and no status (its capture's tree is the last one seen there); idle, the
    looks at the watched workspace start no git process at all."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(90):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as actor, open_client(daemon) as watcher:
            thread_id = await new_thread(actor, project)
            await watcher.call("subscribe.shell", workspace=True)
            await watcher.call("subscribe.thread", thread_id=thread_id, workspace=True)
            await workspace_note(watcher, lambda w: w["state"] == "ok")

            async def turn(text: str, ordinal: int) -> int:
                before = await git_processes(daemon)
                await run_turn(actor, thread_id, text)
                await actor.wait_event(lambda d: d["kind"] == "checkpoint.updated" and d["entity"]["ordinal"] == ordinal)
                await checks_pass(daemon, 3)
                return await git_processes(daemon) - before

            await turn(READ, 1)  # the first capture there: a tree not seen before
            status_git = (await stats(daemon))["git_processes"]
            assert await turn(EDIT, 2) == 5
            assert (await stats(daemon))["git_processes"] - status_git == 1
            refreshes = (await stats(daemon))["refreshes"]
            assert await turn("Now run BASH to create a file", 3) == 1  # the fake runs no command
            assert (await stats(daemon))["refreshes"] == refreshes

            idle = await git_processes(daemon)
            await checks_pass(daemon, 10)
            assert await git_processes(daemon) == idle, "looking at an idle workspace ran git"
        daemon.stop()


async def test_nothing_is_looked_at_until_someone_watches(tmp_path: Path, nursery: trio.Nursery) -> None:
    """With no subscription asking for workspaces (plain ones included), no look and no git
    process happens and rows say ``unknown``; a thread subscription with ``workspace: true``
    gets the thread's value at once and then the read one; after it leaves, looks stop."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as actor, open_client(daemon) as watcher:
            thread_id = await new_thread(actor, project)  # a plain thread subscription
            await actor.call("subscribe.shell")
            await trio.sleep(1.0)  # ten intervals: an absence cannot be waited for
            assert (await stats(daemon))["checks"] == 0 and (await stats(daemon))["git_processes"] == 0
            _, shell = await http(daemon, "GET", "/api/shell")
            assert shell["threads"][0]["workspace"] == {"path": str(project), "state": "unknown"}

            sub = (await watcher.call("subscribe.thread", thread_id=thread_id, workspace=True))["sub"]
            first = await workspace_note(watcher, lambda w: True)
            assert first == {"path": str(project), "state": "unknown"}
            assert (await workspace_note(watcher, lambda w: True))["state"] == "ok"
            await watcher.call("unsubscribe", sub=sub)
            await checks_pass(daemon, 0)
            stopped = (await stats(daemon))["checks"]
            await trio.sleep(1.0)
            assert (await stats(daemon))["checks"] == stopped
        daemon.stop()


async def test_ahead_behind_follow_commits_and_fetches(tmp_path: Path, nursery: trio.Nursery) -> None:
    """workspace.status gives upstream and ahead/behind; a local commit is seen (a full
    status), and a fetch that only moves the upstream costs one rev-list, not a status."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    project = make_repo(tmp_path / "repo")
    git(project, "remote", "add", "origin", str(remote))
    git(project, "push", "-q", "-u", "origin", "main")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            now = (await client.call("workspace.status", thread_id=thread_id))["workspace"]
            assert (now["upstream"], now["ahead"], now["behind"]) == ("origin/main", 0, 0)

            (project / "local.txt").write_text("local\n")
            git(project, "add", "local.txt")
            git(project, "commit", "-q", "-m", "local work")
            now = (await client.call("workspace.status", thread_id=thread_id))["workspace"]
            assert (now["ahead"], now["behind"], now["last_commit"]["subject"]) == (1, 0, "local work")

            other = tmp_path / "other"
            git(tmp_path, "clone", "-q", str(remote), str(other))
            (other / "theirs.txt").write_text("theirs\n")
            git(other, "add", "theirs.txt")
            git(other, "commit", "-q", "-m", "their work")
            git(other, "push", "-q", "origin", "main")
            before = await stats(daemon)
            git(project, "fetch", "-q", "origin")
            now = (await client.call("workspace.status", thread_id=thread_id))["workspace"]
            assert (now["ahead"], now["behind"]) == (1, 1)
            after = await stats(daemon)
            assert after["refreshes"]["ahead_behind"] == before["refreshes"]["ahead_behind"] + 1
            assert after["refreshes"]["full"] == before["refreshes"]["full"]
            assert after["git_processes"] == before["git_processes"] + 1

            # Cached: asking again with nothing changed runs no git; refresh runs it anyway.
            await client.call("workspace.status", thread_id=thread_id)
            assert (await stats(daemon))["git_processes"] == after["git_processes"]
            await client.call("workspace.status", thread_id=thread_id, refresh=True)
            assert (await stats(daemon))["git_processes"] == after["git_processes"] + 1
            with pytest.raises(RpcFailed) as missing:
                await client.call("workspace.status", thread_id="nope")
            assert missing.value.code == -32001
        daemon.stop()


async def test_a_pull_request_is_shown_with_its_checks(tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    """A branch tracking a GitHub remote gets its pull request from `gh pr view` (the fake),
    with the checks summarized; a branch without one says state none."""
    gh_dir = install_fake_gh(tmp_path, monkeypatch)
    (gh_dir / "pr-main.json").write_text(
        '{"number": 42, "state": "OPEN", "url": "https://github.com/acme/widgets/pull/42", "statusCheckRollup": '
        '[{"__typename": "CheckRun", "status": "COMPLETED", "conclusion": "SUCCESS"},'
        ' {"__typename": "CheckRun", "status": "COMPLETED", "conclusion": "FAILURE"}]}'
    )
    project = make_repo(tmp_path / "repo")
    on_github(project)
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as client:
            await new_thread(client, project)
            await client.call("subscribe.shell", workspace=True)
            status = await workspace_note(client, lambda w: w.get("pr", {}).get("state") == "open")
            assert status["upstream"] == "origin/main"
            assert status["pr"] == {
                "forge": "github", "state": "open", "number": 42, "url": "https://github.com/acme/widgets/pull/42",
                "checks": {"state": "failing", "total": 2, "passed": 1, "failed": 1, "pending": 0},
            }  # fmt: skip
            [call] = (gh_dir / "calls").read_text().splitlines()
            assert call.split("\t") == ["pr", "view", "main", "--repo", "acme/widgets", "--json", "number,state,url,statusCheckRollup"]
        daemon.stop()


async def test_a_failing_gh_backs_off_and_its_error_is_shown(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rate-limited gh is shown as such, logged once, and asked again only on the backoff
    schedule (never in a tight loop); once it answers, the error is gone. The schedule's
    constants are shortened here (0.3 s doubling to 1.2 s) so the test is quick."""
    monkeypatch.setattr(forge, "INTERVAL_S", 0.3)
    monkeypatch.setattr(forge, "BACKOFF_MIN_S", 0.3)
    monkeypatch.setattr(forge, "BACKOFF_MAX_S", 1.2)
    gh_dir = install_fake_gh(tmp_path, monkeypatch)
    (gh_dir / "mode").write_text("rate_limit")
    project = make_repo(tmp_path / "repo")
    on_github(project)
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as client:
            await new_thread(client, project)
            await client.call("subscribe.shell", workspace=True)
            status = await workspace_note(client, lambda w: "error" in w.get("pr", {}))
            assert status["pr"]["error"]["kind"] == "rate_limited" and status["pr"]["state"] == "unknown"
            start = trio.current_time()
            await wait_until(lambda: gh_calls(gh_dir) >= 5)
            # 1 + 0.3 + 0.6 + 1.2 + 1.2: the fifth call comes no sooner than 3.3 s after the first.
            assert trio.current_time() - start >= 3.0
            assert caplog.text.count("rate-limiting") == 1

            (gh_dir / "mode").write_text("no_pr")
            status = await workspace_note(client, lambda w: w.get("pr", {}).get("state") == "none")
            assert "error" not in status["pr"]
        daemon.stop()


async def test_a_missing_gh_is_a_status_found_without_a_process(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With no gh on PATH the pull request says not_installed and how to fix it; no forge
    process is started and it is logged once, at info."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("git", "sh"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(forge, "BACKOFF_MIN_S", 0.1)
    monkeypatch.setattr(forge, "BACKOFF_MAX_S", 0.1)
    project = make_repo(tmp_path / "repo")
    on_github(project)
    caplog.set_level("INFO", logger="t3d.git.forge")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as client:
            await new_thread(client, project)
            await client.call("subscribe.shell", workspace=True)
            status = await workspace_note(client, lambda w: "error" in w.get("pr", {}))
            assert status["pr"]["error"]["kind"] == "not_installed"
            assert "install GitHub CLI" in status["pr"]["error"]["message"]

            async def asked_often() -> bool:
                return bool((await stats(daemon))["pull_requests"]["errors"].get("not_installed", 0) >= 3)

            await wait_until(asked_often)
            assert (await stats(daemon))["pull_requests"]["processes"] == 0
            assert caplog.text.count("gh is not installed") == 1
        daemon.stop()


async def test_a_hanging_gh_does_not_delay_git(tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/test_spawner.py's pool test through the real feature: six watched worktrees on
    GitHub branches whose `gh` hangs fill the forge pool (4 running, the rest waiting), and
    meanwhile a turn's checkpoint and the workspace status after it (git) complete. Once gh
    answers, the pull requests show."""
    gh_dir = install_fake_gh(tmp_path, monkeypatch)
    (gh_dir / "mode").write_text("hang")
    project = make_repo(tmp_path / "repo")
    on_github(project)
    worktrees = []
    for n in range(6):
        path = tmp_path / f"wt{n}"
        git(project, "worktree", "add", "-q", "-b", f"b{n}", str(path))
        on_github(path, f"b{n}")
        (gh_dir / f"pr-b{n}.json").write_text(f'{{"number": {n + 1}, "state": "OPEN", "url": "u{n}", "statusCheckRollup": []}}')
        worktrees.append(path)
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as actor, open_client(daemon) as watcher:
            threads = [await new_thread(actor, path) for path in worktrees]
            await watcher.call("subscribe.shell", workspace=True)

            async def forge_full() -> bool:
                _, spawner = await http(daemon, "GET", "/api/spawner")
                return bool(spawner["pools"]["forge"]["busy"] == 4)

            await wait_until(forge_full)
            await run_turn(actor, threads[0], READ)
            await run_turn(actor, threads[0], EDIT)
            edited = await workspace_note(watcher, lambda w: w["path"] == str(worktrees[0]) and w["unstaged"] == 1)
            assert edited["pr"]["state"] == "unknown"
            assert await forge_full(), "git finished while every forge slot was still held by a hung gh"
            assert gh_calls(gh_dir) == 4

            (gh_dir / "release").write_text("")
            seen: set[str] = set()
            while len(seen) < 6:
                status = await workspace_note(watcher, lambda w: w.get("pr", {}).get("state") == "open")
                seen.add(status["path"])
            assert seen == {str(p) for p in worktrees}
        daemon.stop()


async def test_status_off_leaves_rows_alone_and_says_so(tmp_path: Path, nursery: trio.Nursery) -> None:
    """--workspace-status off: rows have no workspace field, subscribing with workspace: true
    says false, and workspace.status is unavailable, naming the setting."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(30):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status="off")
        async with open_client(daemon) as client:
            thread_id = await new_thread(client, project)
            assert (await client.call("subscribe.shell", workspace=True))["workspace"] is False
            _, shell = await http(daemon, "GET", "/api/shell")
            assert "workspace" not in shell["threads"][0]
            with pytest.raises(RpcFailed) as off:
                await client.call("workspace.status", thread_id=thread_id)
            assert off.value.code == -32003 and "--workspace-status" in str(off.value.message)
        daemon.stop()


async def test_a_moved_thread_s_row_carries_its_new_workspace(tmp_path: Path, nursery: trio.Nursery) -> None:
    """thread.move to a new worktree: the row published for the move already names the new
    directory, and a watcher then gets that directory's status (its own branch)."""
    project = make_repo(tmp_path / "repo")
    with trio.fail_after(60):
        daemon = await start_daemon(nursery, tmp_path / "state", workspace_status_interval=0.1)
        async with open_client(daemon) as actor, open_client(daemon) as watcher:
            thread_id = await new_thread(actor, project)
            await watcher.call("subscribe.shell", workspace=True)
            await workspace_note(watcher, lambda w: w["state"] == "ok")
            moved = await actor.call("thread.move", thread_id=thread_id, workspace={"worktree": {}})
            row = await watcher.wait_event(lambda d: d["kind"] == "shell.updated" and d["entity"]["worktree_path"])
            assert row["entity"]["workspace"]["path"] == moved["worktree_path"]
            status = await workspace_note(watcher, lambda w: w["path"] == moved["worktree_path"] and w["state"] == "ok")
            assert status["branch"] == moved["branch"] and real(status["repository"]) == real(moved["worktree_path"])
        daemon.stop()
