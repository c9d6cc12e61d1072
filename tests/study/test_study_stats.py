"""essa_jax.study.stats against references: scipy's Welch test, a direct two-stage resampling,
and the cases whose answer is known exactly."""

import numpy as np
import pytest
from scipy import stats as sps

from essa_jax.study import (
    hierarchical_bootstrap,
    per_seed_mcnemar,
    problem_bootstrap,
    seed_mean_test,
    time_to_target,
)


def _runs(rates, n=200, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.random(n) < r).astype(int) for r in rates]


def test_welch_matches_scipy():
    a, b = [0.61, 0.70, 0.66], [0.80, 0.74, 0.83]
    got = seed_mean_test(a, b)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert got["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert np.isnan(seed_mean_test([0.5], [0.6])["p"])  # one seed: no test, not p = 0


def test_identical_runs_give_a_zero_difference():
    runs = _runs([0.5, 0.6, 0.7])
    d = hierarchical_bootstrap(runs, runs, num_resamples=300)
    # Seed draws of a and b are independent: the interval is not a point, but centred at 0.
    assert d["estimate"] == 0.0
    assert d["low"] < 0 < d["high"]
    one = [runs[0]]
    d1 = hierarchical_bootstrap(one, one, num_resamples=300)
    assert d1["low"] == d1["high"] == 0.0  # one seed, same problems drawn for both: exactly 0


def test_seeds_widen_the_interval():
    """Seed means far apart (0.4 vs 0.8): the hierarchical interval must be wider than the one
    that resamples problems only (#41's complaint about #32's tables)."""
    a = _runs([0.4, 0.6, 0.8], seed=1)
    b = _runs([0.6, 0.6, 0.6], seed=2)
    h = hierarchical_bootstrap(a, b, num_resamples=2000)
    p = problem_bootstrap(a, b, num_resamples=2000)
    assert h["high"] - h["low"] > 1.5 * (p["high"] - p["low"])
    assert h["estimate"] == pytest.approx(p["estimate"])


def test_hierarchical_matches_a_direct_two_stage_resampling():
    """One seed slot per method, problems drawn once per slot and shared: with a single seed the
    statistic is the paired problem bootstrap, whose distribution a direct loop reproduces."""
    a, b = _runs([0.55], seed=3), _runs([0.65], seed=4)
    got = hierarchical_bootstrap(a, b, num_resamples=4000, seed=7)
    rng = np.random.default_rng(11)
    diffs = []
    for _ in range(4000):
        idx = rng.integers(0, 200, 200)
        diffs.append(a[0][idx].mean() - b[0][idx].mean())
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    # Two Monte-Carlo estimates of the same quantiles: 4000 draws, sd of a 2.5% quantile ~0.005.
    assert got["low"] == pytest.approx(lo, abs=0.015)
    assert got["high"] == pytest.approx(hi, abs=0.015)


def test_per_seed_mcnemar_and_time_to_target():
    a = [np.array([1, 1, 0, 0]), np.array([1, 0, 1, 0])]
    b = [np.array([0, 1, 0, 0]), np.array([1, 0, 1, 0])]
    got = per_seed_mcnemar(a, b)
    assert [(g["fixed"], g["broken"]) for g in got] == [(1, 0), (0, 0)]
    assert time_to_target([(0, 0.3), (10, 0.34), (20, 0.36)], 0.35) == 20
    assert time_to_target([(0, 0.3)], 0.35) is None
    with pytest.raises(ValueError, match="different numbers of problems"):
        hierarchical_bootstrap([[1, 0], [1, 0, 1]])
