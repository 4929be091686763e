"""The API as JSON Schema (draft-07): every method's params and result, and the notifications.

`METHODS` is the one declarative table of the JSON-RPC methods: their params (as the
handlers read them, in order; mutating methods also take ``command_id``) and their results.
Entities come from the domain's attrs classes (t3d/domain/model.py) and choices from the
code that checks them, so neither is written twice. `document()` is the whole description
(``GET /api/schema``, ``t3d schema``); `files()` splits it one file per type, each with the
definitions it uses, the way ``codex app-server generate-json-schema`` ships its protocol.

tests/test_schema.py holds this table to the live methods: every method server.hello lists
has an entry, the params each one takes are its entry's properties, and real results
validate. A method added without an entry fails there.
"""

from __future__ import annotations

from typing import Any, get_args

import t3d
from t3d.api.methods import (
    MAX_PATH,
    MUTATING,
    RUNTIME_MODES,
    WAIT_DEFAULT_S,
    WAIT_LIMIT_DEFAULT,
    WAIT_LIMIT_MAX,
    WAIT_MAX_S,
    WAIT_THREADS_MAX,
)
from t3d.api.schema_types import (
    ANY_OBJECT,
    DRAFT,
    Field,
    Schema,
    array,
    boolean,
    closure,
    const,
    entity_schema,
    enum,
    integer,
    nullable,
    number,
    obj,
    opt,
    ref,
    req,
    string,
)
from t3d.domain.events import EventKind
from t3d.domain.model import (
    DECISIONS,
    DELIVERIES,
    RUNNABLE_PROVIDERS,
    Checkpoint,
    Project,
    ProviderSession,
    RuntimeRequest,
    Thread,
    Turn,
    TurnItem,
    TurnStatus,
)
from t3d.git.checkpoints import DIFF_PAGE
from t3d.git.forge import CLI, ErrorKind
from t3d.pressure.core import LEVELS
from t3d.store.queries import DEFAULT_TURN_LIMIT, MAX_TURN_LIMIT

# --- shared pieces ------------------------------------------------------------------------

ID = string(200)
SEQUENCE = integer(0)
COMMAND_ID = opt(string(200), "client-minted id that makes a retry safe: the same id and params return the first result")
THREAD_ID = req(ID, "the thread's id")
TURN_STATUS = enum(get_args(TurnStatus))
WORKSPACE = {
    "description": '"root" (the project directory) or a new worktree of the project\'s repository',
    "oneOf": [
        const("root"),
        obj({"worktree": req(obj({"base_ref": opt(string(200)), "branch": opt(string(200))}))}),
    ],
}
MUTATION = {"sequence": req(nullable(SEQUENCE), "the global sequence after the command's events (null: nothing was written)")}
EVENT_KINDS: tuple[str, ...] = (*get_args(EventKind), "shell.updated", "shell.removed")


COUNT = nullable(integer(0))
PULL_REQUEST = obj(
    {
        "forge": req(enum(tuple(CLI))),
        "state": req(enum(("unknown", "open", "closed", "merged", "none")), "none: the branch has no pull request; unknown: not asked yet"),
        "number": opt(integer(0)), "url": opt(string()),
        "checks": opt(nullable(obj({
            "state": req(enum(("none", "pending", "passing", "failing"))),
            "total": req(integer(0)), "passed": req(integer(0)), "failed": req(integer(0)), "pending": req(integer(0)),
        }))),
        "error": opt(obj({"kind": req(enum(get_args(ErrorKind))), "message": req(string())}), "the last probe failed (the last answer is kept)"),
    },
    title="PullRequest",
)  # fmt: skip
WORKSPACE_STATUS = obj(
    {
        "path": req(string(), "the thread's directory: its worktree_path, or its project's path"),
        "state": req(enum(("unknown", "ok", "error", "not_a_repository")), "unknown: not looked at yet"),
        "repository": opt(string(), "top directory of the checkout"),
        "branch": opt(nullable(string()), "null: detached HEAD"), "detached": opt(boolean()),
        "head": opt(nullable(string()), "HEAD's commit (null on an unborn branch)"),
        "upstream": opt(nullable(string()), 'the tracked branch, e.g. "origin/main"'),
        "ahead": opt(COUNT), "behind": opt(COUNT), "staged": opt(COUNT), "unstaged": opt(COUNT),
        "untracked": opt(COUNT, "entries as git status lists them (an untracked directory counts once)"),
        "conflicted": opt(COUNT),
        "last_commit": opt(nullable(obj({"oid": req(string()), "subject": req(string(200))}))),
        "in_process": opt(boolean(), "refs are read by t3d itself (false: an unusual repository, read by git)"),
        "truncated": opt(const(True), "git's output passed 8 MiB: the counts are lower bounds"),
        "error": opt(string(), "why the last refresh failed (the last counts are kept)"),
        "pr": opt(ref("PullRequest"), "only for a branch whose upstream is on GitHub, GitLab or Gitea"),
    },
    title="WorkspaceStatus",
)  # fmt: skip


