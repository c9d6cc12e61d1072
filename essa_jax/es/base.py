"""The strategy contract and the small pure pieces every strategy shares.

Contract (fitness is MAXIMISED everywhere):

    state = strategy.init(key, mean)                     # mean [D]
    population = strategy.ask(key, state)                # [P, D]; a pure function of (key, state)
    state = strategy.tell(state, population, fitness)    # fitness [P]

`ask` never changes the state, so every process that holds the same state and key generates the
identical population (the seed-based distribution of ESSA, arXiv 2507.04453, Sec. 3). Strategies are
frozen dataclasses whose fields are the (static) hyper-parameters, so a strategy is hashable, can be
closed over or passed as a static argument, and its public methods are jitted; the state is a
flax.struct dataclass pytree, so it can be vmapped (independent runs), scanned (many generations),
and checkpointed. A user's own strategy plugs in by providing the same three methods plus the
attributes `num_dims` and `population_size`.
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from essa_jax.es.shaping import finite_or_worst


@runtime_checkable
class Strategy(Protocol):
    """What the loops rely on; see the module docstring."""

    num_dims: int
    population_size: int

    def init(self, key: jax.Array, mean: jax.Array) -> Any: ...

    def ask(self, key: jax.Array, state: Any) -> jax.Array: ...

    def tell(self, state: Any, population: jax.Array, fitness: jax.Array) -> Any: ...


# ---------------------------------------------------------------------------------------------
# argument validation (clear messages: field, value, what is valid)


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | jnp.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number, got {value!r}") from None
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return v


def check_rate(name: str, value: Any, *, upper_inclusive: bool = True) -> float:
    v = check_positive(name, value, allow_zero=True)
    if v > 1 or (v == 1 and not upper_inclusive):
        bound = "[0, 1]" if upper_inclusive else "[0, 1)"
        raise ValueError(f"{name} must lie in {bound}, got {value!r}")
    return v


def check_mean(mean: jax.Array, num_dims: int) -> jax.Array:
    mean = jnp.asarray(mean)
    if mean.shape != (num_dims,):
        raise ValueError(f"mean must have shape ({num_dims},) (num_dims), got {mean.shape}")
    if not jnp.issubdtype(mean.dtype, jnp.floating):
        mean = mean.astype(jnp.result_type(float))
    return mean


def check_tell_shapes(population: jax.Array, fitness: jax.Array, p: int, d: int) -> None:
    if population.shape != (p, d):
        raise ValueError(f"population must have shape ({p}, {d}), got {population.shape}")
    if fitness.shape != (p,):
        raise ValueError(
            f"fitness must have shape ({p},) (one value per member), got {fitness.shape}"
        )


def default_population_size(num_dims: int) -> int:
    """lambda = 4 + floor(3 ln D) (Hansen 2016, arXiv 1604.00772, Table 1)."""
    return 4 + int(math.floor(3 * math.log(num_dims)))


# ---------------------------------------------------------------------------------------------
# pieces shared by the tell functions


def sort_best_first(fitness: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Indices that sort the population best-first, and the count of non-finite fitness values.

    Non-finite fitness counts as -inf, so such candidates sort last (ties keep population order).
    """
    f = finite_or_worst(fitness)
    order = jnp.argsort(-f, stable=True)
    return order, jnp.sum(~jnp.isfinite(fitness)).astype(jnp.int32)


def update_best(
    best_member: jax.Array,
    best_fitness: jax.Array,
    population: jax.Array,
    fitness: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Best-so-far member and fitness (max), ignoring non-finite fitness.

    Returns (best_member [D], best_fitness [], generation_best_fitness []); the last is -inf when
    no fitness of this generation is finite.
    """
    f = finite_or_worst(fitness)
    i = jnp.argmax(f)
    gen_best = f[i]
    better = gen_best > best_fitness
    return (
        jnp.where(better, population[i], best_member),
        jnp.where(better, gen_best, best_fitness).astype(best_fitness.dtype),
        gen_best.astype(best_fitness.dtype),
    )


def recombination_weights(population_size: int, num_parents: int) -> tuple[float, ...]:
    """Positive log weights w_i = ln((lambda+1)/2) - ln i, i <= mu, normalised to sum 1.

    Hansen 2016, arXiv 1604.00772, Eq. (49) with the positive part of Table 1 (no active CMA).
    """
    w = [math.log((population_size + 1) / 2) - math.log(i + 1) for i in range(num_parents)]
    if w[-1] <= 0:
        # mu >= (lambda + 1) / 2 makes the tail weights non-positive; shift the log offset to mu.
        w = [math.log(num_parents + 0.5) - math.log(i + 1) for i in range(num_parents)]
    s = sum(w)
    return tuple(x / s for x in w)


def expected_norm(num_dims: int) -> float:
    """E||N(0, I)|| ~ sqrt(n) (1 - 1/(4n) + 1/(21 n^2)) (Hansen 2016, arXiv 1604.00772, p. 28)."""
    n = num_dims
    return math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n * n))
