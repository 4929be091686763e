"""Pull requests from the forge CLIs (gh, glab, tea), planned and parsed. Pure.

Theory of operation. A branch whose upstream's remote URL names a known forge host
(`parse_remote`: github.com and hosts named github, gitlab, gitea, codeberg.org) has a
`PrQuery`; `probe_argv` is the one command that asks its forge about it:

- GitHub: ``gh pr view BRANCH --repo HOST/OWNER/REPO --json number,state,url,statusCheckRollup``
- GitLab: ``glab mr view BRANCH --repo https://HOST/GROUP/REPO --output json``
- Gitea: ``tea pulls list --repo OWNER/REPO --state all --output json --fields index,state,head,url,ci``

`parse_answer` turns what the CLI printed into a `PrAnswer` (``state`` open, closed,
merged, or none when the branch has no pull request) or a `ProbeError` whose ``kind``
says what to do: ``not_installed`` (the CLI is not on PATH), ``not_logged_in``,
``rate_limited``, ``not_found`` (the forge does not know the repository), ``timed_out``,
``failed`` (anything else, with the CLI's last line). `next_delay` is the schedule: every
`INTERVAL_S` while answers come, and after failures `BACKOFF_MIN_S` doubling to
`BACKOFF_MAX_S`, so a forge that fails is never asked in a tight loop. A branch without
a pull request is an answer, not a failure: a pull request opened later shows within
`INTERVAL_S`.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs
import orjson

Forge = Literal["github", "gitlab", "gitea"]
PrState = Literal["open", "closed", "merged", "none"]
ErrorKind = Literal[
    "not_installed", "not_logged_in", "rate_limited", "not_found", "timed_out", "failed"
]

CLI: dict[str, str] = {"github": "gh", "gitlab": "glab", "gitea": "tea"}
INSTALL: dict[str, str] = {
    "github": "install GitHub CLI (https://cli.github.com) to see pull requests",
    "gitlab": "install glab (https://gitlab.com/gitlab-org/cli) to see merge requests",
    "gitea": "install tea (https://gitea.com/gitea/tea) to see pull requests",
}
LOGIN: dict[str, str] = {
    "github": "gh auth login",
    "gitlab": "glab auth login",
    "gitea": "tea login add",
}

INTERVAL_S = 30.0
BACKOFF_MIN_S = 30.0
BACKOFF_MAX_S = 15 * 60.0
TIMEOUT_S = 20.0  # a probe still running then is killed (and counts as timed_out)
OUTPUT_CAP = 256 * 1024
MAX_MESSAGE = 300

# What the CLIs need to never wait for a person, nor print colours or update notices.
ENV = {
    "GH_PROMPT_DISABLED": "1",
    "GH_NO_UPDATE_NOTIFIER": "1",
    "GH_SPINNER_DISABLED": "1",
    "NO_PROMPT": "1",
    "NO_COLOR": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}

_SCP = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.+)$")  # git@github.com:owner/repo.git


@attrs.frozen
class Remote:
    forge: Forge
    host: str
    slug: str  # owner/repo (GitLab: group/subgroup/repo)


@attrs.frozen
class PrQuery:
    remote: Remote
    branch: str  # the branch's name on the remote


@attrs.frozen
class PrAnswer:
    state: PrState
    number: int | None = None
    url: str | None = None
    checks: dict[str, Any] | None = None


@attrs.frozen
class ProbeError:
    kind: ErrorKind
    message: str


def forge_of_host(host: str) -> Forge | None:
    host = host.lower()
    if host == "github.com" or "github" in host.split(".")[0]:
        return "github"
    if "gitlab" in host:
        return "gitlab"
    if "gitea" in host or host == "codeberg.org":
        return "gitea"
    return None


def parse_remote(url: str | None) -> Remote | None:
    """The forge repository a remote URL names (https, ssh:// or scp-like), or None."""
    if not url:
        return None
    url = url.strip()
    if "://" in url:
        parts = urlsplit(url)
        if parts.scheme not in ("https", "http", "ssh", "git") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
    elif match := _SCP.match(url):
        host, path = match.group(1), match.group(2)
    else:
        return None
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-4]
    forge = forge_of_host(host)
    if (
        forge is None
        or path.count("/") < 1
        or any(not p or p in (".", "..") for p in path.split("/"))
    ):
        return None
    return Remote(forge, host.lower(), path)