def entity_definitions() -> dict[str, Schema]:
    counts = {
        "turn_count": req(integer(0)),
        "item_count": req(integer(0)),
        "last_activity_at": req(nullable(number()), "the latest time of its newest turn (asked, started or ended); null before its first turn"),
        "workspace": opt(ref("WorkspaceStatus"), "absent when workspace status is off"),
    }
    return {
        "Project": entity_schema(Project),
        "Thread": entity_schema(Thread),
        "ShellThread": entity_schema(Thread, extra=counts, description="a thread's row in the shell, with its maintained counts and last activity"),
        "Turn": entity_schema(Turn),
        "TurnItem": entity_schema(TurnItem),
        "RuntimeRequest": entity_schema(RuntimeRequest),
        "ProviderSession": entity_schema(ProviderSession),
        "Checkpoint": entity_schema(Checkpoint),
        "Gone": obj({"id": req(ID)}, title="Gone", description="what remains of a deleted thread or a shell row that left"),
    }


SNAPSHOT = obj(
    {
        "sequence": req(SEQUENCE),
        "thread": req(ref("Thread")),
        "turns": req(array(ref("Turn"))),
        "items": req(array(ref("TurnItem"))),
        "requests": req(array(ref("RuntimeRequest")), "pending requests"),
        "tasks": req(array(ref("TurnItem")), "background tasks still running, whatever turn started them"),
        "children": opt(array(ref("Thread")), "with children: true, the thread's child threads (subagents), oldest first, at most 500"),
        "has_more": req(boolean(), "older turns were left out"),
        "before": req(nullable(integer(1)), "pass as before to page older turns"),
    },
    title="ThreadSnapshot",
)
STREAMED = obj(
    {"sequence": req(SEQUENCE), "chunks": req(integer(1), "snapshot.chunk notifications sent before this reply")},
    title="Streamed",
)
SUBSCRIBED = {
    "sub": req(string(50)),
    "sequence": req(SEQUENCE),
    "base": req(enum(("snapshot", "replay")), "what follows the reply: snapshot.chunk... snapshot.end, or replayed events then synced"),
    "workspace": opt(boolean(), "when asked: whether workspace.updated notifications follow (false: workspace status is off)"),
}
WATCH_WORKSPACE = opt(boolean(), "also get workspace.updated notifications (and keep the workspaces watched meanwhile)")


