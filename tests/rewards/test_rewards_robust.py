"""Rewards never crash a run on an odd completion: failures and time-outs score 0.0 and are
counted; a reward failing on most completions is reported as the bug it is."""

import threading
import time

import pytest

from essa_jax.rewards import (
    VERIFY_STATS,
    RewardFunctionError,
    RewardTimeoutError,
    answers_match,
    call_with_timeout,
    combine_rewards,
    format_reward,
    guard_reward,
    math_reward,
)
from essa_jax.rewards import verify as verify_mod


def _spin(seconds):
    """Pure-Python busy loop (what a hung sympy computation looks like to the interpreter)."""
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1
    return x


def fragile_reward(prompts, completions, answer, **_):
    out = []
    for c, a in zip(completions, answer, strict=True):
        if c == "boom":
            raise RuntimeError("cannot score this one")
        if c == "hang":
            _spin(30.0)
        out.append(1.0 if c == a else 0.0)
    return out


def test_raising_completion_scores_zero_and_is_counted():
    g = guard_reward(fragile_reward, timeout_s=2.0)
    scores = g(["p"] * 4, ["1", "boom", "2", "3"], answer=["1", "1", "2", "4"])
    assert scores == [1.0, 0.0, 1.0, 0.0]
    assert g.stats.calls == 4
    assert g.stats.failures == 1 and g.stats.timeouts == 0
    assert g.stats.errors["RuntimeError"] == 1
    assert "cannot score" in g.stats.last_error


def test_hanging_completion_times_out_main_thread():
    g = guard_reward(fragile_reward, timeout_s=0.2)
    t0 = time.monotonic()
    scores = g(["p"] * 3, ["1", "hang", "2"], answer=["1", "1", "2"])
    elapsed = time.monotonic() - t0
    assert scores == [1.0, 0.0, 1.0]
    assert g.stats.timeouts == 1 and g.stats.failures == 0
    assert elapsed < 10.0  # 30 s of spinning was interrupted (bound is 0.6 s batch + 0.2 s item)


def test_timeout_in_worker_thread():
    out = {}

    def work():
        g = guard_reward(fragile_reward, timeout_s=0.2)
        out["scores"] = g(["p"] * 2, ["hang", "2"], answer=["1", "2"])
        out["timeouts"] = g.stats.timeouts

    t = threading.Thread(target=work)
    t.start()
    t.join(20.0)
    assert not t.is_alive()
    assert out == {"scores": [0.0, 1.0], "timeouts": 1}


def test_nested_timeouts_inner_and_outer():
    def inner():
        return call_with_timeout(_spin, 0.1, 5.0)

    with pytest.raises(RewardTimeoutError):
        call_with_timeout(inner, 5.0)
    # The outer bound fires while the inner (longer) one is still running.
    with pytest.raises(RewardTimeoutError):
        call_with_timeout(lambda: call_with_timeout(_spin, 5.0, 5.0), 0.1)
    assert call_with_timeout(lambda: call_with_timeout(sum, 1.0, [1, 2]), 1.0) == 3
    # Exceptions pass through unchanged.
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["x"], 1.0)


def test_answers_match_symbolic_timeout_is_a_counted_nonmatch(monkeypatch):
    monkeypatch.setattr(verify_mod, "_symbolic_match", lambda p, r: _spin(30.0) > 0)
    before = VERIFY_STATS.timeouts
    assert answers_match(r"x^{2}", r"x^2+0", timeout_s=0.1) is False
    assert VERIFY_STATS.timeouts == before + 1
    # The numeric fast path never reaches math-verify.
    assert answers_match("1,000", "1000", timeout_s=0.1) is True
    assert VERIFY_STATS.timeouts == before + 1


def test_non_finite_and_wrong_length_rewards():
    g = guard_reward(lambda p, c, **_: [float("nan")] * len(c))
    assert g(["a", "b"], ["1", "2"]) == [0.0, 0.0]
    assert g.stats.failures == 2
    short = guard_reward(lambda p, c, **_: [1.0])
    assert short(["a", "b"], ["1", "2"]) == [1.0, 1.0]  # rescored item by item
    bad = guard_reward(lambda p, c, **_: ["x"])
    assert bad(["a"], ["1"]) == [0.0]
    assert bad.stats.failures == 1


