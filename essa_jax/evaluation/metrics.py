"""Sampling metrics: unbiased pass@k, a confidence interval for accuracies, a paired test."""

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