DB_AGES = ("<1h", "1h-1d", "1d-7d", "7d-30d", ">30d")
_BY_PHASE = {"type": "object", "additionalProperties": integer(0)}
DB_RESULTS = {
    "prune": obj({
        "dry_run": req(boolean()), "elapsed_s": req(number()), "steps": req(integer(0)),
        "rows": req(_BY_PHASE, "rows deleted (dry: that would be), by phase"),
        "bytes": req(_BY_PHASE, "their stored bytes, by phase"),
        "compacted": req(_BY_PHASE, "newest events whose payload was dropped (dry: would be), by phase; their body is their row"),
        "compacted_bytes": req(_BY_PHASE, "the payload bytes those dropped, by phase"),
        "packed": req(integer(0), "item rows stored packed (dry: would be): compacted items, cold, their body zlib-compressed"),
        "packed_bytes": req(integer(0), "the bytes packing saved (dry: would save)"),
        "writer_s": req({"type": "object", "additionalProperties": number()}, "the steps' time on the writer, by phase"),
        "cursors": req(obj({"item": req(SEQUENCE), "state": req(SEQUENCE)})),
        "free_pages": req(integer(0)), "more": req(boolean(), "more deleted threads to purge: another pass follows"),
    }, title="DbPruneReport"),
    "vacuum": obj({
        "mode": req(enum(("incremental", "full"))), "elapsed_s": req(number()), "freed_pages": req(integer()),
        "pages_before": req(integer(0)), "pages_after": opt(integer(0)), "free_pages": opt(integer(0)),
    }, title="DbVacuumReport"),
    "check": obj({
        "ok": req(boolean()), "problems": req(array(string(), 200)), "tables": req(integer(0)), "elapsed_s": req(number()),
    }, title="DbCheckReport"),
    "backup": obj({
        "path": req(string()), "bytes": req(integer(0)), "sequence": req(SEQUENCE, "the copy holds every commit up to here"),
        "elapsed_s": req(number()),
    }, title="DbBackupReport"),
}  # fmt: skip
DB_JOB = obj(
    {
        "job_id": req(string(50)), "kind": req(enum(tuple(DB_RESULTS))), "params": req(ANY_OBJECT),
        "state": req(enum(("running", "done", "failed", "cancelled"))),
        "phase": req(string()), "done": req(integer(0)), "total": req(integer(0), "0 with done 0: SQLite cannot tell"),
        "started_at": req(number()), "elapsed_s": req(number()),
        "result": req({"anyOf": [{"type": "null"}, *DB_RESULTS.values()]}, "once done: the report of its kind"),
        "error": req(nullable(string()), "once failed: what went wrong"),
    },
    title="DbJob",
)  # fmt: skip


# --- the methods ---------------------------------------------------------------------------


class Method:
    def __init__(self, description: str, params: dict[str, Field], result: Schema) -> None:
        self.description = description
        self.params = params
        self.result = result


