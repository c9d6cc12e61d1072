"""pass@k, avg@k, intervals, and the evaluation driver with a fake sampler."""

import itertools
import math

import numpy as np
import pytest

from essa_jax.data import generate_task, load_task
from essa_jax.evaluation import (
    Z95,
    avg_at_k,
    evaluate,
    evaluate_task,
    ks_up_to,
    mcnemar_exact,
    mean_interval,
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


def test_avg_at_k_and_ks():
    assert avg_at_k([0, 2, 4], 4) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        avg_at_k([5], 4)
    assert ks_up_to(8) == [1, 2, 4, 8]
    assert ks_up_to(6) == [1, 2, 4, 6]
    assert ks_up_to(1) == [1]


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


def test_mean_interval():
    v = [0.0, 0.5, 1.0, 0.5]
    low, high = mean_interval(v)
    half = Z95 * np.std(v, ddof=1) / 2
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))


class FakeSampler:
    """Problem i answers correctly on a fixed pattern of its samples; greedy right on even i."""

    def __init__(self, examples, n):
        self.by_prompt = {}
        self.calls = []
        for i, ex in enumerate(examples):
            right, wrong = ex["answer"] + "<|im_end|>", str(int(ex["answer"]) + 1) + "\nmore"
            c = i % (n + 1)
            self.by_prompt[(i,)] = {
                "greedy": right if i % 2 == 0 else wrong,
                "samples": [right] * c + [wrong] * (n - c),
                "c": c,
            }

    def __call__(self, tokens, num_samples, greedy):
        self.calls.append((len(tokens), num_samples, greedy))
        out = []
        for t in tokens:
            entry = self.by_prompt[tuple(t)]
            out.append([entry["greedy"]] if greedy else list(entry["samples"]))
        return out


def test_evaluate_with_fake_sampler():
    _, evals = generate_task("add_2d", num_train=0, num_eval=7, seed=0)
    n = 4
    sampler = FakeSampler(evals, n)
    tokens = [[i] for i in range(7)]  # the fake sampler keys on these
    res = evaluate(
        sampler,
        evals,
        tokens,
        reward_fn=arith_reward,
        num_samples=n,
        batch_size=3,
        return_details=True,
    )
    counts = [i % (n + 1) for i in range(7)]  # 0 1 2 3 4 0 1
    assert res["num_problems"] == 7
    assert res["accuracy"] == pytest.approx(4 / 7)
    assert (res["accuracy_ci_low"], res["accuracy_ci_high"]) == pytest.approx(wilson_interval(4, 7))
    assert res["avg@4"] == pytest.approx(sum(counts) / (7 * n))
    for k in (1, 2, 4):
        expected = np.mean([brute_pass_at_k(n, c, k) for c in counts])
        assert res[f"pass@{k}"] == pytest.approx(expected)
    assert res["pass@1"] == pytest.approx(res["avg@4"])
    assert res["frac_all_correct"] == pytest.approx(1 / 7)
    assert res["frac_none_correct"] == pytest.approx(2 / 7)
    assert res["frac_mixed"] == pytest.approx(4 / 7)
    assert res["reward_failures"] == 0
    assert sampler.calls == [(3, 1, True), (3, 4, False)] * 2 + [(1, 1, True), (1, 4, False)]
    assert res["details"][3]["rewards"] == [1.0, 1.0, 1.0, 0.0]


def test_evaluate_counts_failing_rewards():
    _, evals = generate_task("add_2d", num_train=0, num_eval=4, seed=1)
    sampler = FakeSampler(evals, 2)

    def flaky(prompts, completions, answer, **_):
        if any("more" in c for c in completions):
            raise RuntimeError("grader crashed")
        return [1.0] * len(completions)

    res = evaluate(sampler, evals, [[i] for i in range(4)], reward_fn=flaky, num_samples=0)
    assert res["accuracy"] == pytest.approx(0.5)  # the wrong (odd) greedy ones crash -> 0.0
    assert res["reward_failures"] == 2


def test_evaluate_validates_sampler_output():
    _, evals = generate_task("add_2d", num_train=0, num_eval=2, seed=1)
    with pytest.raises(ValueError, match="expected 2 entries of 3"):
        evaluate(lambda t, n, g: [["1"]] * len(t), evals, [[0], [1]], num_samples=3, greedy=False)
    with pytest.raises(ValueError, match="2 examples but 1"):
        evaluate(lambda t, n, g: [], evals, [[0]])


def test_evaluate_task_uses_task_prompts_and_reward():
    class Tok:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

        def encode(self, text, add_special_tokens=False):
            return [ord(ch) for ch in text]

    task = load_task({"name": "add_2d", "num_train": 0, "num_eval": 5, "seed": 2})

    def oracle(tokens, num, greedy):
        out = []
        for t in tokens:
            text = "".join(map(chr, t))
            assert text.endswith(" = ")  # prefill format
            a, b = text.rsplit("<assistant>", 1)[1].rstrip(" =").split(" + ")
            out.append([f"{int(a) + int(b)}<|im_end|>"] * num)
        return out

    res = evaluate_task(oracle, task, Tok(), num_samples=2)
    assert res["accuracy"] == 1.0 and res["pass@2"] == 1.0 and res["prompts_too_long"] == 0
