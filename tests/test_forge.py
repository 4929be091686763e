"""Pull requests from forge CLIs, planned and parsed (t3d/git/forge.py): remotes, commands,
answers, error classes and the backoff schedule."""

from __future__ import annotations

import orjson
import pytest

from t3d.git import forge
from t3d.git.forge import PrAnswer, ProbeError, PrQuery, Remote

GITHUB = Remote("github", "github.com", "acme/widgets")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://github.com/acme/widgets.git", GITHUB),
        ("git@github.com:acme/widgets.git", GITHUB),
        ("ssh://git@github.com/acme/widgets", GITHUB),
        ("https://token@github.com/acme/widgets/", GITHUB),
        ("https://github.example.com/acme/widgets.git", Remote("github", "github.example.com", "acme/widgets")),
        ("https://gitlab.com/group/sub/repo.git", Remote("gitlab", "gitlab.com", "group/sub/repo")),
        ("git@codeberg.org:me/tool.git", Remote("gitea", "codeberg.org", "me/tool")),
        ("https://example.com/acme/widgets.git", None),
        ("/srv/git/widgets.git", None),
        ("file:///srv/git/widgets.git", None),
        ("https://github.com/justone", None),
        ("", None),
        (None, None),
    ],
)
def test_remote_urls_name_their_forge_repository(url: str | None, expected: Remote | None) -> None:
    """https, ssh:// and scp-like URLs of GitHub, GitLab and Gitea hosts name the repository;
    other hosts, local paths and URLs without owner/repo name none."""
    assert forge.parse_remote(url) == expected


def test_the_probe_commands() -> None:
    """gh is asked for the four fields by branch and repository (a non-github.com host named
    in --repo), glab by its URL, tea lists the repository's pull requests as JSON."""
    assert forge.probe_argv(PrQuery(GITHUB, "topic")) == (
        "gh", "pr", "view", "topic", "--repo", "acme/widgets", "--json", "number,state,url,statusCheckRollup",
    )  # fmt: skip
    enterprise = PrQuery(Remote("github", "github.example.com", "a/b"), "x")
    assert forge.probe_argv(enterprise)[5] == "github.example.com/a/b"
    assert forge.probe_argv(PrQuery(Remote("gitlab", "gitlab.com", "g/r"), "x"))[:6] == (
        "glab", "mr", "view", "x", "--repo", "https://gitlab.com/g/r",
    )  # fmt: skip
    assert forge.probe_argv(PrQuery(Remote("gitea", "codeberg.org", "m/t"), "x"))[:3] == ("tea", "pulls", "list")


def test_a_github_answer_with_checks() -> None:
    """State, number and URL are read; check runs and commit statuses are counted, and any
    failure makes the checks failing, anything unfinished pending."""
    rollup = [
        {"__typename": "CheckRun", "status": "COMPLETED", "conclusion": "SUCCESS"},
        {"__typename": "CheckRun", "status": "COMPLETED", "conclusion": "SKIPPED"},
        {"__typename": "CheckRun", "status": "IN_PROGRESS", "conclusion": ""},
        {"__typename": "StatusContext", "state": "SUCCESS", "context": "ci"},
    ]
    out = orjson.dumps({"number": 7, "state": "OPEN", "url": "https://github.com/acme/widgets/pull/7", "statusCheckRollup": rollup})
    answer = forge.parse_answer(PrQuery(GITHUB, "topic"), 0, out, b"")
    assert answer == PrAnswer(
        "open", 7, "https://github.com/acme/widgets/pull/7",
        {"state": "pending", "total": 4, "passed": 3, "failed": 0, "pending": 1},
    )  # fmt: skip
    failing = forge.github_checks([*rollup, {"__typename": "CheckRun", "status": "COMPLETED", "conclusion": "FAILURE"}])
    assert failing["state"] == "failing" and failing["failed"] == 1
    merged = forge.parse_answer(PrQuery(GITHUB, "t"), 0, b'{"number":1,"state":"MERGED","url":"u","statusCheckRollup":[]}', b"")
    assert isinstance(merged, PrAnswer) and merged.state == "merged" and merged.checks == {
        "state": "none", "total": 0, "passed": 0, "failed": 0, "pending": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("code", "stderr", "kind"),
    [
        (1, 'no pull requests found for branch "topic"', None),
        (4, "To get started with GitHub CLI, please run:  gh auth login", "not_logged_in"),
        (1, "GraphQL: API rate limit exceeded for user ID 1.", "rate_limited"),
        (1, "HTTP 403: You have exceeded a secondary rate limit", "rate_limited"),
        (1, "GraphQL: Could not resolve to a Repository with the name 'acme/widgets'. (repository)", "not_found"),
        (1, "error connecting to api.github.com", "failed"),
    ],
)
def test_github_failures_are_classified(code: int, stderr: str, kind: str | None) -> None:
    """No pull request for the branch is an answer (state none); a login, the rate limit, an
    unknown repository and anything else are errors of their own kind, with a message."""
    outcome = forge.parse_answer(PrQuery(GITHUB, "topic"), code, b"", stderr.encode())
    if kind is None:
        assert outcome == PrAnswer("none")
    else:
        assert isinstance(outcome, ProbeError) and outcome.kind == kind and outcome.message