METHODS: dict[str, Method] = {
    "server.hello": Method(
        "What this server is and offers.",
        {},
        obj({
            "server": req(const("t3d")), "version": req(string()), "protocol": req(integer(1)),
            "methods": req(array(string())), "capabilities": req(array(string())),
            "providers": req(array(enum(RUNNABLE_PROVIDERS)), "the providers this build runs"),
        }),
    ),
    "server.shutdown": Method(
        "Stop the daemon just after replying; its agents keep running for the next daemon on the state dir unless stop_agents.",
        {"stop_agents": opt(boolean(), "stop every agent too (default false)")},
        obj({
            "stopping": req(const(True)),
            "pid": req(integer(1), "the daemon's process id (wait for it to exit)"),
            "stop_agents": req(boolean()),
        }),
    ),
    "project.create": Method(
        "Make a project of an existing directory; a path that is already a project returns it.",
        {"path": req(string(4096), "absolute path of an existing directory"), "title": opt(string(500)), "project_id": opt(ID)},
        obj({"project_id": req(ID), **MUTATION, "existed": opt(const(True), "the path was already a project")}),
    ),
    "project.list": Method("Every project.", {}, obj({"projects": req(array(ref("Project")))})),
    "thread.create": Method(
        "A new thread in a project, run by one provider.",
        {
            "project_id": req(ID), "provider": req(enum(RUNNABLE_PROVIDERS)), "title": opt(string(500)),
            "model": opt(string(200)),
            "runtime_mode": opt(enum(RUNTIME_MODES), "what the agent may do without asking (default approval-required)"),
            "thread_id": opt(ID), "workspace": opt(WORKSPACE),
        },
        obj({
            "thread_id": req(ID), **MUTATION,
            "checkpoints": opt(obj({
                "enabled": req(boolean()), "reason": opt(string(), "why there are none (a plain directory)"),
                "repository": opt(string(), "top directory of the checkout the turns run in"),
                "in_process": opt(boolean(), "t3d reads its refs and commits itself"),
                "unusual": opt(nullable(string()), "why git reads them instead (reftable, shallow...)"),
            })),
        }),
    ),
    "thread.rename": Method("Retitle a thread.", {"thread_id": THREAD_ID, "title": req(string(500))}, obj({"thread_id": req(ID), **MUTATION})),
    "thread.archive": Method(
        "Archive a thread: its open turns are cancelled and its agent stops.",
        {"thread_id": THREAD_ID},
        obj({"thread_id": req(ID), **MUTATION}),
    ),
    "thread.unarchive": Method(
        "Undo an archive: the thread takes turns again; its next turn starts an agent.",
        {"thread_id": THREAD_ID},
        obj({"thread_id": req(ID), **MUTATION}),
    ),
    "thread.delete": Method(
        "Delete a thread, its worktree (if clean, or with force) and its checkpoint refs.",
        {"thread_id": THREAD_ID, "remove_worktree": opt(boolean(), "default true"), "force": opt(boolean(), "delete a dirty worktree too")},
        obj({
            "thread_id": req(ID), **MUTATION,
            "worktree": opt(obj({"removed": req(boolean()), "discarded": opt(integer(0)), "reason": opt(string())})),
            "checkpoint_refs_removed": opt(integer(0)),
            "checkpoint_refs_error": opt(string(), "the refs could not be removed: why, and how to list them"),
        }),
    ),
    "thread.move": Method(
        "Move an idle thread to the project root or a new worktree; its agent resumes there.",
        {"thread_id": THREAD_ID, "workspace": opt(WORKSPACE, 'default "root"')},
        obj({"thread_id": req(ID), "worktree_path": req(nullable(string())), "branch": req(nullable(string())), **MUTATION}),
    ),
    "thread.snapshot": Method(
        "A thread's last turns (and every open one) with their items and pending requests. On a "
        "WebSocket it is streamed as snapshot.chunk notifications and the reply is Streamed.",
        {
            "thread_id": THREAD_ID,
            "turn_limit": opt(integer(1, MAX_TURN_LIMIT), f"default {DEFAULT_TURN_LIMIT}"),
            "before": opt(integer(1, 1 << 62), "a previous page's before: the page of older turns"),
            "children": opt(boolean(), "default false: also list the thread's child threads (subagents) with their status"),
        },
        {"oneOf": [ref("Streamed"), ref("ThreadSnapshot")]},
    ),
    "turn.start": Method(
        "Start a turn: queued behind an open turn of the thread, or with delivery steer written into "
        "its running turn at once (a thread with no running turn gets an ordinary turn, and a note).",
        {
            "thread_id": THREAD_ID, "text": req(string(1_000_000)), "turn_id": opt(ID),
            "delivery": opt(enum(DELIVERIES), "queue (default) or steer: into the running turn"),
        },
        obj({
            "turn_id": req(ID, "the new turn, or the running turn the message was steered into"),
            "status": req(TURN_STATUS), **MUTATION,
            "delivery": req(enum(DELIVERIES), "what happened: steered into the running turn, or a turn of its own"),
            "item_id": opt(ID, "steer: the item showing the message in the running turn"),
            "note": opt(string(), "steer asked for, but the thread had no running turn"),
        }),
    ),
    "turn.edit": Method(
        "Change the prompt of a queued turn (one that has not started).",
        {"turn_id": req(ID), "text": req(string(1_000_000))},
        obj({"turn_id": req(ID), "status": req(TURN_STATUS), **MUTATION}),
    ),
    "turn.move": Method(
        "Move a queued turn just before another queued turn of its thread, or last (no before).",
        {"turn_id": req(ID), "before": opt(ID, "a queued turn of the same thread")},
        obj({"turn_id": req(ID), "status": req(TURN_STATUS), "order": req(array(ID), "the thread's queue, in run order"), **MUTATION}),
    ),
    "turn.cancel": Method(
        "Cancel a queued turn (one that has not started); cancelling it again changes nothing.",
        {"turn_id": req(ID)},
        obj({"turn_id": req(ID), "status": req(TURN_STATUS), **MUTATION}),
    ),
    "turn.interrupt": Method(
        "Interrupt the running turn, or cancel the queued ones when none runs.",
        {"thread_id": THREAD_ID},
        obj({"turn_id": req(ID), "status": req(TURN_STATUS), **MUTATION}),
    ),
    "thread.force_stop": Method(
        "Kill the thread's agent process group; its running turn ends cancelled.",
        {"thread_id": THREAD_ID},
        obj({
            "thread_id": req(ID),
            "pid": req(nullable(integer()), "the killed process group (null: the turn had no agent yet)"),
            "exit_code": req(nullable(integer())),
            "turn_id": req(nullable(ID), "the turn that was running (null: the agent was idle)"),
        }),
    ),
    "request.respond": Method(
        "Answer a pending permission request.",
        {"request_id": req(ID), "decision": req(enum(DECISIONS)), "message": opt(string(10_000))},
        obj({"request_id": req(ID), **MUTATION}),
    ),
    "requests.pending": Method(
        "Pending requests, of one thread or all.",
        {"thread_id": opt(ID)},
        obj({"requests": req(array(ref("RuntimeRequest")))}),
    ),
    "requests.wait": Method(
        "Long-poll: the pending requests opened after the cursor, at once if there are some, else as soon as one opens, else none after the timeout.",
        {
            "after": opt(integer(0, 1 << 62), "the cursor the previous reply returned (default 0: every pending request)"),
            "thread_id": opt(ID, "only this thread's requests (a cursor belongs to its filter)"),
            "thread_ids": opt(array(ID, WAIT_THREADS_MAX, min_items=1), "only these threads' requests (instead of thread_id)"),
            "timeout": opt(integer(0, WAIT_MAX_S), f"seconds to wait at most (default {WAIT_DEFAULT_S})"),
            "limit": opt(integer(1, WAIT_LIMIT_MAX), f"requests per reply at most (default {WAIT_LIMIT_DEFAULT})"),
        },
        obj({
            "requests": req(array(ref("RuntimeRequest")), "pending, opened after the cursor, oldest first"),
            "cursor": req(SEQUENCE, "pass it as the next call's after"),
        }),
    ),
    "item.detail": Method(
        "The full stored value of an item or a request, or of one of its fields.",
        {
            "item_id": opt(string(400)), "request_id": opt(string(400), "give exactly one of item_id and request_id"),
            "path": opt(array({"type": ["string", "integer"]}, MAX_PATH), 'keys and indexes, e.g. ["data", "output"]'),
        },
        obj({"id": req(string()), "path": req(array({"type": ["string", "integer"]})), "value": req({})}),
    ),
    "checkpoint.diff": Method(
        "The unified diff between two checkpoints of a thread, in pages.",
        {
            "thread_id": THREAD_ID,
            "from_ordinal": req(integer(0, 1 << 31), "0 is the state before the first turn"),
            "to_ordinal": req(integer(0, 1 << 31)),
            "offset": opt(integer(0, 1 << 40)), "limit": opt(integer(1024, DIFF_PAGE)),
        },
        obj({
            "thread_id": req(ID), "from_ordinal": req(integer(0)), "to_ordinal": req(integer(0)),
            "diff": req(string()), "offset": req(integer(0)),
            "next_offset": req(nullable(integer(0)), "null on the last page"),
            "total_chars": req(integer(0)), "truncated": req(boolean(), "git's output passed its 8 MiB cap"),
        }),
    ),
    "checkpoint.revert": Method(
        "Restore a thread's files to a checkpoint; later turns are marked reverted.",
        {"thread_id": THREAD_ID, "ordinal": req(integer(0, 1 << 31), "0 is the state before the first turn")},
        obj({
            "thread_id": req(ID), "ordinal": req(integer(0)), "turns_changed": req(integer(0)), **MUTATION,
            "restored": req(integer(0)), "deleted": req(integer(0)), "commit": req(string()), "directory": req(string()),
        }),
    ),
    "server.agents": Method(
        "Every live agent (provider process) with its thread's turn and its process group's RSS and "
        "CPU time, and the daemon's own; what `t3d ctl top` shows.",
        {},
        obj({
            "at": req(number(), "when this was read (seconds since the epoch)"),
            "agents": req(array(obj({
                "thread_id": req(ID), "provider": req(string(), "unknown if no event named it since the daemon started"),
                "pid": req(integer(), "the agent's pid, also its process group"),
                "scope": req(nullable(string()), "its systemd scope unit, if it runs in one"),
                "status": req(enum(("starting", "running", "waiting", "idle")), "what its thread's turn is doing"),
                "turn_id": req(nullable(ID)), "turn_ordinal": req(nullable(integer(1))),
                "turn_requested_at": req(nullable(number())),
                "turn_started_at": req(nullable(number()), "when the turn reached its provider"),
                "turn_s": req(nullable(number()), "seconds since the turn started"),
                "agent_started_at": req(nullable(number())), "session_id": req(nullable(string())),
                "processes": req(integer(0), "processes in its process group now"),
                "rss_bytes": req(nullable(integer(0)), "the group's summed RSS (null: it is gone)"),
                "cpu_s": req(nullable(number()), "the group's CPU seconds, reaped children included"),
            }))),
            "daemon": req(obj({
                "pid": req(integer()), "rss_bytes": req(nullable(integer(0))), "cpu_s": req(nullable(number())),
            })),
        }),
    ),
    "subscribe.thread": Method(
        "Follow a thread: a base (snapshot or replay), then its events. WebSocket only.",
        {
            "thread_id": THREAD_ID,
            "turn_limit": opt(integer(1, MAX_TURN_LIMIT), f"default {DEFAULT_TURN_LIMIT}"),
            "after_sequence": opt(integer(0, 1 << 62), "the last seq processed: replay the gap if it is small"),
            "workspace": WATCH_WORKSPACE,
        },
        obj(SUBSCRIBED),
    ),
    "subscribe.shell": Method(
        "Follow every project and every thread's row. WebSocket only.",
        {"after_sequence": opt(integer(0, 1 << 62)), "workspace": WATCH_WORKSPACE},
        obj(SUBSCRIBED),
    ),
    "subscribe.server": Method(
        "Server-wide notices: memory_pressure for a subscription that opts in. WebSocket only.",
        {"memory_pressure": opt(boolean())},
        obj({"sub": req(string(50)), "memory_pressure": req(boolean(), "memory_pressure notifications follow")}),
    ),
    "unsubscribe": Method("End a subscription.", {"sub": req(string(50))}, obj({"sub": req(string(50))})),
    "db.stats": Method(
        "The database: sizes, free pages, events by kind and age, the largest threads, retention's cursors.",
        {},
        obj({
            "path": req(string()), "file_bytes": req(integer(0)), "wal_bytes": req(integer(0)),
            "page_size": req(integer(1)), "pages": req(integer(0)), "free_pages": req(integer(0)),
            "auto_vacuum": req(enum(("none", "full", "incremental", "unknown"))), "sequence": req(SEQUENCE),
            "events": req(integer(0)),
            "events_by_kind": req({
                "type": "object",
                "additionalProperties": obj({
                    "total": req(integer(0)),
                    "by_age": req(obj({age: req(integer(0)) for age in DB_AGES}), "by the time each event was written"),
                }),
            }),
            "threads": req(integer(0)), "turns": req(integer(0)), "items": req(integer(0)),
            "largest_threads": req(array(obj({
                "thread_id": req(ID), "title": req(nullable(string())), "turns": req(integer(0)),
                "items": req(integer(0)), "events": req(integer(0)),
            })), "by items, at most 10"),
            "retention": req(obj({
                "cursors": req(obj({"item": req(SEQUENCE), "state": req(SEQUENCE)}), "each class is pruned and compacted up to here"),
                "shell_pruned_through": req(SEQUENCE, "a shell resume from before this gets a snapshot"),
                "compacted": req(integer(0), "stored events whose payload retention dropped (their body is their row)"),
                "threads_to_purge": req(integer(0), "deleted threads whose events are still to go"),
            })),
        }),
    ),
    "db.prune": Method(
        "Start a retention pass with the configured ages (dry_run: count, delete nothing); follow it with db.job.",
        {"dry_run": opt(boolean(), "default false")},
        DB_JOB,
    ),
    "db.vacuum": Method(
        "Start handing free pages back (full: one VACUUM that rewrites the file and holds every write until done).",
        {"full": opt(boolean(), "default false; a database from before incremental auto-vacuum always gets one")},
        DB_JOB,
    ),
    "db.check": Method("Start integrity_check of every table and index, foreign_key_check and the projections' checks.", {}, DB_JOB),
    "db.backup": Method(
        "Start an online copy of the database, as of one commit, to a new file.",
        {"path": req(string(4096), "absolute path of the file to write (never overwritten)")},
        DB_JOB,
    ),
    "db.job": Method("A database job: how far it got, then its result or error.", {"job_id": req(string(50))}, DB_JOB),
    "db.cancel": Method(
        "Stop a database job between two steps (a VACUUM once started cannot be stopped).", {"job_id": req(string(50))}, DB_JOB
    ),
    "workspace.status": Method(
        "A thread's workspace status now: git runs only if a file it depends on changed (or with refresh); "
        "its directory is then watched for a minute.",
        {"thread_id": THREAD_ID, "refresh": opt(boolean(), "run git status whatever the stamps say")},
        obj({"thread_id": req(ID), "workspace": req(ref("WorkspaceStatus"))}),
    ),
}