def test_combine_rewards_weights_and_components():
    r = combine_rewards([(math_reward, 1.0), (format_reward, 0.5), (fragile_reward, 2.0)])
    comps = [r"\boxed{3}", "3", "boom"]
    fields = {"answer": ["3", "3", "boom"]}
    parts = r.components(["p"] * 3, comps, **fields)
    assert parts == {
        "math_reward": [1.0, 1.0, 0.0],
        "format_reward": [1.0, 0.0, 0.0],
        "fragile_reward": [0.0, 1.0, 0.0],
    }
    assert r(["p"] * 3, comps, **fields) == [1.5, 3.0, 0.0]
    # Two calls (components, then __call__), one failing completion each.
    assert r.stats["fragile_reward"].failures == 2
    assert r.stats["fragile_reward"].calls == 6
    assert r.combine(parts) == [1.5, 3.0, 0.0]


def test_combine_rewards_rejects_bad_parts():
    with pytest.raises(ValueError, match="pair"):
        combine_rewards([math_reward])
    with pytest.raises(ValueError, match="at least one"):
        combine_rewards([])


def test_a_reward_that_fails_on_most_completions_is_an_error():
    """An odd completion scores 0; a reward failing on more than half is a bug and stops the run."""

    def typo(prompts, completions, answer_text, **_):  # the task has `answer`, not `answer_text`
        return [1.0] * len(completions)

    g = guard_reward(typo, timeout_s=2.0)
    assert g(["p"] * 8, ["1"] * 8, answer=["1"] * 8) == [0.0] * 8  # under min_scored: counted
    with pytest.raises(RewardFunctionError, match=r"reward 'typo' failed on 16 of 16 .*TypeError"):
        g(["p"] * 8, ["1"] * 8, answer=["1"] * 8)
    # One completion in four failing is noise, not a broken reward: no error however long it runs.
    ok = guard_reward(fragile_reward, timeout_s=2.0)
    for _ in range(8):
        ok(["p"] * 4, ["1", "boom", "2", "3"], answer=["1", "1", "2", "4"])
    assert ok.stats.calls == 32 and ok.stats.failures == 8


def test_nonfinite_and_raising_completions_are_counted_apart():
    import math

    from essa_jax.rewards import reward_guards

    def patchy(prompts, completions, **_):
        if "bug" in completions:
            raise KeyError("bug")
        return [math.nan if c == "nan" else math.inf if c == "inf" else 1.0 for c in completions]

    g = guard_reward(patchy, name="patchy")
    assert g(["p"] * 4, ["a", "nan", "inf", "b"]) == [1.0, 0.0, 0.0, 1.0]
    assert g(["p"] * 3, ["bug", "nan", "c"]) == [0.0, 0.0, 1.0]  # the batch raised: one by one
    assert g.stats.counts() == {
        "calls": 7,
        "failures": 4,
        "nonfinite": 3,
        "raised": 1,
        "timeouts": 0,
    }
    # A combination's parts count their own failures; reward_guards finds every one.
    both = guard_reward(combine_rewards([(patchy, 1.0), (format_reward, 0.1)]))
    assert both(["p"] * 2, ["nan", "\\boxed{1}"]) == [0.0, 1.1]
    guards = reward_guards(both)
    assert len(guards) == 3 and guards[0] is both
    assert [g.stats.counts()["nonfinite"] for g in guards] == [0, 1, 0]


def test_the_failure_limit_is_a_fraction_beyond_chance():
    from essa_jax.rewards import failure_limits, over_failure_limit

    # Every completion failing stops at the first 16 at the 0.1 default; 5% never trips 10%.
    assert over_failure_limit(16, 16, 0.1) and not over_failure_limit(15, 15, 0.1)
    assert not any(over_failure_limit(n // 20, n, 0.1) for n in range(16, 100_000, 7))
    assert over_failure_limit(30, 100, 0.1) and not over_failure_limit(15, 100, 0.1)
    assert over_failure_limit(1, 1, 0.0) and not over_failure_limit(0, 1000, 0.0)
    assert not over_failure_limit(1000, 1000, 1.0)

    def third_nan(prompts, completions, **_):
        return [float("nan") if i % 3 == 0 else 1.0 for i in range(len(completions))]

    g = guard_reward(third_nan, name="third_nan", max_failure_fraction=0.5)
    for _ in range(20):  # a third failing: under a limit of one half, however long it runs
        g(["p"] * 6, ["c"] * 6)
    failure_limits(g, 0.1)
    with pytest.raises(RewardFunctionError) as err:
        g(["p"] * 6, ["c"] * 6)
    msg = str(err.value)
    assert "reward 'third_nan' failed on 42 of 126 completions (0.333 > the limit 0.1" in msg
    assert "42 non-finite, 0 raised, 0 timed out" in msg and "\n" not in msg
    # The caller's check instead of every call's (a multi-process loop's, on summed counts).
    failure_limits(g, 0.1, check_in_call=False)
    g(["p"] * 6, ["c"] * 6)
    with pytest.raises(RewardFunctionError, match="failed on 44 of 132"):
        g.check()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        failure_limits(g, 1.5)
