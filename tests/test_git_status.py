"""Workspace status, planned and read (t3d/git/status.py): git's status output parsed, config
parsed, and what a change of each watched file makes run, on real repositories."""

from __future__ import annotations

import os
from pathlib import Path

from git_support import git, make_repo

from t3d.git import status as st

RECORDS = [
    b"# branch.oid 1111111111111111111111111111111111111111",
    b"# branch.head feature/x",
    b"# branch.upstream origin/feature/x",
    b"# branch.ab +2 -5",
    b"1 M. N... 100644 100644 100644 aaa bbb staged.txt",
    b"1 .M N... 100644 100644 100644 aaa aaa unstaged.txt",
    b"1 MM N... 100644 100644 100644 aaa bbb both.txt",
    b"2 R. N... 100644 100644 100644 aaa aaa R100 new name.txt",
    b"old name.txt",  # the rename's original path: a field of its own with -z
    b"u UU N... 100644 100644 100644 100644 aaa bbb ccc conflict.txt",
    b"? untracked.txt",
    b"? build dir/",
]


def test_porcelain_v2_records_are_counted_and_the_branch_headers_read() -> None:
    """Staged counts X, unstaged counts Y, a rename's second path is not a record, unmerged
    entries are conflicts, untracked entries (a directory once) are counted; headers give the
    commit, branch, upstream and ahead/behind."""
    counts = st.parse_status(b"\0".join(RECORDS) + b"\0")
    assert counts == st.Counts(
        oid="1" * 40, branch="feature/x", upstream="origin/feature/x", ahead=2, behind=5,
        staged=3, unstaged=2, untracked=2, conflicted=1,
    )  # fmt: skip


def test_detached_unborn_and_cut_outputs() -> None:
    """A detached HEAD has no branch, an unborn one no commit, no upstream means no
    ahead/behind; a cut output drops its partial last record and says so."""
    detached = st.parse_status(b"# branch.oid " + b"a" * 40 + b"\0# branch.head (detached)\0")
    assert (detached.branch, detached.oid, detached.ahead) == (None, "a" * 40, None)
    unborn = st.parse_status(b"# branch.oid (initial)\0# branch.head main\0? x\0")
    assert (unborn.branch, unborn.oid, unborn.untracked) == ("main", None, 1)
    cut = st.parse_status(b"? a\0? b\0? partial-na", truncated=True)
    assert (cut.untracked, cut.truncated) == (2, True)


def test_config_sections_subsections_quotes_and_comments() -> None:
    """Subsections keep their case and may hold slashes and quotes; values are unquoted and
    lose trailing comments; the old [section.sub] form and bare boolean keys are read."""
    text = (
        '[core]\n\tbare = false ; a comment\n'
        '[branch "Feature/X"]\n\tremote = origin\n\tmerge = refs/heads/Feature/X\n'
        '[remote "origin"]\n\turl = "git@github.com:Acme/Widgets.git" # trailing\n'
        '[branch.old]\n\tremote = up\n'
        '[status]\n\tshowUntrackedFiles\n'
        '# [remote "ignored"]\n'
    )
    config = st.parse_config(text)
    assert config["branch.Feature/X.remote"] == "origin"
    assert config["branch.Feature/X.merge"] == "refs/heads/Feature/X"
    assert config["remote.origin.url"] == "git@github.com:Acme/Widgets.git"
    assert config["branch.old.remote"] == "up"
    assert config["status.showuntrackedfiles"] == "true"
    assert config["core.bare"] == "false"
    assert not any("ignored" in k for k in config)
    upstream = st.upstream_of(config, "Feature/X")
    assert upstream == st.Upstream("origin", "git@github.com:Acme/Widgets.git", "Feature/X")
    assert st.upstream_of(config, "nothing") is None and st.upstream_of(config, None) is None


def _tracked_repo(tmp_path: Path) -> Path:
    """A repository whose main tracks origin/main (a real remote next to it)."""
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    project = make_repo(tmp_path / "repo")
    git(project, "remote", "add", "origin", str(remote))
    git(project, "push", "-q", "-u", "origin", "main")
    return project


def _plan(old: st.Look, path: Path, *, files_changed: bool = False) -> tuple[st.Work, st.Look]:
    assert not st.unchanged(old) or files_changed, "the change was not seen by the stamps"
    new = st.look(str(path))
    return st.plan(old, new, files_changed=files_changed, had_counts=True), new