def type_name(method: str) -> str:
    """``thread.force_stop`` -> ``ThreadForceStop``."""
    return "".join(part[:1].upper() + part[1:] for part in method.replace("_", ".").split("."))


def params_schema(method: str) -> Schema:
    spec = METHODS[method]
    fields = {"command_id": COMMAND_ID, **spec.params} if method in MUTATING else spec.params
    return obj(fields, title=f"{type_name(method)}Params", description=spec.description)


# --- notifications -------------------------------------------------------------------------


def _event_data() -> Schema:
    by_kind = {
        "project.updated": "Project", "thread.updated": "Thread", "thread.deleted": "Thread",
        "turn.updated": "Turn", "item.updated": "TurnItem", "request.updated": "RuntimeRequest",
        "session.updated": "ProviderSession", "checkpoint.updated": "Checkpoint",
        "shell.updated": "ShellThread", "shell.removed": "Gone",
    }  # fmt: skip
    assert set(by_kind) == set(EVENT_KINDS), "every event kind needs its entity here"
    entity = {"thread.deleted": {"oneOf": [ref("Thread"), ref("Gone")]}}
    return {
        "title": "Event",
        "oneOf": [
            obj({"kind": req(const(kind)), "sequence": req(nullable(SEQUENCE)), "entity": req(entity.get(kind, ref(name)))})
            for kind, name in by_kind.items()
        ],
    }


