"""Reward functions and their safe composition. Rewards are maximised.

Contract (docs/ARCHITECTURE.md): a reward is a plain callable
`fn(prompts: list[str], completions: list[str], **task_fields) -> list[float]`, one float per
completion; task fields are lists aligned with the completions (e.g. `answer=[...]`); fields a
reward does not use are ignored through `**_`.

`guard_reward` / `combine_rewards` make any reward safe for a training run: a reward that raises,
returns a non-finite value, or runs past its time bound on one completion scores that completion 0.0
and is counted in a `RewardStats`: an odd completion never crashes a run. A reward that fails on
more than `max_failure_fraction` of the completions it scored, beyond chance (`over_failure_limit`;
by default half, once 16 have been scored; a run sets `task.max_reward_failure_fraction`:
`failure_limits`) is a bug, not
noise: it raises `RewardFunctionError` naming the reward, the fraction, the limit and its last
error, and the command line reports it in one line instead of training on zeros. The training
loops log each step's counts (`reward_guards` finds every guard of a reward, a combination's
parts included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .extraction import EXTRACTION_MODES, extract_answer, find_boxed
from .ifeval import (
    ifeval_inst_loose,
    ifeval_inst_strict,
    ifeval_prompt_loose,
    ifeval_prompt_strict,
)
from .stats import RewardStats
from .timeout import RewardTimeoutError, call_with_timeout
from .verify import DEFAULT_VERIFY_TIMEOUT_S, answers_match

RewardFn = Callable[..., list[float]]


class RewardFunctionError(RuntimeError):
    """A reward that fails on most completions: a broken function, not an odd completion."""


def _check_lengths(name: str, completions: Sequence[str], **fields: Any) -> None:
    for key, values in fields.items():
        if len(values) != len(completions):
            raise ValueError(
                f"{name}: {len(completions)} completions but {len(values)} values in field "
                f"{key!r}; every task field must hold one value per completion"
            )


def make_math_reward(
    mode: str = "auto",
    *,
    timeout_s: float | None = DEFAULT_VERIFY_TIMEOUT_S,
    name: str | None = None,
) -> RewardFn:
    """A 1.0 / 0.0 correctness reward that extracts answers with `extract_answer(c, mode)`.

    mode "auto" suits reasoning completions ("... \\boxed{12}"); "first_number" suits the
    prefilled arithmetic format where the completion starts with the answer ("79<|im_end|>").
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"math reward mode {mode!r} is not valid; valid: {EXTRACTION_MODES}")

    def reward(
        prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
    ) -> list[float]:
        _check_lengths(reward.__name__, completions, answer=answer)
        return [
            1.0 if answers_match(extract_answer(c, mode), str(a), timeout_s=timeout_s) else 0.0
            for c, a in zip(completions, answer, strict=True)
        ]

    reward.__name__ = name or f"math_reward_{mode}"
    reward.__doc__ = f"1.0 when the {mode!r}-extracted answer matches `answer`, else 0.0."
    return reward


