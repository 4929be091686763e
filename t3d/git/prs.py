"""`PullRequests`: the driver that asks the forge CLIs about branches (plan in forge.py).

Rules:
- Only through the spawner's ``forge`` pool (never git's), at most ``workers`` probes at
  once, each killed after `forge.TIMEOUT_S`: a hanging ``gh`` holds a forge slot, never a
  git one, and nothing waits for it (probes run as tasks of their own).
- A query is probed at most every `forge.INTERVAL_S`, and after failures on the backoff of
  `forge.next_delay` (30 s doubling to 15 min); one probe of a query at a time. Across all
  queries at most `PER_MINUTE` probes a minute (the forges' API limits are per user, and
  the user's own ``gh`` shares them); queries a thread subscriber looks at go first.
- A CLI that is not on PATH is a status (``not_installed``) found without starting a
  process, logged once per CLI; other errors are logged when a query's error kind
  changes, never on every retry.
- Bounded: one entry per query some workspace names (`forget` drops the rest).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from t3d.errors import SpawnerError
from t3d.git import forge
from t3d.git.forge import PrAnswer, ProbeError, PrQuery
from t3d.spawn.child import Spawner

log = logging.getLogger("t3d.git.forge")

PER_MINUTE = 30
BURST = 8
_SCRUB = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


@attrs.define
class _Query:
    answer: PrAnswer | None = None
    error: ProbeError | None = None
    failures: int = 0
    next_at: float = 0.0
    running: bool = False


class PullRequests:
    def __init__(
        self,
        spawner: Spawner,
        *,
        workers: int,
        changed: Callable[[PrQuery], None],
        clock: Callable[[], float],
    ) -> None:
        self._spawner = spawner
        self._limiter = trio.CapacityLimiter(workers)
        self._changed = changed
        self._clock = clock
        self._queries: dict[PrQuery, _Query] = {}
        self._tokens = float(BURST)
        self._filled_at = clock()
        self._missing_logged: set[str] = set()
        self._env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        self.processes = 0
        self.errors: dict[str, int] = {}

    def value(self, query: PrQuery) -> dict[str, Any]:
        """The ``pr`` field of a workspace whose branch is ``query``'s."""
        state = self._queries.get(query)
        if state is None:
            return forge.answer_value(query.remote.forge, None, None)
        return forge.answer_value(query.remote.forge, state.answer, state.error)

    def forget(self, keep: Iterable[PrQuery]) -> None:
        kept = set(keep)
        for query in [q for q, s in self._queries.items() if q not in kept and not s.running]:
            del self._queries[query]

    def due(self, query: PrQuery, now: float) -> bool:
        state = self._queries.get(query)
        return state is None or (not state.running and now >= state.next_at)

    def start_due(self, nursery: trio.Nursery, queries: list[tuple[PrQuery, str]]) -> None:
        """Start the due probes of ``queries`` ((query, directory to run in), most wanted
        first) that the rate allows."""
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._filled_at) * PER_MINUTE / 60.0)
        self._filled_at = now
        for query, cwd in queries:
            if self._tokens < 1.0:
                return
            if not self.due(query, now):
                continue
            state = self._queries.setdefault(query, _Query())
            state.running = True
            self._tokens -= 1.0
            nursery.start_soon(self._probe, query, state, cwd)

    async def _probe(self, query: PrQuery, state: _Query, cwd: str) -> None:
        try:
            async with self._limiter:
                outcome = await self._ask(query, cwd)
        finally:
            state.running = False
        before = state.error.kind if state.error else None
        if isinstance(outcome, ProbeError):
            state.error = outcome
            state.failures += 1
            self.errors[outcome.kind] = self.errors.get(outcome.kind, 0) + 1
            if outcome.kind != before:
                self._log(query, outcome)
        else:
            state.answer, state.error, state.failures = outcome, None, 0
        state.next_at = self._clock() + forge.next_delay(state.failures)
        self._changed(query)

    async def _ask(self, query: PrQuery, cwd: str) -> PrAnswer | ProbeError:
        argv = forge.probe_argv(query)
        path = await trio.to_thread.run_sync(
            shutil.which, argv[0], os.X_OK, self._env.get("PATH", os.defpath)
        )
        if path is None:
            return forge.not_installed(query.remote.forge)
        self.processes += 1
        try:
            result = await self._spawner.run(
                [path, *argv[1:]], cwd=cwd, env={**self._env, **forge.ENV}, kill_after=forge.TIMEOUT_S,
                output_cap=forge.OUTPUT_CAP, pool="forge", read_only=True,
            )  # fmt: skip
        except SpawnerError as exc:
            return ProbeError("failed", f"{argv[0]} could not run: {exc}")
        if result.timed_out:
            return forge.timed_out(query.remote.forge)
        return forge.parse_answer(query, result.returncode, result.stdout, result.stderr)

    def _log(self, query: PrQuery, error: ProbeError) -> None:
        cli = forge.CLI[query.remote.forge]
        if error.kind == "not_installed":
            if cli not in self._missing_logged:
                self._missing_logged.add(cli)
                log.info("%s", error.message)
            return
        log.warning(
            "pull request of %s on %s/%s: %s",
            query.branch,
            query.remote.host,
            query.remote.slug,
            error.message,
        )

    def statistics(self) -> dict[str, Any]:
        return {
            "queries": len(self._queries),
            "processes": self.processes,
            "running": sum(1 for s in self._queries.values() if s.running),
            "errors": dict(self.errors),
        }