def probe_argv(query: PrQuery) -> tuple[str, ...]:
    remote, branch = query.remote, query.branch
    if remote.forge == "github":
        repo = remote.slug if remote.host == "github.com" else f"{remote.host}/{remote.slug}"
        return (
            "gh",
            "pr",
            "view",
            branch,
            "--repo",
            repo,
            "--json",
            "number,state,url,statusCheckRollup",
        )
    if remote.forge == "gitlab":
        return (
            "glab",
            "mr",
            "view",
            branch,
            "--repo",
            f"https://{remote.host}/{remote.slug}",
            "--output",
            "json",
        )
    return (
        "tea", "pulls", "list", "--repo", remote.slug, "--state", "all",
        "--output", "json", "--fields", "index,state,head,url,ci",
    )  # fmt: skip


def next_delay(failures: int) -> float:
    """Seconds until the next probe after ``failures`` failures in a row (0: the last one answered)."""
    if failures <= 0:
        return INTERVAL_S
    return float(min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2.0 ** min(failures - 1, 20)))


def not_installed(forge: Forge) -> ProbeError:
    return ProbeError(
        "not_installed", f"{CLI[forge]} is not installed (not on PATH); {INSTALL[forge]}"
    )


def timed_out(forge: Forge) -> ProbeError:
    return ProbeError(
        "timed_out",
        f"{CLI[forge]} did not answer within {TIMEOUT_S:g} s and was stopped; t3d asks again later",
    )


# --- answers ------------------------------------------------------------------------------------


def parse_answer(
    query: PrQuery, returncode: int, stdout: bytes, stderr: bytes
) -> PrAnswer | ProbeError:
    forge = query.remote.forge
    err = stderr.decode("utf-8", "replace")
    if returncode != 0:
        return _classify(forge, returncode, err, query)
    try:
        value = orjson.loads(stdout)
    except orjson.JSONDecodeError:
        return ProbeError(
            "failed",
            f"{CLI[forge]} printed something that is not JSON: {_last_line(stdout.decode('utf-8', 'replace'))}",
        )
    try:
        if forge == "github":
            return _github(value)
        if forge == "gitlab":
            return _gitlab(value)
        return _gitea(value, query.branch)
    except (KeyError, TypeError, ValueError) as exc:
        return ProbeError(
            "failed", f"{CLI[forge]}'s JSON lacks what t3d reads ({exc!r}); is it an old version?"
        )