def test_each_watched_change_plans_only_the_work_it_needs(tmp_path: Path) -> None:
    """Nothing changed: no work and unchanged stamps. The upstream moved (a fetch): only
    ahead/behind. Refs repacked with the same values: no git. The index, HEAD or the config
    changed, or the files after a turn: a full status."""
    project = _tracked_repo(tmp_path)
    first = st.look(str(project))
    assert first.refs is not None and first.refs.branch == "main" and first.refs.upstream == "origin/main"
    assert first.refs.upstream_oid == first.refs.head
    assert st.unchanged(first)
    assert st.plan(first, st.look(str(project)), files_changed=False, had_counts=True) == "none"
    assert st.plan(first, first, files_changed=True, had_counts=True) == "full"
    assert st.plan(first, first, files_changed=False, had_counts=False) == "full"

    # Someone else pushed to the remote; a fetch moves only refs/remotes/origin/main.
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(tmp_path / "remote.git"), str(other))
    (other / "more.txt").write_text("more\n")
    git(other, "add", "more.txt")
    git(other, "commit", "-q", "-m", "more")
    git(other, "push", "-q", "origin", "main")
    git(project, "fetch", "-q", "origin")
    work, fetched = _plan(first, project)
    assert work == "ahead_behind"
    assert fetched.refs is not None and fetched.refs.upstream_oid != first.refs.upstream_oid

    git(project, "pack-refs", "--all")
    work, packed = _plan(fetched, project)
    assert work in ("none", "refs") and packed.refs == fetched.refs

    (project / "notes.txt").write_text("changed\n")
    git(project, "add", "notes.txt")
    work, staged = _plan(packed, project)
    assert work == "full"

    git(project, "commit", "-q", "-m", "change")
    work, committed = _plan(staged, project)
    assert work == "full"

    git(project, "config", "status.showUntrackedFiles", "no")
    work, _ = _plan(committed, project)
    assert work == "full"


def test_a_plain_directory_and_an_unusual_repository(tmp_path: Path) -> None:
    """A plain directory is no repository (its would-be .git paths are stamped, so a later
    git init is seen); a shallow clone has no in-process refs and any stamp change asks git."""
    plain = tmp_path / "plain"
    plain.mkdir()
    look = st.look(str(plain))
    assert look.info is None and st.plan(None, look, files_changed=True, had_counts=False) == "none"
    assert st.status_value(str(plain), look, None, last_commit=None, error=None, pr=None)["state"] == "not_a_repository"
    git(plain, "init", "-q")
    assert not st.unchanged(look), "git init in a plain directory is seen"

    source = make_repo(tmp_path / "source")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{source}", str(shallow))
    look = st.look(str(shallow))
    assert look.info is not None and look.info.unusual == "shallow" and look.refs is None
    assert st.plan(look, st.look(str(shallow)), files_changed=False, had_counts=True) == "none"
    (shallow / "x.txt").write_text("x\n")
    git(shallow, "add", "x.txt")
    assert st.plan(look, st.look(str(shallow)), files_changed=False, had_counts=True) == "full"


def test_a_branch_switch_and_a_detached_head_are_seen_in_process(tmp_path: Path) -> None:
    """Switching branches or detaching HEAD changes the refs read in-process (and plans a
    full status, since staged entries count against HEAD)."""
    project = make_repo(tmp_path / "repo")
    first = st.look(str(project))
    git(project, "switch", "-q", "-c", "topic")
    work, topic = _plan(first, project)
    assert work == "full" and topic.refs is not None and topic.refs.branch == "topic"
    git(project, "switch", "-q", "--detach")
    _, detached = _plan(topic, project)
    assert detached.refs is not None and detached.refs.branch is None and detached.refs.head == topic.refs.head
    value = st.status_value(str(project), detached, None, last_commit=None, error=None, pr=None)
    assert value["detached"] is True and value["branch"] is None


def test_config_files_follow_git_s_environment(tmp_path: Path) -> None:
    """The stamped config files are git's: system unless GIT_CONFIG_NOSYSTEM, the global ones
    (or GIT_CONFIG_GLOBAL), the repository's and the worktree's."""
    project = make_repo(tmp_path / "repo")
    info = st.look(str(project)).info
    assert info is not None
    env = {"HOME": str(tmp_path / "home")}
    files = st.config_files(info, env)
    assert files[0] == "/etc/gitconfig" and str(tmp_path / "home" / ".gitconfig") in files
    assert os.path.join(info.common_dir, "config") in files
    quiet = st.config_files(info, {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/x/global"})
    assert "/etc/gitconfig" not in quiet and "/x/global" in quiet
