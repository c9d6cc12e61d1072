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
attributes `num_dims` and `population_size` (the `Strategy` protocol); it need not subclass
anything. Of its state the ESSA loop reads exactly two fields: `mean` [D] (the policy it evaluates
and exports) and `sigma`, a scalar or one step size per coordinate [D] (logged as its mean); the
loop measures the update itself (||mean' - mean||). Everything else in the state is the
strategy's own.

The built-in strategies (CMA-ES, sep-CMA-ES, OpenAI-ES) subclass `BaseStrategy`, which holds the
bookkeeping they share, as evosax's base class does: `init` builds the common state fields,
`tell` checks shapes, tracks the best-so-far member, counts non-finite fitness, decides whether
the generation carries any information (`skip`), advances the counter and records ||m' - m||;
`metrics` returns the common scalars. A subclass writes only its own distribution update (`_tell`),
its extra state fields (`_init`) and its extra metrics (`_metrics`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

import chex
import jax
import jax.numpy as jnp
from flax import struct

from essa_jax.es.shaping import finite_or_worst


class SearchError(RuntimeError):
    """A search that is not searching: a strategy's `ask` returned non-finite points or its
    `tell` a non-finite mean / sigma, or no generation in a long row carried a ranking. The run
    stops in one line naming the strategy (its checkpoints stay as they are)."""


@runtime_checkable
class Strategy(Protocol):
    """What the loops rely on; see the module docstring.

    A strategy: `num_dims` D, `population_size` P, `init(key, mean [D]) -> state`,
    `ask(key, state) -> [P, D]` (pure in (key, state)), `tell(state, population [P, D],
    fitness [P]) -> state` (fitness maximised). Its state: a pytree with `mean` [D] and `sigma`
    ([] or [D]); the ESSA loop (`essa_jax.train.essa`) reads nothing else. Hyper-parameters are
    constructor arguments, set from a config by `essa.strategy_args`.
    """

    num_dims: int
    population_size: int

    def init(self, key: jax.Array, mean: jax.Array) -> Any: ...

    def ask(self, key: jax.Array, state: Any) -> jax.Array: ...

    def tell(self, state: Any, population: jax.Array, fitness: jax.Array) -> Any: ...


StateT = TypeVar("StateT")


@struct.dataclass
class Bookkeeping:
    """The state fields `BaseStrategy` keeps for every built-in strategy (its `BOOKKEEPING`), so a
    strategy's state class declares only its own: generation [] int32; best_member [D] (best
    finite candidate so far); best_fitness [] (-inf until one is finite); generation_best_fitness
    [] (this generation's best, -inf if none finite); num_nonfinite [] int32 (non-finite fitness
    values this generation); update_norm [] (||m' - m|| of the last generation that had a finite
    fitness).
    Subclasses add `mean`, `sigma` and their own fields (keyword construction: field order is
    free)."""

    generation: jax.Array
    best_member: jax.Array
    best_fitness: jax.Array
    generation_best_fitness: jax.Array
    num_nonfinite: jax.Array
    update_norm: jax.Array


class BaseStrategy(abc.ABC, Generic[StateT]):
    """The bookkeeping every built-in strategy shares (the evosax split: the base class does the
    bookkeeping, a strategy only its own update). Subclasses are frozen dataclasses with the
    fields `num_dims`, `population_size` and `sigma_init`, and set `state_type` to a flax.struct
    dataclass subclassing `Bookkeeping` with the fields `mean`, `sigma` and their own.

    Hooks a subclass provides:
      _init(key, mean) -> dict: its own initial state fields (everything but mean, sigma and the
        bookkeeping fields);
      ask(key, state) -> population [P, D];
      _tell(state, population, fitness, skip) -> state: its distribution update; `skip` is true
        when no fitness is finite, and the returned distribution must then equal the input's;
      _metrics(state) -> dict: its own scalars to log (optional).
    """

    # The fields of `Bookkeeping` (a state class inherits them), by name.
    BOOKKEEPING: ClassVar[tuple[str, ...]] = tuple(f.name for f in dataclasses.fields(Bookkeeping))
    state_type: ClassVar[type]
    num_dims: int
    population_size: int
    sigma_init: float

    @partial(jax.jit, static_argnums=0)
    def init(self, key: jax.Array, mean: jax.Array) -> StateT:
        """Initial state around `mean` [D] with sigma = sigma_init and empty bookkeeping."""
        mean = check_mean(mean, self.num_dims)
        dt = mean.dtype
        return self.state_type(
            mean=mean,
            sigma=jnp.asarray(self.sigma_init, dt),
            **self._init(key, mean),
            generation=jnp.zeros((), jnp.int32),
            best_member=mean,
            best_fitness=jnp.asarray(-jnp.inf, dt),
            generation_best_fitness=jnp.asarray(-jnp.inf, dt),
            num_nonfinite=jnp.zeros((), jnp.int32),
            update_norm=jnp.zeros((), dt),
        )

    @abc.abstractmethod
    def ask(self, key: jax.Array, state: StateT) -> jax.Array:
        """Candidates [P, D]; a pure function of (key, state)."""

    @partial(jax.jit, static_argnums=0)
    def tell(self, state: StateT, population: jax.Array, fitness: jax.Array) -> StateT:
        """Update from `population` [P, D] and `fitness` [P] (MAXIMISED).

        The best-so-far is taken over the whole population (non-finite fitness ignored) before the
        strategy's own update; a generation with no finite fitness (`skip`) leaves the
        distribution untouched and only advances the counter and the bookkeeping."""
        check_tell_shapes(population, fitness, self.population_size, self.num_dims)
        best_member, best_fitness, gen_best = update_best(
            state.best_member, state.best_fitness, population, fitness
        )
        num_bad = count_nonfinite(fitness)
        skip = num_bad == self.population_size  # nothing finite to learn from
        new = self._tell(state, population, fitness, skip)
        return new.replace(
            generation=state.generation + 1,
            best_member=best_member,
            best_fitness=best_fitness,
            generation_best_fitness=gen_best,
            num_nonfinite=num_bad,
            update_norm=jnp.where(skip, state.update_norm, jnp.linalg.norm(new.mean - state.mean)),
        )

    def metrics(self, state: StateT) -> dict[str, jax.Array]:
        """Scalars worth logging: step size, the strategy's own (`_metrics`), the bookkeeping."""
        common = {k: getattr(state, k) for k in self.BOOKKEEPING if k != "best_member"}
        return {"sigma": state.sigma, **self._metrics(state), **common}

    @abc.abstractmethod
    def _init(self, key: jax.Array, mean: jax.Array) -> dict[str, Any]: ...

    @abc.abstractmethod
    def _tell(
        self, state: StateT, population: jax.Array, fitness: jax.Array, skip: jax.Array
    ) -> StateT: ...

    def _metrics(self, state: StateT) -> dict[str, jax.Array]:
        return {}


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
    _check_shape("mean", mean, (num_dims,), "(num_dims)")
    if not jnp.issubdtype(mean.dtype, jnp.floating):
        mean = mean.astype(jnp.result_type(float))
    return mean


def check_tell_shapes(population: jax.Array, fitness: jax.Array, p: int, d: int) -> None:
    _check_shape("population", population, (p, d), "(population_size, num_dims)")
    _check_shape("fitness", fitness, (p,), "(one value per member)")


def _check_shape(name: str, x: jax.Array, shape: tuple[int, ...], what: str) -> None:
    """chex.assert_shape raising ValueError: '... input 0 has shape (4,) but expected (3). [mean
    must have shape (3,) (num_dims)]'. Static: it runs at trace time, under jit as well."""
    msg = f"{name} must have shape {shape} {what}"
    chex.assert_shape(x, shape, custom_message=msg, exception_type=ValueError)


def default_population_size(num_dims: int) -> int:
    """lambda = 4 + floor(3 ln D) (Hansen 2016, arXiv 1604.00772, Table 1)."""
    return 4 + int(math.floor(3 * math.log(num_dims)))


# ---------------------------------------------------------------------------------------------
# pieces shared by the tell functions


def sort_best_first(fitness: jax.Array) -> jax.Array:
    """Indices that sort the population best-first. [P] -> [P] int.

    Non-finite fitness counts as -inf, so such candidates sort last (ties keep population order).
    """
    return jnp.argsort(-finite_or_worst(fitness), stable=True)


def count_nonfinite(fitness: jax.Array) -> jax.Array:
    """How many fitness values are NaN or +-inf. [P] -> [] int32."""
    return jnp.sum(~jnp.isfinite(fitness)).astype(jnp.int32)


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
