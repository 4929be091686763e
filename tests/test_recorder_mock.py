"""The scripted model behind the recordings (replay_fixtures/record/mock_anthropic.py).

It decides what the real CLI is told to do when a recording is made, so its choices are
pinned here: the keyword picks the script, tool results advance it, subagent prompts and
task notifications get their own replies, and APIERR401 fails like the real API.
"""

from __future__ import annotations

from replay_fixtures.record.mock_anthropic import DONE, choose_reply


def _user(text: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def _result(text: str) -> dict[str, object]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": text}]}


def test_the_prompt_keyword_picks_the_script_and_each_tool_result_advances_it() -> None:
    """SUBAGENT asks for an Agent call first, then (after its result) reports; past the
    script's end the model says Done."""
    first = choose_reply([_user("Use a SUBAGENT to read notes.txt")], "/w")
    assert isinstance(first, list) and first[-1][0] == "tool_use" and first[-1][1][0] == "Agent"
    second = choose_reply([_user("Use a SUBAGENT"), {"role": "assistant", "content": []}, _result("x")], "/w")
    assert isinstance(second, list) and second[0][0] == "text" and "reported" in second[0][1]
    later = choose_reply([_user("SUBAGENT"), _result("a"), _result("b")], "/w")
    assert later == DONE


def test_a_subagent_prompt_picks_its_own_script_with_the_workspace_path() -> None:
    """The subagent's conversation starts with the parent's Agent prompt; its Read names the
    real working directory."""
    reply = choose_reply([_user("SUBTASK-READ: read notes.txt and report its first line")], "/work/dir")
    assert isinstance(reply, list)
    assert reply[-1] == ("tool_use", ["Read", {"file_path": "/work/dir/notes.txt"}])


def test_task_notifications_get_replies_and_chains_continue() -> None:
    """A wake (a <task-notification> user text) is answered with its summary; a chained step's
    notification starts the next background command."""
    plain = choose_reply([_user("<task-notification><summary>Agent \"x\" finished</summary></task-notification>")], "/w")
    assert isinstance(plain, list) and 'Agent "x" finished' in plain[0][1]
    chained = choose_reply([_user('<task-notification><summary>Background command "CHAIN-ONE first step" completed</summary></task-notification>')], "/w")
    assert isinstance(chained, list) and chained[-1][1][1]["description"] == "CHAIN-TWO second step"


def test_the_agent_id_of_an_earlier_launch_fills_task_stop() -> None:
    """STOPIT stops the agent whose id the conversation's last launch result named."""
    launched = _result("Async agent launched successfully.\nagentId: a1b2c3 (internal ID)")
    reply = choose_reply([_user("Start a BGLONG agent"), launched, _user("Now STOPIT")], "/w")
    assert isinstance(reply, list) and reply[-1] == ("tool_use", ["TaskStop", {"task_id": "a1b2c3"}])


def test_apierr401_fails_the_request() -> None:
    """The prompt APIERR401 gets HTTP 401, as the real API answers a bad key."""
    assert choose_reply([_user("APIERR401 please")], "/w") == 401
