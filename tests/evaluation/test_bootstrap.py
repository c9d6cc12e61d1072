"""Bootstrap intervals over problems for the unbiased pass@k (Chen et al. 2021, Eq. 1)."""

import math

import numpy as np
import pytest

from essa_jax.evaluation import (
    bootstrap_ci,
    bootstrap_pass_at_k,
    mean_pass_at_k,
    pass_at_k_per_problem,
    pass_at_k_values,
)


def numpy_bootstrap(values, resamples, level, seed):
    """The reference: all draws at once, the percentile interval of the resampled means."""
    v = np.asarray(values, np.float64)
    idx = np.random.default_rng(seed).integers(0, v.shape[-1], size=(resamples, v.shape[-1]))
    means = v[idx].mean(axis=1)
    a = (1 - level) / 2
    return np.quantile(means, [a, 1 - a])


def test_per_problem_pass_at_k_is_the_binomial_formula():
    n = 64
    counts = np.array([0, 1, 2, 7, 32, 63, 64])
    for k in (1, 4, 16, 64):
        ref = [1 - math.comb(n - c, k) / math.comb(n, k) for c in counts]
        got = pass_at_k_per_problem(counts, n, k)
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
        assert got.mean() == pytest.approx(mean_pass_at_k(counts, n, k), abs=1e-15)
    np.testing.assert_allclose(pass_at_k_per_problem(counts, n, 1), counts / n)
    with pytest.raises(ValueError, match=r"vector \[P\]"):
        pass_at_k_per_problem([], n, 1)


def test_bootstrap_matches_a_numpy_reference():
    rng = np.random.default_rng(1)
    values = rng.random(50)
    got = bootstrap_ci(values, resamples=2000, level=0.9, seed=7)
    np.testing.assert_allclose(got, numpy_bootstrap(values, 2000, 0.9, 7), rtol=0, atol=1e-15)
    # Seeded: the same seed gives the same interval, another seed another one.
    np.testing.assert_array_equal(got, bootstrap_ci(values, resamples=2000, level=0.9, seed=7))
    assert not np.array_equal(got, bootstrap_ci(values, resamples=2000, level=0.9, seed=8))


def test_bootstrap_known_cases():
    # Every problem alike: no spread, the interval is the point.
    np.testing.assert_allclose(bootstrap_ci(np.full(30, 0.4), resamples=500), [0.4, 0.4])
    # 120 of 400 problems solved: the bootstrap of a proportion is close to the normal interval
    # p +- 1.96 sqrt(p (1 - p) / P) = 0.3 +- 0.0449.
    values = np.r_[np.ones(120), np.zeros(280)]
    lo, hi = bootstrap_ci(values, resamples=20_000, seed=0)
    half = 1.959964 * math.sqrt(0.3 * 0.7 / 400)
    assert lo == pytest.approx(0.3 - half, abs=0.004) and hi == pytest.approx(0.3 + half, abs=0.004)


def test_bootstrap_rows_share_the_draws():
    """Several ks (or a paired difference) are resampled with the same problems."""
    counts = np.random.default_rng(2).integers(0, 65, size=200)
    ks = (1, 4, 16, 64)
    cis = bootstrap_pass_at_k(counts, 64, ks, resamples=3000, seed=3)
    assert list(cis) == list(ks)
    for k in ks:
        lo, hi = cis[k]
        assert lo <= mean_pass_at_k(counts, 64, k) <= hi
    # Per problem pass@k rises with k; with shared draws so does every resampled mean, and with
    # it both ends of the interval.
    lows, highs = [cis[k][0] for k in ks], [cis[k][1] for k in ks]
    assert lows == sorted(lows) and highs == sorted(highs)
    # A policy paired with itself: the difference is 0 in every draw.
    per = pass_at_k_per_problem(counts, 64, 16)
    np.testing.assert_array_equal(bootstrap_ci(per - per, resamples=100), [0.0, 0.0])
    # [K, P] input = each row on its own with the same seed.
    both = bootstrap_ci(np.stack([per, per**2]), resamples=500, seed=4)
    np.testing.assert_allclose(both[1], bootstrap_ci(per**2, resamples=500, seed=4), atol=1e-14)


def test_bootstrap_chunks_do_not_change_the_statistics():
    """More draws than one chunk (1e6 / P): still an interval around the mean."""
    values = np.random.default_rng(5).random(5000)
    lo, hi = bootstrap_ci(values, resamples=1000)  # chunks of 200 draws
    se = values.std() / math.sqrt(values.size)
    assert lo < values.mean() < hi
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_bootstrap_validation():
    with pytest.raises(ValueError, match="P >= 1"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([0.5], level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ci([0.5], resamples=0)


def test_pass_at_k_values_skips_intervals():
    summary = {"pass_at_16": 0.8, "pass_at_1": 0.3, "pass_at_1_ci": [0.2, 0.4], "pass_correct": []}
    assert pass_at_k_values(summary) == {1: 0.3, 16: 0.8}


def test_summary_prints_each_pass_at_k_with_its_interval(tmp_path):
    from essa_jax.plot import pass_at_k_curve
    from essa_jax.train.summary import format_summary

    s = {
        "method": "grpo",
        "model": "m",
        "task": "sub_2d",
        "heldout_n": 200,
        "sft_heldout_acc": 0.1,
        "sft_heldout_ci": [0.05, 0.15],
        "final_heldout_acc": 0.2,
        "final_heldout_ci": [0.15, 0.25],
        "steps": 150,
        "sft_seconds": 1.0,
        "train_wall_seconds": 2.0,
        "generated_tokens": 3,
        "pass_at_64": 0.7,
        "pass_at_64_ci": [0.64, 0.76],
        "pass_at_1": 0.2,
        "pass_at_1_ci": [0.18, 0.22],
        "pass_correct": [1, 2],
    }
    lines = format_summary(s).splitlines()
    assert [ln.split()[0] for ln in lines[-2:]] == ["pass@1", "pass@64"]
    assert lines[-1].split()[1:] == ["0.700", "95%", "CI", "[0.640,", "0.760]"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    pass_at_k_curve(ax, s, "grpo")
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "64"]
    plt.close(fig)
