"""Real git repositories in tmp dirs for the git tests (the system's git CLI)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@localhost",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_OPTIONAL_LOCKS": "0",  # the test's own `git status` must not refresh (rewrite) the index
}


def git(cwd: Path, *args: str, check: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, capture_output=True, text=True, check=False)
    if check and out.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {out.stderr}")
    return out.stdout.strip()


def make_repo(path: Path, *, object_format: str = "sha1", files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", f"--object-format={object_format}", "-b", "main")
    for name, text in (files or {"notes.txt": "hello\n", ".gitignore": "*.log\nbuild/\n"}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


def repo_state(path: Path) -> tuple[str, str, bytes, str]:
    """HEAD, porcelain status, the index file's bytes and the branch list: what a
    checkpoint must never change."""
    git_dir = Path(git(path, "rev-parse", "--absolute-git-dir"))
    index = (git_dir / "index").read_bytes()  # read before anything else runs git
    return (
        git(path, "rev-parse", "HEAD"),
        git(path, "status", "--porcelain"),
        index,
        git(path, "for-each-ref", "refs/heads", "--format=%(refname) %(objectname)"),
    )


def real(path: Path | str) -> str:
    """The real path (a sync helper: async tests must not call os.path themselves)."""
    return os.path.realpath(path)


def exists(path: Path) -> bool:
    return path.exists()
