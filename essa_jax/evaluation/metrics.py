"""Sampling metrics: unbiased pass@k with bootstrap intervals over problems, a confidence interval
for accuracies, a paired test.

    pass_at_k(n, c, k) -> float                      one problem (Chen et al. 2021, Eq. 1)
    pass_at_k_per_problem(counts [P], n, k) -> [P]   the same, vectorised over problems
    mean_pass_at_k(counts [P], n, k) -> float        the benchmark's pass@k
    bootstrap_ci(values [..., P]) -> [..., 2]        percentile bootstrap over problems
    bootstrap_pass_at_k(counts [P], n, ks) -> {k: (low, high)}
    wilson_interval(successes, n); mcnemar_exact(before, after)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021 (Codex, arXiv 2107.03374, Eq. 1); F-GRPO (arXiv 2602.06717) reports it up
    to k = 256. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the (huge)
    binomial coefficients.
    """
    if not 0 <= c <= n or n < 1:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and n >= 1, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n={n}, got k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(num_correct: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over problems, each with n samples and num_correct[i] correct."""
    if len(num_correct) == 0:
        raise ValueError("mean_pass_at_k needs at least one problem")
    return float(np.mean([pass_at_k(n, int(c), k) for c in num_correct]))


def pass_at_k_per_problem(num_correct: Sequence[int] | np.ndarray, n: int, k: int) -> np.ndarray:
    """Unbiased pass@k of every problem: `num_correct` [P] (c_i of n samples each) -> [P] float64.

    Chen et al. 2021 (arXiv 2107.03374, Eq. 1): 1 - C(n - c_i, k) / C(n, k), each value equal to
    `pass_at_k(n, c_i, k)`; their mean is `mean_pass_at_k`. The per-problem values are what the
    bootstrap resamples (`bootstrap_ci`), and their paired difference between two policies
    evaluated on the same problems is a per-problem effect.
    """
    counts = np.asarray(num_correct)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"num_correct must be a non-empty vector [P], got shape {counts.shape}")
    return np.asarray([pass_at_k(n, int(c), k) for c in counts], np.float64)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> np.ndarray:
    """Percentile bootstrap interval of the mean over the last axis (problems).

    values: [..., P] per-problem values (e.g. `pass_at_k_per_problem`, or the paired difference
    of two policies' values on the same problems). Each of `resamples` draws picks P problems
    with replacement (Efron 1979; the percentile interval, Efron & Tibshirani 1993, Sec. 13.3) and
    takes their mean; the interval is the (1 - level) / 2 and (1 + level) / 2 quantiles of those
    means. Every leading row is resampled with the SAME problem draws, so the intervals of several
    k (or methods) of one evaluation are joint and a paired difference stays paired. Seeded
    (`numpy.random.default_rng(seed)`): the same inputs give the same interval.

    What it covers: the variation from which problems were drawn, including each problem's own
    sampling noise (a per-problem pass@k estimated from n samples varies between problems partly
    because of it), not the variation of a new training run (seeds measure that).

    Returns [..., 2] float64 (low, high).
    """
    v = np.asarray(values, np.float64)
    if v.ndim == 0 or v.shape[-1] == 0:
        raise ValueError(f"bootstrap_ci needs values [..., P] with P >= 1, got shape {v.shape}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_ci needs 0 < level < 1, got {level}")
    if resamples < 1:
        raise ValueError(f"bootstrap_ci needs resamples >= 1, got {resamples}")
    p = v.shape[-1]
    rng = np.random.default_rng(seed)
    means = np.empty(v.shape[:-1] + (resamples,), np.float64)
    # Chunks of draws bound the [..., chunk, P] gather to 8 MB per leading row (10k draws x 200
    # problems at once would be 16 MB of indices and 16 MB per row). The chunk depends on P only,
    # so a row's interval does not depend on how many rows are resampled with it.
    chunk = max(1, min(resamples, 1_000_000 // p))
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        idx = rng.integers(0, p, size=(stop - start, p))
        means[..., start:stop] = v[..., idx].mean(axis=-1)
    alpha = (1.0 - level) / 2.0
    return np.moveaxis(np.quantile(means, [alpha, 1.0 - alpha], axis=-1), 0, -1)


def bootstrap_pass_at_k(
    num_correct: Sequence[int] | np.ndarray,
    n: int,
    ks: Sequence[int],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[int, tuple[float, float]]:
    """Bootstrap intervals of the benchmark pass@k (`mean_pass_at_k`) over problems, every k.

    The estimate is the unbiased pass@k of Chen et al. 2021 (arXiv 2107.03374, Eq. 1) averaged
    over the P problems; its interval resamples the problems (`bootstrap_ci`, one set of draws
    for all ks, so the intervals are joint). num_correct: [P] correct samples of n per problem.
    Returns {k: (low, high)}.
    """
    per = np.stack([pass_at_k_per_problem(num_correct, n, k) for k in ks])  # [K, P]
    ci = bootstrap_ci(per, resamples=resamples, level=level, seed=seed)
    return {int(k): (float(lo), float(hi)) for k, (lo, hi) in zip(ks, ci, strict=True)}


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927); 95% by default.

    Better than the normal interval near 0 and 1 and for small n (it never leaves [0, 1]).
    """
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(
            f"wilson_interval needs 0 <= successes <= n and n > 0, got {successes}/{n}"
        )
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # At 0 and n successes the endpoints are exactly 0 and 1 (avoid 0.9999999999999999).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def mcnemar_exact(before: Sequence[int], after: Sequence[int]) -> dict[str, float]:
    """Paired comparison of two 0/1 outcome vectors on the same problems (exact McNemar test).

    fixed b = problems wrong before and right after, broken c = right before and wrong after; under
    "no difference" b ~ Binomial(b + c, 1/2), so the two-sided p = min(1, 2 P[X <= min(b, c)])
    (McNemar 1947, exact binomial form). Returns {fixed, broken, p_value}.
    """
    x, y = np.asarray(before), np.asarray(after)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"mcnemar_exact needs two equal-length vectors, got {x.shape}, {y.shape}")
    b = int(np.sum((x == 0) & (y != 0)))
    c = int(np.sum((x != 0) & (y == 0)))
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n if n else 1.0
    return {"fixed": b, "broken": c, "p_value": min(1.0, 2.0 * tail)}
