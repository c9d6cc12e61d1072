"""What a run's reward could not score: per-step counts, the run's totals, the warning, the limit.

A guarded reward (`essa_jax.rewards.GuardedReward`) scores a completion it cannot score (the
reward raised, returned NaN / inf or not one value per completion, or timed out) 0.0 and counts
it; without these counts a run would train on those zeros and report nothing. `RewardCounter`
reads the counters of the reward and of every guarded part inside it (`rewards.reward_guards`:
a combination's parts count their own failures) and turns them into

- the fields of each `train` row of metrics.jsonl (the loop steps' completions since the previous
  row; an evaluation's are in the totals only):
  `reward_scored` (completions scored), `reward_failures` (those scored 0.0 for a failure,
  counted per reward and per part) = `reward_nonfinite` + `reward_raised` (raised, or not one
  value per completion) + `reward_timeouts`;
- the run's totals (`totals`: in every checkpoint's meta as `reward_counts`, so a resumed run
  keeps counting from there, and in summary.json with the same names);
- one warning line at the first step with failures, and one at the end of a run that had any;
- the limit `task.max_reward_failure_fraction` (`rewards.over_failure_limit`), checked by the
  guard at every call in a one-process run and by `check` at every step boundary: with several
  processes each scores its own rows, so the counts are summed over the processes first and
  every process stops after the same step (a guard raising alone would leave its peers waiting
  in the next collective).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from essa_jax.rewards import failure_limits, reward_guards

log = logging.getLogger(__name__)

# RewardStats.counts() keys, in the column order of the snapshots below.
KEYS = ("calls", "failures", "nonfinite", "raised", "timeouts")
# The metrics / summary field of each count.
FIELDS = {
    "calls": "reward_scored",
    "failures": "reward_failures",
    "nonfinite": "reward_nonfinite",
    "raised": "reward_raised",
    "timeouts": "reward_timeouts",
}


def _process_count() -> int:
    import jax

    return jax.process_count()


class RewardCounter:
    """The counts of `reward_fn`'s guards over a run (module docstring).

    `limit`: `task.max_reward_failure_fraction`, set on every guard; `base`: the totals of the
    checkpoint the run resumed from (`meta["reward_counts"]`, in FIELDS' names), None = a fresh
    run; `name`: the reward's name in the warning lines."""

    def __init__(
        self,
        reward_fn: Any,
        limit: float,
        *,
        base: Mapping[str, int] | None = None,
        name: str = "",
    ):
        self.guards = reward_guards(reward_fn)
        self.multi = _process_count() > 1
        self.limit = float(limit)
        if self.guards:
            failure_limits(reward_fn, self.limit, check_in_call=not self.multi)
        self.name = name or (self.guards[0].__name__ if self.guards else "reward")
        self.base = {f: int((base or {}).get(f, 0)) for f in FIELDS.values()}
        self._step_start: np.ndarray | None = None
        # The loop steps' counts since the previous train row (`step_begin` / `step_end`).
        self._pending = np.zeros((len(self.guards), len(KEYS)), np.int64)
        self.warned = False

    def snapshot(self) -> np.ndarray:
        """`[guards, KEYS]` counts so far in this invocation, summed over every process (a
        collective with several: every process calls it at the same point)."""
        local = np.asarray(
            [[g.stats.counts()[k] for k in KEYS] for g in self.guards] or np.zeros((0, len(KEYS))),
            np.int64,
        ).reshape(len(self.guards), len(KEYS))
        if not self.multi:
            return local
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(local)).sum(axis=0)

    @staticmethod
    def _fields(counts: np.ndarray) -> dict[str, int]:
        """FIELDS of `[guards, KEYS]` counts: the completions the outer reward scored, and each
        kind of failure summed over the reward and its parts."""
        if counts.shape[0] == 0:
            return dict.fromkeys(FIELDS.values(), 0)
        out = {FIELDS["calls"]: int(counts[0, 0])}
        for j, k in enumerate(KEYS[1:], start=1):
            out[FIELDS[k]] = int(counts[:, j].sum())
        out["reward_failures"] += out["reward_timeouts"]  # = nonfinite + raised + timeouts
        return out

    def step_begin(self) -> None:
        """Before a loop step: its reward calls are the counts between this and `step_end`."""
        self._step_start = self.snapshot()

    def step_end(self) -> None:
        """After a loop step: add its counts to the next `train` row's."""
        if self._step_start is not None:
            self._pending += self.snapshot() - self._step_start
            self._step_start = None

    def row_metrics(self, step: int) -> dict[str, int]:
        """The loop steps' counts since the previous `train` row (this one's fields: held-out
        evaluations are not in them, only in `totals`), and the warning line at the first step
        whose completions had failures. Call it for every row written."""
        m = self._fields(self._pending)
        self._pending = np.zeros_like(self._pending)
        bad = m["reward_failures"]
        if bad and not self.warned:
            self.warned = True
            log.warning(
                "reward %r could not score %d of %d completions by step %d (%d non-finite, %d "
                "raised, %d timed out; last: %s); they scored 0.0. Counts per step: "
                "metrics.jsonl reward_failures; the run stops above "
                "task.max_reward_failure_fraction = %g",
                self.name,
                bad,
                m["reward_scored"],
                step,
                m["reward_nonfinite"],
                m["reward_raised"],
                m["reward_timeouts"],
                self._last_error(),
                self.limit,
            )
        return m

    def check(self) -> None:
        """Raise `RewardFunctionError` (one line) when a guard's counts in this invocation, over
        every process, exceed the limit. A no-op for a one-process run, whose guards check at
        every call; with several processes every process calls it after the same step."""
        if not self.multi:
            return
        now = self.snapshot()
        for g, row in zip(self.guards, now, strict=True):
            g.check(dict(zip(KEYS, (int(v) for v in row), strict=True)))

    def totals(self) -> dict[str, int]:
        """The run's counts: the resumed checkpoint's plus this invocation's (FIELDS' names)."""
        now = self._fields(self.snapshot())
        return {f: self.base[f] + now[f] for f in FIELDS.values()}

    def warn_totals(self, totals: Mapping[str, int]) -> None:
        """One warning line for a run that ended with failures (none: nothing)."""
        bad = totals["reward_failures"]
        if bad:
            log.warning(
                "reward %r could not score %d of %d completions in this run (%d non-finite, %d "
                "raised, %d timed out; scored 0.0; summary.json reward_failures)",
                self.name,
                bad,
                totals["reward_scored"],
                totals["reward_nonfinite"],
                totals["reward_raised"],
                totals["reward_timeouts"],
            )

    def _last_error(self) -> str:
        errors = [g.stats.last_error for g in self.guards if g.stats.last_error]
        return errors[-1] if errors else "?"