def _sub(kind: str, data: Schema, description: str) -> Schema:
    params = obj({"sub": req(string(50)), "kind": req(const(kind)), "seq": req(SEQUENCE), "data": req(data)})
    return obj({"jsonrpc": req(const("2.0")), "method": req(const("sub")), "params": req(params)}, description=description)


def notification_definitions() -> dict[str, Schema]:
    thread_chunk = obj(
        {
            "turns": req(array(ref("Turn"))), "items": req(array(ref("TurnItem"))), "requests": req(array(ref("RuntimeRequest"))),
            "tasks": req(array(ref("TurnItem"))), "children": opt(array(ref("Thread"))), "sequence": opt(SEQUENCE), "thread": opt(ref("Thread")), "has_more": opt(boolean()), "before": opt(nullable(integer(1))),
        },
        title="ThreadSnapshotChunk",
        description="concatenate the lists of all chunks in order; the first chunk also holds the other fields",
    )
    shell_chunk = obj(
        {"projects": req(array(ref("Project"))), "threads": req(array(ref("ShellThread"))), "sequence": opt(SEQUENCE)},
        title="ShellSnapshotChunk",
    )
    chunk = {"oneOf": [ref("ThreadSnapshotChunk"), ref("ShellSnapshotChunk")]}
    memory = obj(
        {
            "level": req(enum(LEVELS)),
            "agents": req(array(obj({"thread_id": req(ID), "memory_bytes": req(integer(0)), "source": req(enum(("scope", "pss")))}))),
            "unavailable": opt(string(), "why memory pressure cannot be read"),
        },
        title="MemoryPressure",
    )
    notifications = {
        "SnapshotChunkNotification": _sub("snapshot.chunk", chunk, "a piece of a subscription's snapshot (at most 256 KiB)"),
        "SnapshotEndNotification": _sub("snapshot.end", ref("Streamed"), "the snapshot is whole; live events follow"),
        "EventNotification": _sub("event", ref("Event"), "one committed change, newer than the base"),
        "SyncedNotification": _sub("synced", obj({"sequence": req(SEQUENCE), "replayed": req(integer(0))}), "the replayed gap is closed"),
        "ResyncNotification": _sub("resync", obj({"reason": req(string())}), "the subscriber fell behind; a fresh snapshot follows"),
        "MemoryPressureNotification": _sub("memory_pressure", ref("MemoryPressure"), "the memory-pressure level, at once and on each change"),
        "WorkspaceUpdatedNotification": _sub(
            "workspace.updated", ref("WorkspaceStatus"),
            "a workspace's status changed (not an event: seq is the last event sequence delivered, and it is never "
            "replayed). On a shell subscription: every thread whose workspace.path is this path; on a thread "
            "subscription: its thread's, also once right after the base",
        ),
        "ReplyChunkNotification": obj(
            {
                "jsonrpc": req(const("2.0")), "method": req(const("snapshot.chunk")),
                "params": req(obj({"id": req({"type": ["string", "integer"]}), "seq": req(SEQUENCE), "data": req(ref("ThreadSnapshotChunk"))})),
            },
            description="a piece of a thread.snapshot reply on a WebSocket, naming the request it answers",
        ),
    }
    return {
        "Event": _event_data(),
        "ThreadSnapshotChunk": thread_chunk,
        "ShellSnapshotChunk": shell_chunk,
        "MemoryPressure": memory,
        **notifications,
        "ServerNotification": {"title": "ServerNotification", "oneOf": [ref(name) for name in notifications]},
    }


