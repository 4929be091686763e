"""Workspace status, planned and read: what a directory's checkout shows, and what it depends on.

Theory of operation. A status has two parts. The *refs* part (branch or detached HEAD,
the upstream and both commits, the remote's URL) is read in-process from an ordinary
repository (HEAD, loose and packed refs through `repo.py`, the config files parsed
here); the *counts* (staged, unstaged, untracked and conflicted entries, ahead/behind)
come from one ``git status --porcelain=v2 --branch -z`` (`STATUS_ARGV`), or only from
``git rev-list --left-right --count`` when nothing but the upstream moved.

Each part depends on files: `look` names them and stamps them (mtime, size, inode):
HEAD, the branch's and the upstream's loose refs, packed-refs, the ``.git`` link (ref
files); the index, every config file git reads, the exclude files (count files).
`plan` compares a new `Look` with the last one and says what must run: nothing (a
steady workspace costs no git process), the refs only, ahead/behind, or a full status.
The worktree's own files are not stamped (100,000 files cannot be stat'ed every few
seconds, and git's own caches do that better): the caller says when they may have
changed (after a turn), and `plan` is told so.

An unusual repository (reftable, shallow, alternates...: `repo.RepoInfo.unusual`) has no
in-process refs; git's status headers give the branch, its commit and the upstream.

Blocking (file I/O): `look` and `unchanged` run on a worker thread. The rest is pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from t3d.errors import GitError
from t3d.git import repo
from t3d.git.repo import RepoInfo

Stamp = tuple[int, int, int] | None  # (mtime_ns, size, inode); None: the file is absent
Work = Literal["none", "refs", "ahead_behind", "full"]

MAX_CONFIG_BYTES = 1024 * 1024
MAX_SUBJECT = 200
STATUS_CAP = 8 * 1024 * 1024  # git's status output kept; past it the counts are lower bounds

# -c core.untrackedCache=true: git uses (and keeps up to date in memory) the index's
# untracked cache; GIT_OPTIONAL_LOCKS=0 (refs.GitRunner's environment) keeps status from
# taking the index lock, so a background refresh never makes the user's git fail.
STATUS_ARGV = (
    "git",
    "-c",
    "core.untrackedCache=true",
    "status",
    "--porcelain=v2",
    "--branch",
    "-z",
    "--untracked-files=normal",
)


def ahead_behind_argv(head: str, upstream: str) -> tuple[str, ...]:
    return ("git", "rev-list", "--left-right", "--count", f"{head}...{upstream}", "--")


# --- config ---------------------------------------------------------------------------------


def parse_config(text: str) -> dict[str, str]:
    """git config text -> ``{"section.subsection.key": value}`` (the last one wins). Section
    and key names are lower-cased, subsections kept as written, values unquoted. Pure."""
    values: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = _section(line)
            line = line[line.find("]") + 1 :].strip()
            if not line or line[0] in "#;":
                continue
        if not section:
            continue
        key, sep, value = line.partition("=")
        key = key.strip().lower()
        if key and all(c.isalnum() or c == "-" for c in key):
            values[f"{section}.{key}"] = _value(value) if sep else "true"
    return values


def _section(line: str) -> str:
    inner = line[1 : line.find("]")] if "]" in line else line[1:]
    name, _, sub = inner.strip().partition(" ")
    sub = sub.strip()
    if sub.startswith('"') and sub.endswith('"') and len(sub) >= 2:
        return f"{name.lower()}.{sub[1:-1].replace(chr(92) + chr(34), chr(34)).replace(chr(92) * 2, chr(92))}"
    if "." in name:  # the old [section.subsection] form (subsection lower-cased by git)
        head, _, rest = name.partition(".")
        return f"{head.lower()}.{rest.lower()}"
    return name.lower()


def _value(raw: str) -> str:
    out: list[str] = []
    quoted = False
    i = 0
    raw = raw.strip()
    while i < len(raw):
        c = raw[i]
        if c == '"':
            quoted = not quoted
        elif c == "\\" and i + 1 < len(raw):
            i += 1
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[i], raw[i]))
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        i += 1
    return "".join(out).strip() if not quoted else "".join(out)


def config_files(info: RepoInfo, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every config file git reads for this worktree, lowest precedence first (those that
    do not exist included: creating one changes the status)."""
    home = environ.get("HOME") or os.path.expanduser("~")
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files: list[str] = []
    if not environ.get("GIT_CONFIG_NOSYSTEM"):
        files.append(environ.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig")
    if environ.get("GIT_CONFIG_GLOBAL"):
        files.append(environ["GIT_CONFIG_GLOBAL"])
    else:
        files += [os.path.join(xdg, "git", "config"), os.path.join(home, ".gitconfig")]
    files += [
        os.path.join(info.common_dir, "config"),
        os.path.join(info.git_dir, "config.worktree"),
    ]
    return tuple(files)


def _read_configs(paths: tuple[str, ...]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                merged.update(parse_config(f.read(MAX_CONFIG_BYTES)))
        except OSError:
            continue
    return merged


# --- a look at the files --------------------------------------------------------------------


@attrs.frozen
class RefsView:
    """The refs part, read in-process (None fields: detached, unborn, no upstream)."""

    branch: str | None
    head: str | None
    upstream: str | None  # as git names it: "origin/main"
    upstream_oid: str | None


@attrs.frozen
class Upstream:
    """What the config says the branch tracks: remote name, its URL and the branch there."""

    remote: str
    url: str | None
    branch: str  # the branch's name on the remote ("main" of refs/heads/main)


@attrs.frozen
class Look:
    directory: str
    info: RepoInfo | None
    refs: RefsView | None  # None: no repository, or an unusual one (git reads its refs)
    # The config's branch.* and remote.*.url entries (what `upstream_of` needs).
    tracking: tuple[tuple[str, str], ...]
    ref_files: tuple[str, ...]
    ref_stamps: tuple[Stamp, ...]
    count_files: tuple[str, ...]
    count_stamps: tuple[Stamp, ...]
    error: str | None = None  # why the refs could not be read


def stamp(path: str) -> Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def stamps(paths: tuple[str, ...]) -> tuple[Stamp, ...]:
    return tuple(stamp(p) for p in paths)


def unchanged(previous: Look) -> bool:
    """Whether every file ``previous`` depends on is as it was (a few stat calls)."""
    return (
        stamps(previous.ref_files) == previous.ref_stamps
        and stamps(previous.count_files) == previous.count_stamps
    )


def look(directory: str, environ: Mapping[str, str] | None = None) -> Look:
    """What ``directory``'s checkout depends on, stamped, and its refs read where it is ordinary."""
    env = os.environ if environ is None else environ
    try:
        info = repo.discover(directory)
    except (OSError, GitError) as exc:
        return Look(directory, None, None, (), (), (), (), (), error=str(exc))
    if info is None:
        dotgits = _dotgit_candidates(directory)
        return Look(directory, None, None, (), dotgits, stamps(dotgits), (), ())
    configs = config_files(info, env)
    config = _read_configs(configs)
    home = env.get("HOME") or os.path.expanduser("~")
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    excludes = [
        os.path.join(info.common_dir, "info", "exclude"),
        os.path.join(xdg, "git", "ignore"),
    ]
    if config.get("core.excludesfile"):
        excludes.append(os.path.expanduser(config["core.excludesfile"]))
    count_files = (os.path.join(info.git_dir, "index"), *configs, *excludes)
    tracking = tuple(
        sorted(
            (k, v)
            for k, v in config.items()
            if k.startswith("branch.") or (k.startswith("remote.") and k.endswith(".url"))
        )
    )
    count_stamps = stamps(
        count_files
    )  # before the refs are read: a change meanwhile is seen next time
    ref_files = [
        os.path.join(info.worktree, ".git"),
        os.path.join(info.git_dir, "HEAD"),
        os.path.join(info.common_dir, "packed-refs"),
    ]
    if info.unusual is not None:
        ref_files.append(os.path.join(info.common_dir, "reftable", "tables.list"))
        ref_stamps = stamps(tuple(ref_files))
        return Look(
            directory, info, None, tracking, tuple(ref_files), ref_stamps, count_files, count_stamps
        )
    ref_stamps_head = stamps(tuple(ref_files))
    try:
        branch = _head_branch(info)
        head = repo.read_ref(info, "HEAD")
        tracked = upstream_of(dict(tracking), branch)
        upstream_name, upstream_ref = _upstream_ref(tracked, config)
        if branch is not None:
            ref_files.append(os.path.join(info.common_dir, "refs", "heads", *branch.split("/")))
        upstream_oid = None
        if upstream_ref is not None:
            ref_files.append(os.path.join(info.common_dir, *upstream_ref.split("/")))
            upstream_oid = repo.read_ref(info, upstream_ref)
    except (OSError, GitError) as exc:
        return Look(
            directory,
            info,
            None,
            tracking,
            tuple(ref_files),
            ref_stamps_head,
            count_files,
            count_stamps,
            error=str(exc),
        )
    # Stamps of the branch and upstream ref files from after their read would hide a change
    # made during it; taking them before is not possible (their names come from HEAD). A
    # change that raced the read shows at the next look, since it changes a stamp again.
    ref_stamps = ref_stamps_head + stamps(tuple(ref_files[len(ref_stamps_head) :]))
    refs = RefsView(branch, head, upstream_name, upstream_oid)
    return Look(
        directory, info, refs, tracking, tuple(ref_files), ref_stamps, count_files, count_stamps
    )


def _dotgit_candidates(directory: str) -> tuple[str, ...]:
    out = []
    current = os.path.abspath(directory)
    while True:
        out.append(os.path.join(current, ".git"))
        parent = os.path.dirname(current)
        if parent == current:
            return tuple(out)
        current = parent


def _head_branch(info: RepoInfo) -> str | None:
    """The branch HEAD names (``main`` of ``ref: refs/heads/main``), or None when detached."""
    try:
        with open(os.path.join(info.git_dir, "HEAD"), encoding="utf-8", errors="replace") as f:
            content = f.read(4096).strip()
    except OSError:
        return None
    if content.startswith("ref:"):
        name = content[4:].strip()
        return name[len("refs/heads/") :] if name.startswith("refs/heads/") else name
    return None


def upstream_of(config: Mapping[str, str], branch: str | None) -> Upstream | None:
    """The branch's upstream from ``branch.<name>.remote`` and ``.merge``. Pure."""
    if branch is None:
        return None
    remote = config.get(f"branch.{branch}.remote")
    merge = config.get(f"branch.{branch}.merge")
    if not remote or not merge:
        return None
    short = merge[len("refs/heads/") :] if merge.startswith("refs/heads/") else merge
    return Upstream(remote, config.get(f"remote.{remote}.url"), short)


def tracked(new: Look, branch: str | None) -> Upstream | None:
    """What ``branch`` tracks, by the config ``new`` read. Pure."""
    return upstream_of(dict(new.tracking), branch)


def _upstream_ref(
    tracked: Upstream | None, config: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(git's name of the upstream, its ref), assuming the remote's usual fetch refspec. Pure."""
    if tracked is None:
        return None, None
    if tracked.remote == ".":
        return tracked.branch, f"refs/heads/{tracked.branch}"
    return f"{tracked.remote}/{tracked.branch}", f"refs/remotes/{tracked.remote}/{tracked.branch}"


# --- what to run ----------------------------------------------------------------------------


def plan(old: Look | None, new: Look, *, files_changed: bool, had_counts: bool) -> Work:
    """What must run to bring a status read at ``old`` up to ``new``. Pure.

    ``files_changed``: the worktree's files may have changed since (a turn ended).
    ``had_counts``: the last status has counts (a full status ran and did not fail)."""
    if new.info is None:
        return "none"
    if old is None or old.info != new.info or not had_counts or files_changed:
        return "full"
    if new.count_stamps != old.count_stamps:
        return "full"
    if new.refs is None or old.refs is None:  # git reads the refs of an unusual repository
        return "full" if new.ref_stamps != old.ref_stamps else "none"
    if (new.refs.branch, new.refs.head) != (old.refs.branch, old.refs.head):
        return "full"  # staged entries are counted against HEAD
    if (new.refs.upstream, new.refs.upstream_oid) != (old.refs.upstream, old.refs.upstream_oid):
        return "ahead_behind" if new.refs.upstream_oid and new.refs.head else "refs"
    return "refs" if new.ref_stamps != old.ref_stamps else "none"


# --- git's answers --------------------------------------------------------------------------


@attrs.frozen
class Counts:
    oid: str | None  # None: unborn
    branch: str | None  # None: detached
    upstream: str | None
    ahead: int | None
    behind: int | None
    staged: int
    unstaged: int
    untracked: int
    conflicted: int
    truncated: bool = False


def parse_status(out: bytes, *, truncated: bool = False) -> Counts:
    """``git status --porcelain=v2 --branch -z``. A cut output (``truncated``) drops its last,
    partial record; the counts are then lower bounds. Pure."""
    fields = out.split(b"\0")
    if truncated and fields:
        fields = fields[:-1]
    head: dict[bytes, bytes] = {}
    staged = unstaged = untracked = conflicted = 0
    i = 0
    while i < len(fields):
        record = fields[i]
        i += 1
        if not record:
            continue
        kind = record[:1]
        if kind == b"#":
            key, _, value = record[2:].partition(b" ")
            head[key] = value
        elif kind in (b"1", b"2"):
            xy = record[2:4]
            staged += xy[:1] != b"."
            unstaged += xy[1:2] != b"."
            if kind == b"2":
                i += 1  # a rename or copy: its original path is the next field
        elif kind == b"u":
            conflicted += 1
        elif kind == b"?":
            untracked += 1
    oid = head.get(b"branch.oid", b"").decode()
    name = head.get(b"branch.head", b"").decode("utf-8", "surrogateescape")
    ahead = behind = None
    if b"branch.ab" in head:
        a, _, b = head[b"branch.ab"].partition(b" ")
        if a.lstrip(b"+").isdigit() and b.lstrip(b"-").isdigit():
            ahead, behind = int(a.lstrip(b"+")), int(b.lstrip(b"-"))
    upstream = head.get(b"branch.upstream")
    return Counts(
        oid=None if oid in ("", "(initial)") else oid,
        branch=None if name in ("", "(detached)") else name,
        upstream=None if upstream is None else upstream.decode("utf-8", "surrogateescape"),
        ahead=ahead,
        behind=behind,
        staged=staged,
        unstaged=unstaged,
        untracked=untracked,
        conflicted=conflicted,
        truncated=truncated,
    )


def parse_ahead_behind(out: bytes) -> tuple[int, int] | None:
    """``git rev-list --left-right --count A...B``: ``"3\\t1"``. Pure."""
    left, _, right = out.decode("ascii", "replace").strip().partition("\t")
    try:
        return int(left), int(right)
    except ValueError:
        return None


def subject(message: str) -> str:
    """A commit message's first line, at most `MAX_SUBJECT` characters. Pure."""
    line = message.split("\n", 1)[0].strip()
    return line if len(line) <= MAX_SUBJECT else line[: MAX_SUBJECT - 1] + "…"


# --- the value clients see ------------------------------------------------------------------


def status_value(
    directory: str,
    new: Look,
    counts: Counts | None,
    *,
    last_commit: dict[str, str] | None,
    error: str | None,
    pr: dict[str, Any] | None,
) -> dict[str, Any]:
    """The workspace as shell rows, ``workspace.updated`` and ``workspace.status`` show it. Pure."""
    if new.info is None:
        value: dict[str, Any] = {
            "path": directory,
            "state": "error" if new.error else "not_a_repository",
        }
        if new.error:
            value["error"] = new.error
        return value
    refs = new.refs
    branch = refs.branch if refs is not None else (counts.branch if counts else None)
    head = refs.head if refs is not None else (counts.oid if counts else None)
    upstream = refs.upstream if refs is not None else (counts.upstream if counts else None)
    if counts is not None and counts.upstream is not None:
        upstream = counts.upstream  # git's own answer wins (a refspec this module does not read)
    value = {
        "path": directory,
        "state": "error" if error else ("ok" if counts is not None else "unknown"),
        "repository": new.info.worktree,
        "branch": branch,
        "detached": branch is None and head is not None,
        "head": head,
        "upstream": upstream,
        "ahead": counts.ahead if counts else None,
        "behind": counts.behind if counts else None,
        "staged": counts.staged if counts else None,
        "unstaged": counts.unstaged if counts else None,
        "untracked": counts.untracked if counts else None,
        "conflicted": counts.conflicted if counts else None,
        "last_commit": last_commit,
        "in_process": refs is not None,
    }
    if counts is not None and counts.truncated:
        value["truncated"] = True
    if error:
        value["error"] = error
    if pr is not None:
        value["pr"] = pr
    return value


def unknown_value(directory: str) -> dict[str, Any]:
    """A workspace nobody has looked at yet."""
    return {"path": directory, "state": "unknown"}
