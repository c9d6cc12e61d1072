"""Fitness shaping: free functions with one signature, `fn(fitness [P]) -> shaped [P]`.

Fitness is MAXIMISED: a larger shaped value means a better candidate. Every function is NaN-safe:
non-finite fitness (NaN, +inf, -inf) is treated as the worst possible value, so such candidates
get the lowest shaped value and never produce a non-finite output. When no value is finite, every
function returns zeros (all candidates equal, so a gradient-style update is a no-op).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

ShapingFn = Callable[[jax.Array], jax.Array]


def finite_or_worst(fitness: jax.Array) -> jax.Array:
    """Replace non-finite fitness by -inf, so that it ranks last under maximisation. [P] -> [P]."""
    fitness = jnp.asarray(fitness)
    return jnp.where(jnp.isfinite(fitness), fitness, -jnp.inf)


def ranks(fitness: jax.Array) -> jax.Array:
    """Average ranks in [0, P-1], 0 = worst, P-1 = best; ties share their mean rank. [P] -> [P].

    Non-finite values tie at the bottom. O(P^2) comparisons, which is cheap for ES populations and
    gives exact tie averaging (so an all-equal generation is shaped to all-equal values).
    """
    f = finite_or_worst(fitness)
    less = jnp.sum(f[None, :] < f[:, None], axis=1)
    equal = jnp.sum(f[None, :] == f[:, None], axis=1)
    return (less + 0.5 * (equal - 1)).astype(jnp.result_type(float))


def centred_ranks(fitness: jax.Array) -> jax.Array:
    """Centred ranks in [-0.5, 0.5] (Salimans et al. 2017, arXiv 1703.03864, Sec. 2.2). [P] -> [P].

    rank / (P - 1) - 0.5 with the best candidate at +0.5; invariant to any monotone transform of the
    fitness, which makes the update robust to outliers. A population of one maps to 0.
    """
    p = jnp.shape(fitness)[0]
    r = ranks(fitness)
    # (2 r - (P - 1)) / (2 (P - 1)) == r / (P - 1) - 0.5, but exactly 0 for a tie in the middle
    return (2 * r - (p - 1)) / (2 * (p - 1)) if p > 1 else jnp.zeros_like(r)


def z_score(fitness: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(f - mean) / (std + eps) over the finite entries; non-finite entries get the finite minimum.

    [P] -> [P]. Qiu et al. 2025 ("Evolution Strategies at Scale") normalise rewards this way.
    """
    fitness = jnp.asarray(fitness, dtype=jnp.result_type(float))
    finite = jnp.isfinite(fitness)
    n = jnp.maximum(jnp.sum(finite), 1)
    f0 = jnp.where(finite, fitness, 0.0)
    mean = jnp.sum(f0) / n
    std = jnp.sqrt(jnp.sum(jnp.where(finite, (f0 - mean) ** 2, 0.0)) / n)
    z = (f0 - mean) / (std + eps)
    worst = jnp.min(jnp.where(finite, z, jnp.inf))
    worst = jnp.where(jnp.isfinite(worst), worst, 0.0)
    return jnp.where(finite, z, worst)


def raw(fitness: jax.Array) -> jax.Array:
    """The fitness itself, with non-finite entries replaced by the finite minimum. [P] -> [P]."""
    fitness = jnp.asarray(fitness, dtype=jnp.result_type(float))
    finite = jnp.isfinite(fitness)
    worst = jnp.min(jnp.where(finite, fitness, jnp.inf))
    worst = jnp.where(jnp.isfinite(worst), worst, 0.0)
    return jnp.where(finite, fitness, worst)


SHAPING_FNS: dict[str, ShapingFn] = {
    "centred_ranks": centred_ranks,
    "z_score": z_score,
    "raw": raw,
}


def get_shaping_fn(name_or_fn: str | ShapingFn) -> ShapingFn:
    """Resolve a shaping function by name (see `SHAPING_FNS`) or pass a callable through."""
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in SHAPING_FNS:
        raise ValueError(
            f"unknown fitness shaping {name_or_fn!r}; valid names: {sorted(SHAPING_FNS)}"
        )
    return SHAPING_FNS[name_or_fn]
