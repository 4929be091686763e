"""In-process reads of git repositories agree with git, and hand unusual ones to git."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from git_support import git, make_repo

from t3d.errors import GitError
from t3d.git import repo


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_refs_head_and_commits_read_in_process_agree_with_git(tmp_path: Path, object_format: str) -> None:
    """Loose refs, packed refs, HEAD and a commit's tree read in-process equal git rev-parse (SHA-1 and SHA-256)."""
    path = make_repo(tmp_path / "r", object_format=object_format)
    git(path, "tag", "v1")
    git(path, "branch", "packed-one")
    git(path, "pack-refs", "--all")  # v1 and packed-one now live in packed-refs only
    git(path, "commit", "-q", "--allow-empty", "-m", "second")  # main is loose again
    info = repo.discover(str(path))
    assert info is not None and info.unusual is None and info.object_format == object_format
    for name in ("HEAD", "refs/heads/main", "refs/heads/packed-one", "refs/tags/v1"):
        assert repo.read_ref(info, name) == git(path, "rev-parse", name), name
    assert repo.read_ref(info, "refs/heads/missing") is None
    head = repo.read_head(info)
    assert head is not None
    commit = repo.read_commit(info, head)
    assert commit is not None
    assert commit.tree == git(path, "rev-parse", "HEAD^{tree}")
    assert commit.parents == (git(path, "rev-parse", "HEAD~1"),)
    assert commit.message.startswith("second")


@pytest.mark.parametrize("object_format", ["sha1", "sha256"])
def test_commits_and_refs_written_in_process_are_valid_for_git(tmp_path: Path, object_format: str) -> None:
    """A commit and ref written in-process pass git fsck; create_ref never replaces an existing ref."""
    path = make_repo(tmp_path / "r", object_format=object_format)
    info = repo.discover(str(path))
    assert info is not None
    tree = git(path, "rev-parse", "HEAD^{tree}")
    oid = repo.write_commit(info, tree, "checkpoint\n\nworktree: x\n", when=1_700_000_000)
    assert git(path, "cat-file", "-t", oid) == "commit"
    assert repo.create_ref(info, "refs/t3d/checkpoints/t/0", oid) is True
    assert git(path, "rev-parse", "refs/t3d/checkpoints/t/0") == oid
    other = repo.write_commit(info, tree, "another\n", when=1_700_000_001)
    assert repo.create_ref(info, "refs/t3d/checkpoints/t/0", other) is False
    assert git(path, "rev-parse", "refs/t3d/checkpoints/t/0") == oid
    git(path, "fsck", "--strict")


def test_a_corrupt_object_is_an_error_not_a_guess(tmp_path: Path) -> None:
    """An object whose bytes do not match its hash raises GitError naming git fsck."""
    path = make_repo(tmp_path / "r")
    info = repo.discover(str(path))
    assert info is not None
    head = git(path, "rev-parse", "HEAD")
    obj = path / ".git" / "objects" / head[:2] / head[2:]
    os.chmod(obj, 0o644)
    obj.write_bytes(zlib.compress(b"commit 5\0hello"))
    with pytest.raises(GitError, match="fsck"):
        repo.read_commit(info, head)


def test_a_packed_commit_is_left_to_git(tmp_path: Path) -> None:
    """After gc the commit is in a pack: read_commit says None so the caller asks git."""
    path = make_repo(tmp_path / "r")
    git(path, "gc", "-q")
    info = repo.discover(str(path))
    assert info is not None
    assert repo.read_commit(info, git(path, "rev-parse", "HEAD")) is None


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("shallow", "shallow"),
        ("alternates", "alternates"),
        ("reftable", "reftable"),
        ("big_packed_refs", "packed-refs over 8 MiB"),
    ],
)
def test_unusual_repositories_are_handed_to_git(tmp_path: Path, setup: str, reason: str) -> None:
    """Shallow clones, alternates, reftable and oversized packed-refs are marked unusual, and in-process reads refuse them."""
    source = make_repo(tmp_path / "src")
    path = tmp_path / "r"
    if setup == "shallow":
        git(source, "commit", "-q", "--allow-empty", "-m", "two")
        git(tmp_path, "clone", "-q", "--depth=1", f"file://{source}", str(path))
    elif setup == "alternates":
        git(tmp_path, "clone", "-q", "--shared", str(source), str(path))
    elif setup == "reftable":
        make_repo(path)
        with open(path / ".git" / "config", "a") as f:
            f.write("[extensions]\n\trefStorage = reftable\n")
    else:
        make_repo(path)
        (path / ".git" / "packed-refs").write_bytes(b"# pack-refs with: peeled\n" + b"#" * (9 * 1024 * 1024))
    info = repo.discover(str(path))
    assert info is not None and info.unusual == reason
    with pytest.raises(GitError, match="read by git"):
        repo.read_ref(info, "HEAD")


def test_discovery_is_cached_until_a_watched_file_changes(tmp_path: Path) -> None:
    """A second discover of the same path is a cache hit; touching the config makes it a miss."""
    path = make_repo(tmp_path / "r")
    repo.discover(str(path))
    before = repo.cache_statistics()
    repo.discover(str(path))
    assert repo.cache_statistics()["hits"] == before["hits"] + 1
    config = path / ".git" / "config"
    config.write_text(config.read_text() + "[extensions]\n\trefStorage = reftable\n")
    info = repo.discover(str(path))
    assert info is not None and info.unusual == "reftable", "a changed config is read again"


def test_a_plain_directory_is_no_repository(tmp_path: Path) -> None:
    """A directory outside any repository discovers as None (checkpoints are off there)."""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert repo.discover(str(plain)) is None


def test_a_linked_worktree_shares_refs_with_its_repository(tmp_path: Path) -> None:
    """In a `git worktree add` worktree, HEAD is its own and refs come from the common dir."""
    path = make_repo(tmp_path / "r")
    wt = tmp_path / "wt"
    git(path, "worktree", "add", "-q", "-b", "side", str(wt))
    git(wt, "commit", "-q", "--allow-empty", "-m", "on side")
    info = repo.discover(str(wt))
    assert info is not None and info.unusual is None
    assert repo.read_head(info) == git(wt, "rev-parse", "HEAD")
    assert repo.read_ref(info, "refs/heads/main") == git(path, "rev-parse", "main")
