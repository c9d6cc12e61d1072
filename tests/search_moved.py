"""How far a run's search state moved: what the resume, fault and determinism tests assert first.

A resume or determinism test compares two states; two states that never left their start agree
whatever the code does. So each such test asserts, before "equal", that the search state moved by
more than a stated amount, measured on the search state only: the step counter, the PRNG key and
the data cursor change every step whatever the search does and are never counted.

- ESSA (CMA-ES): the mean's shift (L2), |log(sigma / sigma_start)|, the covariance's change
  (Frobenius norm of C - C_start, C the full covariance) and the evolution paths' change.
- GRPO: the L2 norm of the change of the trainable parameters (LoRA factors or genome) over all
  leaves.

States are checkpoint pytrees (nested dicts of arrays, e.g. orbax restores) or strategy states.
Importable by every test module: tests/ is on sys.path (the conftest.py's directory).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# Least movement of the CMA-ES state per generation of tests/distributed/tiny_essa_config.py's run
# (observed over its first 5 generations: mean >= 2.97, |log sigma| >= 0.0076, covariance >= 0.049):
# a skipped tell (flat fitness) fails all three.
TINY_ESSA_PER_GENERATION = {"mean": 1.0, "log_sigma": 1e-3, "covariance": 1e-2}


def _field(state: Any, name: str) -> Any:
    if isinstance(state, dict):
        return state.get(name)
    return getattr(state, name, None)


def covariance(es: Any) -> np.ndarray:
    """The CMA-ES covariance of a strategy state: C, or C_scale (C + C_factors^T C_factors) when
    the state carries deferred rank-one / rank-mu rows (`CMAES(defer_covariance=True)`)."""
    c = np.asarray(_field(es, "C"), np.float64)
    factors, scale = _field(es, "C_factors"), _field(es, "C_scale")
    if factors is not None and np.size(factors):
        f = np.asarray(factors, np.float64)
        c = c + f.T @ f
    if scale is not None:
        c = float(np.asarray(scale)) * c
    return c


def essa_movement(start: Any, end: Any) -> dict[str, float]:
    """How far CMA-ES moved from `start` to `end` (strategy states, or ESSA checkpoint states
    whose strategy state is under "es")."""
    a, b = (_field(s, "es") if _field(s, "es") is not None else s for s in (start, end))

    def norm(name: str) -> float:
        return float(np.linalg.norm(np.asarray(_field(b, name)) - np.asarray(_field(a, name))))

    return {
        "mean": norm("mean"),
        "log_sigma": abs(
            float(np.log(np.asarray(_field(b, "sigma")) / np.asarray(_field(a, "sigma"))))
        ),
        "covariance": float(np.linalg.norm(covariance(b) - covariance(a))),
        "p_c": norm("p_c"),
        "p_sigma": norm("p_sigma"),
    }


def assert_essa_moved(
    start: Any,
    end: Any,
    *,
    mean: float,
    log_sigma: float,
    covariance: float,
    what: str = "",
) -> dict[str, float]:
    """Assert that the mean shifted by > `mean` (L2), sigma changed by a factor > exp(`log_sigma`)
    either way, the covariance changed by > `covariance` (Frobenius) and both evolution paths
    changed; returns the measured movement."""
    m = essa_movement(start, end)
    bounds = {"mean": mean, "log_sigma": log_sigma, "covariance": covariance}
    for k, bound in bounds.items():
        assert m[k] > bound, f"{what} CMA-ES {k} moved {m[k]:.3g}, not > {bound:g}: {m}"
    assert m["p_c"] > 0 and m["p_sigma"] > 0, f"{what} evolution paths did not move: {m}"
    return m


def lora_movement(start: Any, end: Any) -> float:
    """L2 norm of end - start over every leaf of two trainable pytrees of the same structure."""
    a = [np.asarray(x, np.float64) for x in jax.tree.leaves(start)]
    b = [np.asarray(x, np.float64) for x in jax.tree.leaves(end)]
    assert len(a) == len(b) > 0
    return float(np.sqrt(sum(np.sum((y - x) ** 2) for x, y in zip(a, b, strict=True))))