def test_junk_output_is_a_failure_not_a_crash() -> None:
    """Output that is not JSON, or JSON without the fields, is a `failed` error naming it."""
    for out in (b"<html>", b'{"number": 1}', b"[]"):
        outcome = forge.parse_answer(PrQuery(GITHUB, "t"), 0, out, b"")
        assert isinstance(outcome, ProbeError) and outcome.kind == "failed"


def test_gitlab_and_gitea_answers() -> None:
    """glab's merge request (iid, state, web_url, head pipeline) and tea's list (the newest
    pull request whose head is the branch, or none) are read."""
    lab = forge.parse_answer(
        PrQuery(Remote("gitlab", "gitlab.com", "g/r"), "x"), 0,
        orjson.dumps({"iid": 3, "state": "opened", "web_url": "w", "head_pipeline": {"status": "failed"}}), b"",
    )  # fmt: skip
    assert isinstance(lab, PrAnswer) and (lab.state, lab.number, lab.checks and lab.checks["state"]) == ("open", 3, "failing")
    tea_query = PrQuery(Remote("gitea", "codeberg.org", "m/t"), "x")
    listing = [
        {"index": "2", "state": "closed", "head": "x", "url": "u2", "ci": ""},
        {"index": "5", "state": "open", "head": "x", "url": "u5", "ci": "success"},
        {"index": "9", "state": "open", "head": "other", "url": "u9", "ci": ""},
    ]
    tea = forge.parse_answer(tea_query, 0, orjson.dumps(listing), b"")
    assert isinstance(tea, PrAnswer) and (tea.state, tea.number, tea.url) == ("open", 5, "u5")
    assert forge.parse_answer(tea_query, 0, b"[]", b"") == PrAnswer("none")
    lab_none = forge.parse_answer(PrQuery(Remote("gitlab", "gitlab.com", "g/r"), "x"), 1, b"", b'no open merge request available for "x"')
    assert lab_none == PrAnswer("none")


def test_the_schedule_backs_off_from_30_s_to_15_min() -> None:
    """Answers: every 30 s. Failures in a row: 30, 60, 120... seconds, never over 15 minutes."""
    assert forge.next_delay(0) == 30.0
    assert [forge.next_delay(n) for n in range(1, 8)] == [30.0, 60.0, 120.0, 240.0, 480.0, 900.0, 900.0]
    assert forge.next_delay(1000) == 900.0


def test_the_pr_field_keeps_the_last_answer_through_an_error() -> None:
    """The value shows the last answer and the last error together; nothing asked yet is unknown."""
    assert forge.answer_value("github", None, None) == {"forge": "github", "state": "unknown"}
    answer = PrAnswer("open", 7, "u", None)
    value = forge.answer_value("github", answer, ProbeError("rate_limited", "slow down"))
    assert value == {"forge": "github", "state": "open", "number": 7, "url": "u", "checks": None,
                     "error": {"kind": "rate_limited", "message": "slow down"}}  # fmt: skip
