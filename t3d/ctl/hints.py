"""The daemon's next-step hints, said the way a `t3d ctl` user takes the step. Pure.

The daemon's messages name the API's way forward ("list threads with GET /api/shell",
"pass force: true"); from `t3d ctl` the way forward is a ctl command. `ctl_hints` swaps
each known hint for the command that does the same and leaves every other word of the
daemon's message as it is. A hint whose command this build of ctl lacks is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

# (the daemon's words, the ctl command they need, the replacement). A replacement may use
# the thread id a message names (\g<thread>).
_THREAD = r"thread '(?P<thread>[^']+)'"
_Replacement = str | Callable[[re.Match[str]], str]
HINTS: tuple[tuple[re.Pattern[str], str | None, _Replacement], ...] = (
    (re.compile(r"list threads with GET /api/shell"), "threads", "list threads with `t3d ctl threads`"),
    (
        re.compile(r"create it with project\.create"),
        "projects",
        "list projects with `t3d ctl projects`; `t3d ctl new --project DIR` makes one",
    ),
    (re.compile(r"list them with requests\.pending"), "requests", "list them with `t3d ctl requests`"),
    (
        re.compile(_THREAD + r" is archived; start a new thread"),
        "unarchive",
        "thread '\\g<thread>' is archived; bring it back with `t3d ctl unarchive \\g<thread>` "
        "or start a new thread with `t3d ctl new`",
    ),
    (
        re.compile(_THREAD + r" is archived; start a new thread"),
        "new",
        "thread '\\g<thread>' is archived; start a new thread with `t3d ctl new`",
    ),
    (
        re.compile(_THREAD + r" has a turn running or queued; interrupt it or wait(?P<rest> for it to end before you| for it to end,|,)"),
        "stop",
        "thread '\\g<thread>' has a turn running or queued; stop it with `t3d ctl stop \\g<thread>` or wait\\g<rest>",
    ),
    (
        re.compile(_THREAD + r" has a turn running or queued; wait for it to end, then move it"),
        "stop",
        "thread '\\g<thread>' has a turn running or queued; wait for it to end (or stop it with "
        "`t3d ctl stop \\g<thread>`), then move it",
    ),
    (
        re.compile(r"pass force: true to delete them with the worktree, or remove_worktree: false to keep it"),
        "delete",
        "rerun `t3d ctl delete` with --force to delete them with the worktree, or with --keep-worktree to keep it",
    ),
    (
        re.compile(r"so a thread there cannot have a worktree; use workspace \"root\""),
        "new",
        "so a thread there cannot have a worktree; leave out --worktree",
    ),
    (
        re.compile(r"thread (?P<thread>\S+) has no checkpoint (?P<n>\d+); list its checkpoints in the thread's checkpoint items"),
        "log",
        "thread \\g<thread> has no checkpoint \\g<n>; see its turns with `t3d ctl log \\g<thread>`",
    ),
    (
        re.compile(r"follow it with db\.job, or stop it with db\.cancel"),
        "db",
        "wait for it to end (the `t3d ctl db` command that started it shows its progress; "
        "Ctrl-C there stops it), then run this again",
    ),
    (
        re.compile(r"unknown method '(?P<method>[^']+)'; server\.hello lists the methods"),
        None,
        "the daemon does not offer \\g<method>; it is older than this t3d ctl "
        "(`t3d ctl status` shows its version): restart it from this installation",
    ),
)


def ctl_hints(message: str, commands: Collection[str] | None = None) -> str:
    """``message`` with each known API hint replaced by the ctl command for it; a hint whose
    command is not in ``commands`` (when given) stays as the daemon said it."""
    for pattern, needs, replacement in HINTS:
        if needs is not None and commands is not None and needs not in commands:
            continue
        message = pattern.sub(replacement, message)
    return message
