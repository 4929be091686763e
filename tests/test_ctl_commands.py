"""`t3d ctl` thread commands as a user runs them: real `t3d ctl` processes against one
`t3d serve` (replay speed 0) on real git repositories.

new, threads (its columns, filters, prefixes), projects, rename, archive, delete, move,
diff, revert, log and completion; errors that name ctl commands; --json everywhere.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio
from ctl_support import T3D, Served, ctl, dispatch, new_thread, turn_statuses
from git_support import git, make_repo
from test_cli import clean_env, start_serve

from t3d.cli import build_parser
from t3d.ctl.client import Endpoint
from t3d.ctl.completion import command_tree
from t3d.ctl.follow import read_history

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_serve(tmp_path_factory.mktemp("ctl"), clean_env())
    yield served
    assert served.stop() == 0


async def run_turns(daemon: Served, thread_id: str, *prompts: str) -> None:
    for prompt in prompts:
        ran = await ctl(daemon, "run", "--thread", thread_id, "--approve", "all", prompt)
        assert ran.status in (0, 1), ran.err


TURNS = ("Please READ notes.txt", "Now EDIT notes.txt", "Now run BASH to create a file", "COUNT to 200 slowly", "Say ok")


async def test_new_threads_projects_and_id_prefixes(daemon: Served, tmp_path: Path) -> None:
    """`new` makes a thread (with checkpoints in a repository) and prints its id; `threads`
    shows it by a short id with its project, status and last turn; every command takes a
    unique prefix; the filters, -q, --json and `projects` agree; a prefix shared by two
    threads is a usage error naming them, an unknown thread says how to list threads."""
    repo = make_repo(tmp_path / "shop")
    with trio.fail_after(120):
        made = await ctl(daemon, "new", "--provider", "replay", "--project", str(repo), "--title", "shop work")
        assert made.status == 0, made.err
        assert f"checkpoints: on, in {repo}" in made.out
        thread_id = made.err.split()[1]
        await run_turns(daemon, thread_id[:10], TURNS[0])
        table = await ctl(daemon, "threads", "--project", str(repo))
        assert table.status == 0, table.err
        header, row = table.out.splitlines()
        assert header.split()[:4] == ["ID", "PROJECT", "PROVIDER", "STATUS"]
        assert re.match(rf"^{thread_id[:8]}\w*\s+shop\s+replay\s+idle\s+#1 completed \d+s ago\s+1\s+shop work$", row), row
        rows = orjson.loads((await ctl(daemon, "threads", "--project", "shop", "--json")).out)
        assert [r["id"] for r in rows] == [thread_id]
        assert rows[0]["last_turn"]["status"] == "completed" and rows[0]["project_path"] == str(repo)
        assert (await ctl(daemon, "threads", "-q", "--project", str(repo))).out == f"{thread_id}\n"
        none = await ctl(daemon, "threads", "--project", str(repo), "--status", "running")
        assert none.status == 0 and none.out.startswith("no thread matches")
        projects = await ctl(daemon, "projects")
        assert any(line.split()[-1] == str(repo) and line.split()[1] == "1" for line in projects.out.splitlines())
        assert str(repo) in [p["path"] for p in orjson.loads((await ctl(daemon, "projects", "--json")).out)]

        unknown = await ctl(daemon, "log", "nosuchthread")
        assert unknown.status == 1
        assert "thread 'nosuchthread' does not exist; list threads with `t3d ctl threads`" in unknown.err
        no_project = await ctl(daemon, "threads", "--project", "/nowhere")
        assert no_project.status == 2 and "`t3d ctl projects`" in no_project.err
        twins = [await dispatch(daemon, "thread.create", project_id=rows[0]["project_id"], provider="replay", thread_id=f"twin-{n}") for n in (1, 2)]
        assert twins
        shared = await ctl(daemon, "rename", "twin", "x")
        assert shared.status == 2 and "several thread ids (twin-1, twin-2)" in shared.err


async def test_rename_archive_delete_and_move(daemon: Served, tmp_path: Path) -> None:
    """A thread made in a worktree on a named branch works there; `rename` retitles it;
    `archive` hides it from `threads` (not from --all) and a turn on it is refused with the
    ctl command to use; `move --root` and `move --worktree` move an idle one; `delete`
    refuses a dirty worktree naming --force, and --force removes it."""
    repo = make_repo(tmp_path / "repo")
    with trio.fail_after(120):
        made = await ctl(daemon, "new", "--provider", "replay", "--project", str(repo), "--branch", "feature/x", "--json")
        assert made.status == 0, made.err
        result = orjson.loads(made.out)
        thread_id, worktree = result["thread_id"], Path(result["directory"])
        assert result["branch"] == "feature/x" and worktree != repo and (worktree / "notes.txt").exists()
        assert git(worktree, "rev-parse", "--abbrev-ref", "HEAD") == "feature/x"

        renamed = await ctl(daemon, "rename", thread_id, "a", "new", "name")
        assert renamed.status == 0 and "'a new name'" in renamed.out
        assert (await dispatch(daemon, "thread.snapshot", thread_id=thread_id))["thread"]["title"] == "a new name"

        moved = await ctl(daemon, "move", thread_id, "--root")
        assert moved.status == 0, moved.err
        assert "now works in its project's directory" in moved.out
        moved = await ctl(daemon, "move", thread_id, "--worktree", "--json")
        assert moved.status == 0, moved.err
        worktree = Path(orjson.loads(moved.out)["worktree_path"])
        nowhere = await ctl(daemon, "move", thread_id)
        assert nowhere.status == 2 and "--root" in nowhere.err

        archived = await ctl(daemon, "archive", thread_id)
        assert archived.status == 0, archived.err
        assert thread_id not in (await ctl(daemon, "threads", "-q")).out
        assert thread_id in (await ctl(daemon, "threads", "-q", "--all")).out
        assert thread_id in (await ctl(daemon, "threads", "-q", "--status", "archived")).out
        refused = await ctl(daemon, "run", "--thread", thread_id, "hello")
        assert refused.status == 1
        assert f"thread '{thread_id}' is archived; bring it back with `t3d ctl unarchive {thread_id}`" in refused.err
        back = await ctl(daemon, "unarchive", thread_id[:9])
        assert back.status == 0, back.err
        assert thread_id in (await ctl(daemon, "threads", "-q")).out

        (worktree / "scratch.txt").write_text("not committed\n")
        dirty = await ctl(daemon, "delete", thread_id)
        assert dirty.status == 1
        assert "has uncommitted changes (scratch.txt)" in dirty.err and "rerun `t3d ctl delete` with --force" in dirty.err
        gone = await ctl(daemon, "delete", thread_id, "--force")
        assert gone.status == 0, gone.err
        assert gone.out.startswith(f"deleted thread {thread_id}; its worktree is removed (1 uncommitted files discarded)")
        assert not worktree.exists()
        assert (await ctl(daemon, "log", thread_id)).status == 1


async def test_diff_revert_and_log(daemon: Served, tmp_path: Path) -> None:
    """After the replay's five turns: `diff THREAD 2` is turn 2's edit of notes.txt (plain:
    stdout is a pipe); `diff THREAD` is everything; a turn that changed nothing says so;
    `revert THREAD 1` restores the file and marks the later turns reverted, which `log`
    shows; `log --turns 2` shows the last two and says older ones are left out; `log
    --json` is one line per turn; reading back in pages of two with `before` finds all five
    in order."""
    repo = make_repo(tmp_path / "proj")
    with trio.fail_after(180):
        thread_id = await new_thread(daemon, repo)
        await run_turns(daemon, thread_id, *TURNS)
        statuses = await turn_statuses(daemon, thread_id)
        assert statuses[:3] + statuses[4:] == ["completed"] * 4  # turn 4 ends as recorded (interrupted)
        assert (repo / "notes.txt").read_text() == "hello, world\n"

        two = await ctl(daemon, "diff", thread_id, "2")
        assert two.status == 0, two.err
        assert "\x1b[" not in two.out
        assert "--- a/notes.txt" in two.out and "-hello\n" in two.out and "+hello, world\n" in two.out
        whole = await ctl(daemon, "diff", thread_id, "--json")
        assert orjson.loads(whole.out)["from_ordinal"] == 0 and orjson.loads(whole.out)["to_ordinal"] == 5
        assert "+hello, world" in orjson.loads(whole.out)["diff"]
        quiet = await ctl(daemon, "diff", thread_id, "1")
        assert (quiet.status, quiet.out) == (0, "") and "no changes in turn 1" in quiet.err
        bad = await ctl(daemon, "diff", thread_id, "two")
        assert bad.status == 2 and "A..B" in bad.err

        reverted = await ctl(daemon, "revert", thread_id, "1")
        assert reverted.status == 0, reverted.err
        assert "to how they were after turn 1: 1 restored, 0 deleted; 4 later turns marked reverted" in reverted.out
        assert (repo / "notes.txt").read_text() == "hello\n"

        log = await ctl(daemon, "log", thread_id, "--turns", "2")
        assert log.status == 0, log.err
        assert "(older turns left out; --turns 4 or --all shows more)" in log.out
        assert re.findall(r"^── turn (\d) · ", log.out, re.MULTILINE) == ["4", "5"]
        assert "\u203a COUNT to 200 slowly" in log.out and "── turn 5 completed in " in log.out and "· reverted ──" in log.out
        everything = await ctl(daemon, "log", thread_id, "--all")
        assert re.findall(r"^── turn (\d) · ", everything.out, re.MULTILINE) == ["1", "2", "3", "4", "5"]
        assert "⏺ Edit(notes.txt)" in everything.out
        lines = [orjson.loads(line) for line in (await ctl(daemon, "log", thread_id, "--json", "--all")).out.splitlines()]
        assert [line["turn"]["ordinal"] for line in lines] == [1, 2, 3, 4, 5]
        assert lines[0]["items"][0]["text"] == "Please READ notes.txt"

        endpoint = Endpoint("127.0.0.1", daemon.port, daemon.state_dir / "auth" / "token")
        history, more = await read_history(endpoint, daemon.token, thread_id, None, page_turns=2)
        assert [t["ordinal"] for t in history["turns"]] == [1, 2, 3, 4, 5] and not more
        assert {i["turn_id"] for i in history["items"]} == {t["id"] for t in history["turns"]}
        history, more = await read_history(endpoint, daemon.token, thread_id, 3, page_turns=2)
        assert [t["ordinal"] for t in history["turns"]] == [3, 4, 5] and more


async def test_bash_completion_offers_commands_flags_choices_and_thread_ids(daemon: Served, tmp_path: Path) -> None:
    """The bash script from `ctl completion bash`, loaded into a real bash, completes ctl
    subcommands, a flag's choices, and a THREAD with the ids of the daemon named by the
    --state-dir and --port typed before it."""
    if shutil.which("bash") is None:
        pytest.skip("no bash here")
    with trio.fail_after(60):
        thread_id = await new_thread(daemon, tmp_path)
        script = await ctl(daemon, "completion", "bash")
        assert script.status == 0, script.err
        (tmp_path / "t3d.bash").write_text(script.out)

        async def complete(line: str) -> list[str]:
            words = line.split(" ")
            probe = (
                f"source {tmp_path / 't3d.bash'}; PATH={Path(T3D).parent}:$PATH; "
                f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; _t3d; "
                'printf "%s\\n" "${COMPREPLY[@]}"'
            )
            done = await trio.run_process(["bash", "--norc", "-c", probe], capture_stdout=True, capture_stderr=True, check=False)
            assert done.returncode == 0, done.stderr
            return sorted(done.stdout.decode().split())

        assert await complete("t3d ct") == ["ctl"]
        assert await complete("t3d ctl at") == ["attach"]
        assert await complete("t3d ctl attach --appr") == ["--approve"]
        assert await complete("t3d ctl attach --approve ") == ["all", "none"]
        assert await complete("t3d ctl completion ") == ["bash", "zsh"]
        ids = await complete(f"t3d ctl --state-dir {daemon.state_dir} --port {daemon.port} attach ")
        assert thread_id in ids
        assert await complete(f"t3d ctl --state-dir {daemon.state_dir} --port {daemon.port} attach {thread_id} ") == []


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (apt-get install zsh; .ci/run installs it)")
async def test_zsh_completion_is_valid_zsh(tmp_path: Path) -> None:
    """The zsh script parses (zsh -n) and, loaded after compinit, registers _t3d for t3d."""
    with trio.fail_after(60):
        script = await trio.run_process([T3D, "ctl", "completion", "zsh"], capture_stdout=True)
        (tmp_path / "t3d.zsh").write_bytes(script.stdout)
        syntax = await trio.run_process(["zsh", "-n", str(tmp_path / "t3d.zsh")], capture_stderr=True, check=False)
        assert syntax.returncode == 0, syntax.stderr
        probe = f"autoload -U compinit; compinit -u -d {tmp_path}/zcompdump; source {tmp_path}/t3d.zsh; print -r -- $_comps[t3d]"
        loaded = await trio.run_process(["zsh", "-f", "-c", probe], capture_stdout=True, capture_stderr=True, check=False, env={**clean_env(), "HOME": str(tmp_path)})
        assert loaded.stdout.decode().strip() == "_t3d", loaded.stderr


def test_every_ctl_command_takes_json_and_lists_the_exit_statuses() -> None:
    """Each `t3d ctl` subcommand accepts --json and its --help ends with the exit statuses;
    the README names every one of them."""
    parser = build_parser()
    ctl_tree = command_tree(parser)["commands"]["ctl"]["commands"]
    readme = README.read_text()
    sub = next(a for a in next(a for a in parser._actions if a.dest == "command").choices["ctl"]._actions if a.dest == "ctl_command")
    for name, node in ctl_tree.items():
        assert "--json" in node["options"], name
        assert "exit status:" in (sub.choices[name].epilog or ""), name
        assert f"t3d ctl {name}" in readme, name