# --- the document ----------------------------------------------------------------------------


def _envelopes() -> dict[str, Schema]:
    request_id = {"type": ["string", "integer"]}
    requests = [
        obj(
            {
                "jsonrpc": req(const("2.0")), "id": opt(request_id, "absent for a notification (no reply)"),
                "method": req(const(method)), "params": opt(ref(f"{type_name(method)}Params")),
            },
            title=f"{type_name(method)}Request",
        )
        for method in METHODS
    ]
    error = obj(
        {
            "code": req(integer(), "-32700 parse, -32600 request, -32601 method, -32602 params, -32603 internal, "
                    "-32001 not found, -32002 conflict, -32003 unavailable"),
            "message": req(string()), "data": opt({}, "for -32602: problems, every one at once; for -32003 from the database: "
                                       "reason, database_full or database_busy"),
        },
        title="JSONRPCErrorError",
    )  # fmt: skip
    return {
        "ClientRequest": {"title": "ClientRequest", "oneOf": requests},
        "JSONRPCErrorError": error,
        "JSONRPCError": obj({"jsonrpc": req(const("2.0")), "id": req(nullable(request_id)), "error": req(ref("JSONRPCErrorError"))}),
    }


def definitions() -> dict[str, Schema]:
    found: dict[str, Schema] = {
        **entity_definitions(), "ThreadSnapshot": SNAPSHOT, "Streamed": STREAMED,
        "WorkspaceStatus": WORKSPACE_STATUS, "PullRequest": PULL_REQUEST,
    }  # fmt: skip
    for method, spec in METHODS.items():
        found[f"{type_name(method)}Params"] = params_schema(method)
        found[f"{type_name(method)}Result"] = {"title": f"{type_name(method)}Result", **spec.result}
    found.update(notification_definitions())
    found.update(_envelopes())
    return found


