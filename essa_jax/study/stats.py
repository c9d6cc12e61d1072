"""Statistics over seeds and problems for a study's report.

A method's accuracy varies with its search seed (the run) and with the problems it is scored on.
An interval that resamples problems only, or a test that pools (seed, problem) pairs as if they
were independent, treats three runs as one and is too narrow. Here:

- `hierarchical_bootstrap`: resample seeds with replacement, then problems with replacement within
  each drawn seed (Davison & Hinkley 1997, Sec. 3.8, "multi-stage sampling"; Field & Welsh 2007);
  for a difference of two methods the seeds and the problems are paired (one draw of problem
  indices serves both methods' runs of a seed: they are scored on the same problems).
- `seed_mean_test`: Welch's t-test over per-seed mean accuracies (Welch 1947): the seeds are the
  replicates; with 3 seeds per method it has few degrees of freedom and says so.
- McNemar's exact test (`essa_jax.evaluation.mcnemar_exact`) only within one seed
  (`per_seed_mcnemar`), where the pairs (the problems) are the units.
- `time_to_target`: the first point of a curve at or above a target fixed before the runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def _as_matrix(runs: Sequence[Sequence[int] | np.ndarray | str]) -> np.ndarray:
    """`[seeds, problems]` 0/1 matrix of per-seed solved vectors ("0110..." strings accepted)."""
    rows = [
        np.array([int(c) for c in r], np.float64)
        if isinstance(r, str)
        else np.asarray(r, np.float64)
        for r in runs
    ]
    if not rows:
        raise ValueError("no runs")
    n = {len(r) for r in rows}
    if len(n) != 1:
        raise ValueError(f"runs scored on different numbers of problems: {sorted(n)}")
    return np.stack(rows)


def hierarchical_bootstrap(
    a: Sequence[Any],
    b: Sequence[Any] | None = None,
    *,
    num_resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, float]:
    """Mean accuracy of method `a` (or the difference a - b) with its percentile interval from a
    two-stage bootstrap: seeds, then problems within each drawn seed.

    a, b: per-seed solved vectors `[problems]` (0/1 or "0101" strings), all on the same problems;
    for a difference, a[i] and b[i] are paired only through the problems (the seed draws of a and
    b are independent: different methods' seed k are not the same run); problems are drawn once
    per (resample, seed slot) and used for both. Returns {estimate, low, high, num_seeds_a,
    num_seeds_b, resamples}.
    """
    A = _as_matrix(a)
    B = _as_matrix(b) if b is not None else None
    if B is not None and B.shape[1] != A.shape[1]:
        raise ValueError("a and b were scored on different problems")
    rng = np.random.default_rng(seed)
    n_p = A.shape[1]
    k = max(A.shape[0], B.shape[0] if B is not None else 0)
    stats = np.empty(num_resamples)
    for i in range(num_resamples):
        probs = rng.integers(0, n_p, size=(k, n_p))  # one problem draw per seed slot
        sa = rng.integers(0, A.shape[0], size=A.shape[0])
        va = np.mean([A[s, probs[j]].mean() for j, s in enumerate(sa)])
        if B is None:
            stats[i] = va
            continue
        sb = rng.integers(0, B.shape[0], size=B.shape[0])
        vb = np.mean([B[s, probs[j]].mean() for j, s in enumerate(sb)])
        stats[i] = va - vb
    est = A.mean() - (B.mean() if B is not None else 0.0)
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {
        "estimate": float(est),
        "low": float(lo),
        "high": float(hi),
        "num_seeds_a": int(A.shape[0]),
        "num_seeds_b": int(B.shape[0]) if B is not None else 0,
        "resamples": int(num_resamples),
    }


def problem_bootstrap(
    a: Sequence[Any], b: Sequence[Any] | None = None, *, num_resamples: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """The interval that resamples problems only (seeds pooled, as #32 reported): kept beside the
    hierarchical one so that a table shows how much the seeds add."""
    A = _as_matrix(a)
    B = _as_matrix(b) if b is not None else None
    rng = np.random.default_rng(seed)
    n_p = A.shape[1]
    ma = A.mean(0)
    mb = B.mean(0) if B is not None else np.zeros(n_p)
    idx = rng.integers(0, n_p, size=(num_resamples, n_p))
    stats = (ma[idx] - mb[idx]).mean(1)
    lo, hi = np.quantile(stats, [0.025, 0.975])
    return {"estimate": float(ma.mean() - mb.mean()), "low": float(lo), "high": float(hi)}


def seed_mean_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Welch's t-test of two methods' per-seed mean accuracies: {t, df, p (two-sided), mean_a,
    mean_b}. NaN p when either side has fewer than 2 seeds or both have zero variance."""
    from scipy import stats

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "n_a": len(a), "n_b": len(b)}
    va = a.var(ddof=1) / len(a) if len(a) > 1 else math.nan
    vb = b.var(ddof=1) / len(b) if len(b) > 1 else math.nan
    if not (va + vb > 0):
        return {**out, "t": math.nan, "df": math.nan, "p": math.nan}
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    p = 2 * stats.t.sf(abs(t), df)
    return {**out, "t": float(t), "df": float(df), "p": float(p)}


def per_seed_mcnemar(a: Sequence[Any], b: Sequence[Any]) -> list[dict[str, float]]:
    """Exact McNemar of a[i] against b[i] on the same problems, one test per seed pair."""
    from essa_jax.evaluation import mcnemar_exact

    A, B = _as_matrix(a), _as_matrix(b)
    if A.shape != B.shape:
        raise ValueError(
            f"per-seed McNemar needs as many seeds and problems: {A.shape} vs {B.shape}"
        )
    return [
        mcnemar_exact(B[i].astype(int).tolist(), A[i].astype(int).tolist()) for i in range(len(A))
    ]


def time_to_target(points: Sequence[Sequence[float]], target: float) -> float | None:
    """The x of the first (x, accuracy) point at or above `target`; None when never reached."""
    for x, acc in points:
        if acc >= target - 1e-12:
            return float(x)
    return None