def math_reward(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    """1.0 when the completion's final answer (`extract_answer`, mode "auto") equals `answer`.

    The ESSA paper's fitness (arXiv 2507.04453, Sec. 3): final-answer correctness under the system
    prompt "Please reason step by step and place your final answer in \\boxed{}."
    """
    return _math_auto(prompts, completions, answer)


def arith_reward(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    """1.0 when the *first* number of the completion equals `answer` (prefilled "A + B = " format).

    The prompt already ends with "A + B = ", so the completion is "79<|im_end|>" or "79\\n...";
    anything after the first number is ignored (and a completion without a number scores 0.0).
    """
    return _math_first(prompts, completions, answer)


_math_auto = make_math_reward("auto", name="math_reward")
_math_first = make_math_reward("first_number", name="arith_reward")


def format_reward(prompts: Sequence[str], completions: Sequence[str], **_: Any) -> list[float]:
    """1.0 when the completion puts a non-empty final answer in `\\boxed{}` (the paper's format)."""
    return [1.0 if any(b.strip() for b in find_boxed(c)) else 0.0 for c in completions]


# Printable ASCII spans code points 32 (space) to 126 ("~"): the widest gap char_match grades.
_CHAR_SPAN = 94.0


def char_match_reward(
    prompts: Sequence[str], completions: Sequence[str], answer: Sequence[str], **_: Any
) -> list[float]:
    """Dense partial credit for the reference `answer`, character by character, in [0, 1].

    With c the completion and a the answer (both stripped of surrounding whitespace) and
    n = max(len(c), len(a)), the score is sum_i max(0, 1 - |ord(c_i) - ord(a_i)| / 94) / n over
    the positions both have; a missing or extra character scores 0 (0.0 when both are empty). The
    exact answer scores 1.0, "78" for "79" 0.99, a letter for a digit about 0.5. Not a correctness
    reward: a shaping signal that every completion varies, so that a model that never answers
    correctly (a random tiny model, the tests' `random:tiny`) still ranks its candidates and
    improves by writing characters nearer the answer's. Suits short answers (the arithmetic tasks).
    """
    _check_lengths("char_match_reward", completions, answer=answer)
    out = []
    for c, a in zip(completions, answer, strict=True):
        c, a = c.strip(), str(a).strip()
        n = max(len(c), len(a))
        close = sum(
            max(0.0, 1.0 - abs(ord(x) - ord(y)) / _CHAR_SPAN) for x, y in zip(c, a, strict=False)
        )
        out.append(close / n if n else 0.0)
    return out


REWARDS: dict[str, RewardFn] = {
    "math": math_reward,
    "arith": arith_reward,
    "format": format_reward,
    "char_match": char_match_reward,
    # IFEval instruction following (rewards/ifeval.py; needs the `lmeval` extra when called)
    "ifeval_inst_strict": ifeval_inst_strict,
    "ifeval_inst_loose": ifeval_inst_loose,
    "ifeval_prompt_strict": ifeval_prompt_strict,
    "ifeval_prompt_loose": ifeval_prompt_loose,
}


def get_reward(name: str) -> RewardFn:
    """A registered reward by name: "math", "arith" (first number), "format" or "char_match"
    (dense character-level closeness to the answer)."""
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; valid: {sorted(REWARDS)}")
    return REWARDS[name]


def register_reward(name: str, fn: RewardFn) -> RewardFn:
    """Register `fn(prompts, completions, **task_fields) -> list[float]` under `name` for configs.

    The loops wrap every reward with `guard_reward`, so an exception or a non-finite value on one
    completion scores it 0.0 and is counted instead of ending the run.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"reward {name!r} must be callable, got {type(fn).__name__}")
    if name in REWARDS and REWARDS[name] is not fn:
        raise ValueError(f"reward name {name!r} is taken by {REWARDS[name]!r}")
    REWARDS[name] = fn
    return fn


# ---------------------------------------------------------------------------------------------
# safe calling and composition


def _item_fields(fields: Mapping[str, Any], i: int, n: int) -> dict[str, Any]:
    """Slice list-valued task fields (one value per completion) to item i; keep the rest."""
    out = {}
    for key, value in fields.items():
        if isinstance(value, list | tuple | np.ndarray) and len(value) == n:
            out[key] = [value[i]]
        else:
            out[key] = value
    return out


def _valid_scores(scores: Any, n: int) -> list[float] | None:
    try:
        vals = [float(s) for s in scores]
    except (TypeError, ValueError):
        return None
    return vals if len(vals) == n else None


class GuardedReward:
    """A reward wrapped so that failures and time-outs score 0.0 per completion and are counted.

    The batch is first scored in one call (bounded by `timeout_s * n`); if that call raises, times
    out, or returns the wrong number of values, each completion is rescored alone under `timeout_s`
    and only the completions that fail alone score 0.0. Non-finite values score 0.0 (failure).
    """

    def __init__(
        self,
        fn: RewardFn,
        *,
        timeout_s: float | None = 30.0,
        name: str | None = None,
        max_failure_fraction: float = 0.5,
        min_scored: int = 16,
        check_in_call: bool = True,
    ):
        self.fn = fn
        self.timeout_s = timeout_s
        self.__name__ = name or getattr(fn, "__name__", type(fn).__name__)
        self.stats = RewardStats()
        # Past `min_scored` completions, a failure fraction above this is a broken reward.
        self.max_failure_fraction = max_failure_fraction
        self.min_scored = min_scored
        # Whether every call checks it (`check`); a multi-process run checks at step boundaries
        # instead, on every process's counts, so that all processes stop together.
        self.check_in_call = check_in_call

    def check(self, counts: Mapping[str, int] | None = None) -> None:
        """Raise `RewardFunctionError` when the failed completions (raised, non-finite, wrong
        output or timed out) exceed `max_failure_fraction` of those scored beyond chance
        (`over_failure_limit`); `counts` (`RewardStats.counts()`, e.g. summed over processes)
        default to its own."""
        st = self.stats
        c = counts if counts is not None else st.counts()
        calls, bad = c["calls"], c["failures"] + c["timeouts"]
        if over_failure_limit(bad, calls, self.max_failure_fraction, self.min_scored):
            raise RewardFunctionError(
                f"reward {self.__name__!r} failed on {bad} of {calls} completions "
                f"({bad / calls:.3g} > the limit {self.max_failure_fraction:g}, "
                f"task.max_reward_failure_fraction; {c['nonfinite']} non-finite, "
                f"{c['raised']} raised, {c['timeouts']} timed out; last: {st.last_error}); a "
                "reward must return one finite float per completion: fix it, pick another with "
                "--config.task.reward, or raise the limit"
            )

    def _check_broken(self) -> None:
        if self.check_in_call:
            self.check()

    def _bound(self, n: int) -> float | None:
        return None if self.timeout_s is None or self.timeout_s <= 0 else self.timeout_s * n

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], **fields: Any
    ) -> list[float]:
        prompts, completions = list(prompts), list(completions)
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{self.__name__}: {len(prompts)} prompts but {n} completions")
        self.stats.record_calls(n)
        try:
            scores = call_with_timeout(self.fn, self._bound(n), prompts, completions, **fields)
            scores = _valid_scores(scores, n)
        except RewardFunctionError:  # a guarded part of it is broken: that part's verdict
            raise
        except Exception:  # incl. RewardTimeoutError: rescore item by item below
            scores = None
        if scores is None:
            scores = [self._score_one(prompts, completions, fields, i) for i in range(n)]
        out = []
        for s in scores:
            if math.isfinite(s):
                out.append(s)
            else:
                self.stats.record_nonfinite(s)
                out.append(0.0)
        self._check_broken()
        return out

    def _score_one(self, prompts, completions, fields, i: int) -> float:
        n = len(completions)
        try:
            scores = call_with_timeout(
                self.fn,
                self._bound(1),
                [prompts[i]],
                [completions[i]],
                **_item_fields(fields, i, n),
            )
        except RewardTimeoutError as e:
            self.stats.record_timeout(f"{self.__name__} on completion {i}: {e}")
            return 0.0
        except RewardFunctionError:
            raise
        except Exception as e:
            self.stats.record_failure(e)
            return 0.0
        vals = _valid_scores(scores, 1)
        if vals is None:
            self.stats.record_failure(
                f"{self.__name__} returned {scores!r} for one completion; expected one float"
            )
            return 0.0
        return vals[0]


def guard_reward(
    fn: RewardFn,
    *,
    timeout_s: float | None = 30.0,
    name: str | None = None,
    max_failure_fraction: float | None = None,
) -> GuardedReward:
    """Wrap `fn` so it never crashes a run; its counters are at `.stats` (see `GuardedReward`).
    An already guarded `fn` is returned as it is; `max_failure_fraction` (None: the guard's
    default) sets the limit of it and of every guard inside it (`failure_limits`)."""
    g = fn if isinstance(fn, GuardedReward) else GuardedReward(fn, timeout_s=timeout_s, name=name)
    if max_failure_fraction is not None:
        failure_limits(g, max_failure_fraction)
    return g


def reward_guards(fn: Any) -> list[GuardedReward]:
    """`fn` and every `GuardedReward` inside it (a `CombinedReward`'s parts, at any depth),
    outermost first: whose counters a loop reads. A combination's parts count their own
    failures, which the outer guard never sees (each part scores a failed completion 0.0)."""
    out: list[GuardedReward] = []
    if isinstance(fn, GuardedReward):
        out.append(fn)
        fn = fn.fn
    if isinstance(fn, CombinedReward):
        for _, g, _ in fn.parts:
            out.extend(reward_guards(g))
    return out


def over_failure_limit(bad: int, calls: int, limit: float, min_scored: int = 16) -> bool:
    """Whether `bad` failed completions of `calls` scored exceed the failure fraction `limit`
    beyond chance: `bad > limit * n + 3 * sqrt(limit * (1 - limit) * n)` (three binomial
    standard deviations above the limit), judged once `min_scored` completions are scored (1
    with a limit of 0: no failure tolerated). A reward failing on 5% of completions thus never
    trips a limit of 10% on an unlucky first batch, while one failing on every completion stops
    at the first 16 (at any limit below 0.64)."""
    if limit <= 0:
        return bad > 0
    if calls < min_scored:
        return False
    return bad > limit * calls + 3.0 * math.sqrt(limit * (1.0 - limit) * calls)


def failure_limits(fn: Any, limit: float, *, check_in_call: bool = True) -> None:
    """Set the failure limit (`GuardedReward.check`, `over_failure_limit`) of every guard of
    `fn` (`reward_guards`); `check_in_call=False` leaves the check to the caller (a multi-process
    loop checks every process's counts at step boundaries)."""
    if not 0.0 <= limit <= 1.0:
        raise ValueError(f"a reward failure limit is a fraction in [0, 1], got {limit}")
    for g in reward_guards(fn):
        g.max_failure_fraction = float(limit)
        g.check_in_call = check_in_call


class CombinedReward:
    """Weighted sum of guarded rewards: r = sum_j w_j r_j (maximised).

    `components(...)` returns each reward's per-completion values by name (for logging);
    `stats` maps names to each reward's `RewardStats`.
    """

    def __init__(self, parts: Sequence[tuple[RewardFn, float]], *, timeout_s: float | None = 30.0):
        if not parts:
            raise ValueError("combine_rewards needs at least one (reward_fn, weight) pair")
        self.parts: list[tuple[str, GuardedReward, float]] = []
        seen: dict[str, int] = {}
        for j, part in enumerate(parts):
            if not (isinstance(part, tuple | list) and len(part) == 2 and callable(part[0])):
                raise ValueError(
                    f"combine_rewards part {j} is {part!r}; expected a (reward_fn, weight) pair"
                )
            fn, w = part
            g = guard_reward(fn, timeout_s=timeout_s)
            name = g.__name__
            if name in seen:
                seen[name] += 1
                name = f"{name}_{seen[name]}"
            else:
                seen[name] = 0
            self.parts.append((name, g, float(w)))
        self.__name__ = "+".join(f"{w:g}*{name}" for name, _, w in self.parts)

    @property
    def stats(self) -> dict[str, RewardStats]:
        return {name: g.stats for name, g, _ in self.parts}

    def components(
        self, prompts: Sequence[str], completions: Sequence[str], **fields: Any
    ) -> dict[str, list[float]]:
        return {name: g(prompts, completions, **fields) for name, g, _ in self.parts}

    def combine(self, components: Mapping[str, Sequence[float]]) -> list[float]:
        """The weighted sum of values returned by `components` (so they are computed once)."""
        n = len(next(iter(components.values())))
        total = [0.0] * n
        for name, _, w in self.parts:
            for i, v in enumerate(components[name]):
                total[i] += w * v
        return total

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], **fields: Any
    ) -> list[float]:
        return self.combine(self.components(prompts, completions, **fields))


def combine_rewards(
    parts: Sequence[tuple[RewardFn, float]], *, timeout_s: float | None = 30.0
) -> CombinedReward:
    """`combine_rewards([(math_reward, 1.0), (format_reward, 0.1)])`: a guarded weighted sum."""
    return CombinedReward(parts, timeout_s=timeout_s)