def document() -> Schema:
    """The whole description, one JSON Schema document with every type under definitions."""
    return {
        "$schema": DRAFT,
        "title": "t3d API",
        "description": (
            f"t3d {t3d.__version__}, protocol 1: JSON-RPC 2.0 over the WebSocket /ws (one object per text "
            "frame) and POST /api/dispatch. A client sends ClientRequest; each method's params are "
            "<Method>Params and its result <Method>Result; the server pushes ServerNotification."
        ),
        "x-t3d-methods": {
            method: {"params": f"{type_name(method)}Params", "result": f"{type_name(method)}Result", "mutating": method in MUTATING}
            for method in METHODS
        },
        "definitions": definitions(),
    }


def files() -> dict[str, Any]:
    """File name -> content: the whole document, and one self-contained file per method's
    params and result, ClientRequest and ServerNotification."""
    found = definitions()
    names = [f"{type_name(m)}{part}" for m in METHODS for part in ("Params", "Result")]
    out: dict[str, Any] = {"t3d_api.schemas.json": document()}
    for name in [*names, "ClientRequest", "ServerNotification"]:
        used = closure(name, found)
        body: dict[str, Any] = {"$schema": DRAFT, **used.pop(name)}
        if used:
            body["definitions"] = dict(sorted(used.items()))
        out[f"{name}.json"] = body
    return out

