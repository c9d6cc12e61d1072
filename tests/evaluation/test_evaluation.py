"""pass@k, intervals, paired test, and the held-out evaluation with a fake sampler."""

import itertools
import math

import numpy as np
import pytest

from essa_jax.data import generate_task
from essa_jax.evaluation import (
    Z95,
    heldout_accuracy,
    heldout_pass_at_k,
    mcnemar_exact,
    mean_pass_at_k,
    pass_at_k,
    wilson_interval,
)
from essa_jax.rewards import arith_reward


def brute_pass_at_k(n, c, k):
    """Fraction of all k-subsets of n samples (c correct) that contain a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1024, 512) overflows floats; the product form does not.
    val = pass_at_k(1024, 3, 512)
    exact = 1 - math.comb(1021, 512) / math.comb(1024, 512)
    assert val == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(256, 0, 256) == 0.0 and pass_at_k(256, 1, 256) == 1.0
    assert pass_at_k(10, 4, 1) == pytest.approx(0.4)


def test_pass_at_k_validation():
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(4, 5, 1)


def test_mcnemar_exact_against_the_binomial_tail():
    # 2 fixed, 6 broken (the founding session's default run): p = 2 * P[Bin(8, 1/2) <= 2] = 0.289.
    before = [0, 0] + [1] * 6 + [1] * 5 + [0] * 3
    after = [1, 1] + [0] * 6 + [1] * 5 + [0] * 3
    r = mcnemar_exact(before, after)
    assert (r["fixed"], r["broken"]) == (2, 6)
    assert r["p_value"] == pytest.approx(2 * (1 + 8 + 28) / 256)
    # Symmetric in direction, capped at 1, and only discordant pairs count.
    assert mcnemar_exact(after, before)["p_value"] == r["p_value"]
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]) == {"fixed": 0, "broken": 0, "p_value": 1.0}
    assert mcnemar_exact([0] * 20, [1] * 20)["p_value"] == pytest.approx(2 / 2**20)
    with pytest.raises(ValueError, match="equal-length"):
        mcnemar_exact([0, 1], [1])


@pytest.mark.parametrize(("x", "n"), [(0, 10), (3, 10), (8, 10), (10, 10), (24, 100), (1, 3)])
def test_wilson_interval_inverts_the_score_test(x, n):
    low, high = wilson_interval(x, n)
    p = x / n
    assert 0.0 <= low <= p <= high <= 1.0
    # Wilson's endpoints are the p0 where the score statistic equals z: |p - p0| = z*se(p0).
    for p0 in (low, high):
        if 0.0 < p0 < 1.0:
            assert abs(p - p0) == pytest.approx(Z95 * math.sqrt(p0 * (1 - p0) / n), abs=1e-12)
    if x == 0:
        assert low == 0.0
    if x == n:
        assert high == pytest.approx(1.0)


@pytest.mark.parametrize(("x", "n"), [(24, 100), (0, 7), (5, 5), (13, 40)])
def test_wilson_matches_quadratic_roots(x, n):
    # The Wilson endpoints are the roots in p0 of (x/n - p0)^2 = z^2 p0 (1 - p0) / n, i.e. of
    # (n + z^2) p0^2 - (2x + z^2) p0 + x^2 / n = 0 (scipy's binomtest(...).proportion_ci(method=
    # "wilson") gives the same; importing scipy.stats costs ~10 s here).
    z2 = Z95**2
    roots = np.sort(np.roots([n + z2, -(2 * x + z2), x * x / n]).real)
    assert wilson_interval(x, n) == pytest.approx(tuple(np.clip(roots, 0, 1)), abs=1e-9)


def test_mean_pass_at_k():
    assert mean_pass_at_k([0, 2, 4], 4, 1) == pytest.approx(0.5)  # pass@1 = mean fraction correct
    assert mean_pass_at_k([0, 1], 2, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        mean_pass_at_k([], 4, 1)


class FakeSampler:
    """Problem i: greedy right on even i; c_i = i % (n + 1) of its n samples right."""

    def __init__(self, examples, n):
        self.examples, self.n, self.calls = examples, n, []

    def __call__(self, num_samples, greedy):
        self.calls.append((num_samples, greedy))
        out = []
        for i, ex in enumerate(self.examples):
            right, wrong = ex["answer"] + "<|im_end|>", str(int(ex["answer"]) + 1) + "\nmore"
            if greedy:
                out.append([right if i % 2 == 0 else wrong] * num_samples)
            else:
                c = i % (self.n + 1)
                out.append([right] * c + [wrong] * (num_samples - c))
        return out, 10 * num_samples * len(out)


def _problems(num, seed=0):
    _, evals = generate_task("add_2d", num_train=0, num_eval=num, seed=seed)
    return evals, [e["question"] for e in evals], {"answer": [e["answer"] for e in evals]}


def test_heldout_accuracy_with_fake_sampler():
    evals, prompts, fields = _problems(7)
    sampler = FakeSampler(evals, 4)
    res = heldout_accuracy(sampler, prompts, fields, arith_reward)
    assert list(res) == ["acc", "correct", "n", "ci_low", "ci_high", "reward", "eval_tokens"] + [
        "solved"
    ]
    assert (res["acc"], res["correct"], res["n"]) == (4 / 7, 4, 7)
    assert (res["ci_low"], res["ci_high"]) == wilson_interval(4, 7)
    assert res["reward"] == pytest.approx(4 / 7) and res["eval_tokens"] == 70
    assert res["solved"] == "1010101"
    assert sampler.calls == [(1, True)]
    # A graded reward: correct means reward >= success_threshold; `reward` is the mean.
    half = lambda prompts, completions, **_: [0.5] * len(completions)  # noqa: E731
    res = heldout_accuracy(sampler, prompts, fields, half)
    assert res["correct"] == 0 and res["reward"] == 0.5 and res["solved"] == "0" * 7
    res = heldout_accuracy(sampler, prompts, fields, half, success_threshold=0.5)
    assert res["correct"] == 7 and res["ci_high"] == 1.0


def test_heldout_pass_at_k_with_fake_sampler():
    evals, prompts, fields = _problems(7)
    n = 4
    sampler = FakeSampler(evals, n)
    res = heldout_pass_at_k(sampler, prompts, fields, arith_reward, samples=n, ks=(1, 2, 4))
    counts = [i % (n + 1) for i in range(7)]  # 0 1 2 3 4 0 1
    assert list(res) == ["pass_at_1", "pass_at_2", "pass_at_4"] + [
        "pass_samples",
        "pass_problems",
        "pass_tokens",
        "pass_at_1_ci",
        "pass_at_2_ci",
        "pass_at_4_ci",
        "pass_ci_level",
        "pass_ci_resamples",
        "pass_correct",
    ]
    assert res["pass_correct"] == counts
    for k in (1, 2, 4):  # each interval holds its estimate
        lo, hi = res[f"pass_at_{k}_ci"]
        assert 0.0 <= lo <= res[f"pass_at_{k}"] <= hi <= 1.0
    for k in (1, 2, 4):
        expected = np.mean([brute_pass_at_k(n, c, k) for c in counts])
        assert res[f"pass_at_{k}"] == pytest.approx(expected)
    assert res["pass_at_1"] == pytest.approx(sum(counts) / (7 * n))
    assert (res["pass_samples"], res["pass_problems"], res["pass_tokens"]) == (4, 7, 280)
    assert sampler.calls == [(4, False)]
    with pytest.raises(ValueError, match="1 <= k <= 4"):
        heldout_pass_at_k(sampler, prompts, fields, arith_reward, samples=n, ks=(8,))


def test_heldout_reward_sees_each_completion_with_its_prompt_and_fields():
    evals, prompts, fields = _problems(3)
    seen = []

    def reward(prompts, completions, answer, **_):
        seen.append((list(prompts), list(completions), list(answer)))
        return [1.0] * len(completions)

    def sample(num_samples, greedy):
        return [[f"{i}.{j}" for j in range(num_samples)] for i in range(3)], 0

    heldout_pass_at_k(sample, prompts, fields, reward, samples=2, ks=(2,))
    ((p, c, a),) = seen
    assert p == [prompts[0]] * 2 + [prompts[1]] * 2 + [prompts[2]] * 2
    assert c == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]
    assert a == [x for x in fields["answer"] for _ in range(2)]


def test_heldout_counts_a_failing_reward_as_wrong():
    evals, prompts, fields = _problems(4, seed=1)

    def flaky(prompts, completions, answer, **_):
        raise RuntimeError("grader crashed")

    res = heldout_accuracy(FakeSampler(evals, 2), prompts, fields, flaky)
    assert res["acc"] == 0.0 and res["solved"] == "0000"


def test_heldout_validates_sampler_output_and_inputs():
    _, prompts, fields = _problems(2, seed=1)
    with pytest.raises(ValueError, match="expected 2 problems of 3"):
        heldout_pass_at_k(
            lambda n, g: ([["1"]] * 2, 0), prompts, fields, arith_reward, samples=3, ks=(1,)
        )
    with pytest.raises(ValueError, match="expected 2 problems of 1"):
        heldout_accuracy(lambda n, g: ([["1"]], 0), prompts, fields, arith_reward)
    with pytest.raises(ValueError, match="field 'answer' has 2 values for 1"):
        heldout_accuracy(lambda n, g: ([["1"]], 0), prompts[:1], fields, arith_reward)
    with pytest.raises(ValueError, match="at least one problem"):
        heldout_accuracy(lambda n, g: ([], 0), [], {}, arith_reward)
