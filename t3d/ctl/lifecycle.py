"""`t3d ctl new|rename|archive|unarchive|delete|move|revert`: a thread's life from a terminal.

Each verb is one mutating call with a fresh ``command_id`` (thread.create, thread.rename,
thread.archive, thread.unarchive, thread.delete, thread.move, checkpoint.revert) and says
what it did in a line or two; ``--json`` prints the daemon's result instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TypeAlias

import orjson
import trio

from t3d.ctl.client import (
    EXIT_OK,
    EXIT_USAGE,
    CtlError,
    Endpoint,
    JsonDict,
    new_command_id,
    open_rpc,
    read_token,
)
from t3d.ctl.shell import project_dir, resolve_thread, thread_page
from t3d.ctl.terminal import err, out
from t3d.domain.model import RUNNABLE_PROVIDERS

RUNTIME_MODES = ("approval-required", "auto-accept-edits", "full-access")

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _thread_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("thread", metavar="THREAD", help="the thread's id (or a unique prefix of it)")


def _worktree_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--worktree", action="store_true", help=f"{what} a new git worktree of the project (under <state dir>/worktrees)"
    )
    parser.add_argument("--branch", metavar="B", help="the worktree's new branch (default t3d/<thread>); implies --worktree")
    parser.add_argument("--base", metavar="REF", help="what the worktree starts from (default HEAD); implies --worktree")


def register(commands: Subparsers, common: argparse.ArgumentParser) -> None:
    new = commands.add_parser(
        "new",
        parents=[common],
        help="create a thread (in a new git worktree with --worktree); prints its id",
        description="Create a thread in a project (made of the directory if it is not one yet). "
        'Start its first turn with `t3d ctl run --thread ID "..."`.',
    )
    new.add_argument("--project", metavar="DIR", help="the project's directory (default: the current one)")
    new.add_argument("--provider", choices=RUNNABLE_PROVIDERS, default="claude", help="the agent (default: claude)")
    new.add_argument("--model", metavar="M", help="model (default: the provider's)")
    new.add_argument("--title", metavar="T", help="title (default: the daemon's)")
    new.add_argument("--mode", choices=RUNTIME_MODES, help="what the agent may do without asking (default approval-required)")
    _worktree_args(new, "work in")
    new.set_defaults(handler=_new)

    rename = commands.add_parser("rename", parents=[common], help="retitle a thread")
    _thread_arg(rename)
    rename.add_argument("title", nargs="+", metavar="TITLE", help="the new title (words are joined with spaces)")
    rename.set_defaults(handler=_rename)

    archive = commands.add_parser(
        "archive", parents=[common], help="archive a thread: its open turns are cancelled and its agent stops"
    )
    _thread_arg(archive)
    archive.set_defaults(handler=_archive)

    unarchive = commands.add_parser("unarchive", parents=[common], help="bring an archived thread back: it takes turns again")
    _thread_arg(unarchive)
    unarchive.set_defaults(handler=_unarchive)

    delete = commands.add_parser(
        "delete",
        parents=[common],
        help="delete a thread, its worktree (if clean, or with --force) and its checkpoints",
    )
    _thread_arg(delete)
    delete.add_argument("--force", action="store_true", help="delete its worktree even with uncommitted changes (they are lost)")
    delete.add_argument("--keep-worktree", action="store_true", help="leave its worktree on disk")
    delete.set_defaults(handler=_delete)

    move = commands.add_parser(
        "move",
        parents=[common],
        help="move an idle thread to the project root or a new worktree; its agent resumes there",
    )
    _thread_arg(move)
    move.add_argument("--root", action="store_true", help="move it to the project's directory")
    _worktree_args(move, "move it to")
    move.set_defaults(handler=_move)

    revert = commands.add_parser(
        "revert",
        parents=[common],
        help="restore a thread's files to how they were after turn TURN (0: before its first turn)",
        description="Restore the thread's files to its checkpoint after turn TURN (0: before its first "
        "turn); files made since are deleted, ignored files are left alone, and the later turns are "
        "marked reverted. Refused while a turn runs.",
    )
    _thread_arg(revert)
    revert.add_argument("turn", metavar="TURN", type=int, help="the turn whose end to go back to (0: before the first)")
    revert.set_defaults(handler=_revert)


def workspace(args: argparse.Namespace) -> Any:
    """The ``workspace`` param the flags ask for: "root", or a worktree spec."""
    if getattr(args, "root", False) and (args.worktree or args.branch or args.base):
        raise CtlError("--root and --worktree (--branch, --base) ask for different places; give one", EXIT_USAGE)
    if not (args.worktree or args.branch or args.base):
        return "root"
    spec = {key: value for key, value in (("branch", args.branch), ("base_ref", args.base)) if value}
    return {"worktree": spec}


def _print(args: argparse.Namespace, result: Any, text: str) -> int:
    out(orjson.dumps(result).decode() + "\n" if args.json else text)
    return EXIT_OK


async def _call(endpoint: Endpoint, method: str, params: Mapping[str, Any]) -> Any:
    async with open_rpc(endpoint, read_token(endpoint.token_path)) as rpc:
        return await rpc.call(method, {**params, "command_id": new_command_id()})


def _checkpoint_note(checkpoints: Any) -> str:
    if not isinstance(checkpoints, dict):
        return ""
    if checkpoints.get("enabled"):
        return f"checkpoints: on, in {checkpoints.get('repository')}\n"
    return f"checkpoints: off; {checkpoints.get('reason')}\n"


async def _new(args: argparse.Namespace, endpoint: Endpoint) -> int:
    project, is_dir = await trio.to_thread.run_sync(project_dir, args.project)
    if not is_dir:
        raise CtlError(f"--project {project} is not a directory; give the project's directory", EXIT_USAGE)
    token = read_token(endpoint.token_path)
    async with open_rpc(endpoint, token) as rpc:
        made = await rpc.call("project.create", {"path": project, "command_id": new_command_id()})
        params: JsonDict = {
            "project_id": (made or {}).get("project_id"),
            "provider": args.provider,
            "workspace": workspace(args),
            "command_id": new_command_id(),
        }
        for key, value in (("model", args.model), ("title", args.title), ("runtime_mode", args.mode)):
            if value:
                params[key] = value
        created = await rpc.call("thread.create", params)
    thread_id = str((created or {}).get("thread_id"))
    row = (await thread_page(endpoint, token, thread_id, turn_limit=1))["thread"]
    where = row.get("worktree_path") or project
    branch = f" on branch {row['branch']}" if row.get("branch") else ""
    result = {**(created or {}), "project_id": params["project_id"], "directory": where, "branch": row.get("branch")}
    if not args.json:
        err(f"thread {thread_id}\n")
    return _print(
        args,
        result,
        f"{row.get('provider')} thread in {where}{branch}\n{_checkpoint_note((created or {}).get('checkpoints'))}"
        f'start its first turn with `t3d ctl run --thread {thread_id} "..."`\n',
    )


async def _rename(args: argparse.Namespace, endpoint: Endpoint) -> int:
    title = " ".join(args.title).strip()
    if not title:
        raise CtlError("the title is empty; give the new title", EXIT_USAGE)
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    result = await _call(endpoint, "thread.rename", {"thread_id": thread_id, "title": title})
    return _print(args, result, f"thread {thread_id} is now titled {title!r}\n")


async def _archive(args: argparse.Namespace, endpoint: Endpoint) -> int:
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    result = await _call(endpoint, "thread.archive", {"thread_id": thread_id})
    return _print(args, result, f"archived thread {thread_id}; `t3d ctl threads --all` still lists it\n")


async def _unarchive(args: argparse.Namespace, endpoint: Endpoint) -> int:
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    result = await _call(endpoint, "thread.unarchive", {"thread_id": thread_id})
    return _print(args, result, f"thread {thread_id} is back from the archive; its next turn starts an agent\n")


def delete_outcome(thread_id: str, result: Mapping[str, Any]) -> str:
    """What ``thread.delete`` did, from its result."""
    lines = [f"deleted thread {thread_id}"]
    worktree = result.get("worktree")
    if isinstance(worktree, dict):
        if worktree.get("removed"):
            lost = worktree.get("discarded") or 0
            lines.append(f"its worktree is removed{f' ({lost} uncommitted files discarded)' if lost else ''}")
        else:
            lines.append(f"its worktree is left: {worktree.get('reason')}")
    if result.get("checkpoint_refs_error"):
        lines.append(f"its checkpoint refs are left: {result['checkpoint_refs_error']}")
    elif result.get("checkpoint_refs_removed"):
        lines.append(f"{result['checkpoint_refs_removed']} checkpoint refs removed")
    return "; ".join(lines) + "\n"


async def _delete(args: argparse.Namespace, endpoint: Endpoint) -> int:
    if args.force and args.keep_worktree:
        raise CtlError("--force deletes the worktree and --keep-worktree keeps it; give one", EXIT_USAGE)
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    params = {"thread_id": thread_id, "force": bool(args.force), "remove_worktree": not args.keep_worktree}
    result = await _call(endpoint, "thread.delete", params)
    return _print(args, result, delete_outcome(thread_id, result if isinstance(result, dict) else {}))


async def _move(args: argparse.Namespace, endpoint: Endpoint) -> int:
    place = workspace(args)
    if place == "root" and not args.root:
        raise CtlError("say where to: --root (the project's directory) or --worktree [--branch B] [--base REF]", EXIT_USAGE)
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    result = await _call(endpoint, "thread.move", {"thread_id": thread_id, "workspace": place})
    got = result if isinstance(result, dict) else {}
    if got.get("worktree_path"):
        text = f"thread {thread_id} now works in {got['worktree_path']} on branch {got.get('branch')}\n"
    else:
        text = f"thread {thread_id} now works in its project's directory\n"
    return _print(args, result, text + "its agent resumes there at its next turn\n")


def revert_outcome(thread_id: str, result: Mapping[str, Any]) -> str:
    ordinal = result.get("ordinal")
    point = "before its first turn" if ordinal == 0 else f"after turn {ordinal}"
    later = result.get("turns_changed") or 0
    return (
        f"restored thread {thread_id}'s files in {result.get('directory')} to how they were {point}: "
        f"{result.get('restored', 0)} restored, {result.get('deleted', 0)} deleted"
        f"{f'; {later} later turns marked reverted' if later else ''}\n"
    )


async def _revert(args: argparse.Namespace, endpoint: Endpoint) -> int:
    if args.turn < 0:
        raise CtlError(f"TURN {args.turn} is not a turn; give 0 (before the first turn) or a turn's number", EXIT_USAGE)
    thread_id = await resolve_thread(endpoint, read_token(endpoint.token_path), args.thread)
    result = await _call(endpoint, "checkpoint.revert", {"thread_id": thread_id, "ordinal": args.turn})
    return _print(args, result, revert_outcome(thread_id, result if isinstance(result, dict) else {}))