def _classify(forge: Forge, returncode: int, err: str, query: PrQuery) -> PrAnswer | ProbeError:
    low = err.lower()
    if re.search(r"no (open )?(pull|merge) requests? (found|available)", low):
        return PrAnswer("none")
    if (
        "rate limit" in low
        or "too many requests" in low
        or "http 429" in low
        or "submitted too quickly" in low
    ):
        return ProbeError(
            "rate_limited",
            f"{forge} is rate-limiting {CLI[forge]}; t3d asks again later ({_last_line(err)})",
        )
    logged_out = (
        "auth login",
        "not logged in",
        "authentication required",
        "401 unauthorized",
        "bad credentials",
        "no gitea login",
        "login add",
    )
    if (forge == "github" and returncode == 4) or any(s in low for s in logged_out):
        return ProbeError(
            "not_logged_in",
            f"{CLI[forge]} is not logged in to {query.remote.host}; run `{LOGIN[forge]}`",
        )
    if "could not resolve to a repository" in low or "404" in low or "not found" in low:
        return ProbeError(
            "not_found",
            f"{query.remote.host} does not know the repository {query.remote.slug} ({_last_line(err)})",
        )
    return ProbeError(
        "failed", f"{CLI[forge]} failed (exit {returncode}): {_last_line(err) or 'no message'}"
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"


_GH_STATES: dict[str, PrState] = {"OPEN": "open", "CLOSED": "closed", "MERGED": "merged"}


def _github(value: Any) -> PrAnswer:
    return PrAnswer(
        _GH_STATES[str(value["state"]).upper()],
        int(value["number"]),
        str(value["url"]),
        github_checks(value.get("statusCheckRollup") or []),
    )


def github_checks(rollup: list[Any]) -> dict[str, Any]:
    """``statusCheckRollup`` (check runs and commit statuses) as counts and one state."""
    passed = failed = pending = 0
    for check in rollup:
        if not isinstance(check, dict):
            continue
        if check.get("__typename") == "StatusContext" or "context" in check:
            state = str(check.get("state") or "").upper()
            passed += state == "SUCCESS"
            failed += state in ("FAILURE", "ERROR")
            pending += state in ("PENDING", "EXPECTED", "")
        elif str(check.get("status") or "").upper() != "COMPLETED":
            pending += 1
        else:
            conclusion = str(check.get("conclusion") or "").upper()
            failed += conclusion in (
                "FAILURE",
                "TIMED_OUT",
                "CANCELLED",
                "ACTION_REQUIRED",
                "STARTUP_FAILURE",
            )
            passed += conclusion not in (
                "FAILURE",
                "TIMED_OUT",
                "CANCELLED",
                "ACTION_REQUIRED",
                "STARTUP_FAILURE",
            )
    return _checks(passed, failed, pending)


def _checks(passed: int, failed: int, pending: int) -> dict[str, Any]:
    total = passed + failed + pending
    state = "none" if total == 0 else "failing" if failed else "pending" if pending else "passing"
    return {"state": state, "total": total, "passed": passed, "failed": failed, "pending": pending}


_GITLAB_STATES: dict[str, PrState] = {"opened": "open", "closed": "closed", "locked": "closed", "merged": "merged"}
_PIPELINE_PASS = {"success", "skipped", "manual"}
_PIPELINE_FAIL = {"failed", "canceled"}


def _gitlab(value: Any) -> PrAnswer:
    pipeline = value.get("head_pipeline") or value.get("pipeline")
    checks = _checks(0, 0, 0)
    if isinstance(pipeline, dict) and pipeline.get("status"):
        status = str(pipeline["status"]).lower()
        checks = _checks(
            status in _PIPELINE_PASS,
            status in _PIPELINE_FAIL,
            status not in _PIPELINE_PASS | _PIPELINE_FAIL,
        )
    return PrAnswer(
        _GITLAB_STATES[str(value["state"]).lower()],
        int(value["iid"]),
        str(value["web_url"]),
        checks,
    )


def _gitea(value: Any, branch: str) -> PrAnswer:
    if not isinstance(value, list):
        raise TypeError("a list of pull requests")
    mine = [pr for pr in value if isinstance(pr, dict) and pr.get("head") == branch]
    if not mine:
        return PrAnswer("none")
    pr = max(mine, key=lambda p: int(p["index"]))
    state = str(pr["state"]).lower()
    ci = str(pr.get("ci") or "").lower()
    checks = _checks(
        ci == "success", ci in ("failure", "error"), ci in ("pending", "running", "warning")
    )
    return PrAnswer(
        "merged" if state == "merged" else "open" if state == "open" else "closed",
        int(pr["index"]),
        str(pr["url"]),
        checks,
    )


def answer_value(forge: Forge, answer: PrAnswer | None, error: ProbeError | None) -> dict[str, Any]:
    """The ``pr`` field: the last answer (kept through later failures) and the last error."""
    value: dict[str, Any] = {"forge": forge, "state": "unknown" if answer is None else answer.state}
    if answer is not None and answer.number is not None:
        value.update(number=answer.number, url=answer.url, checks=answer.checks)
    if error is not None:
        value["error"] = {"kind": error.kind, "message": error.message}
    return value
