"""OpenAI-ES: natural-evolution-style gradient estimate fed to an optax optimiser.

T. Salimans, J. Ho, X. Chen, S. Sidor, I. Sutskever, "Evolution Strategies as a Scalable Alternative
to Reinforcement Learning", arXiv 1703.03864 (2017). Candidates are x_i = m + sigma eps_i with
mirrored (antithetic) noise eps_{P/2 + i} = -eps_i (their Sec. 2.1 / Algorithm 2 uses the same
noise for the distribution, mirrored sampling is their Sec. 2.2 variance reduction); fitness is
shaped (centred ranks by default, Sec. 2.2) and the search gradient

    g = 1 / (P sigma) sum_i F_i eps_i                     (Algorithm 1, line 5)

is handed to an optax optimiser (Adam by default, as in their experiments) as the gradient of
the negated objective, because fitness is MAXIMISED and optax minimises. sigma is fixed, or decays
geometrically to sigma_min. A generation with no finite fitness skips the optimiser step (Adam's
momentum would otherwise move the mean on a zero gradient).

The bookkeeping (shape checks, best-so-far, non-finite count, the no-finite-fitness skip,
generation counter, update norm, common metrics and initial fields) lives in
`essa_jax.es.base.BaseStrategy`; this module holds the optax step only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct

from essa_jax.es import base
from essa_jax.es.shaping import ShapingFn, get_shaping_fn


@struct.dataclass
class OpenAIESState(base.Bookkeeping):
    """mean [D], sigma [], opt_state (optax state of the mean); generation, best_member,
    best_fitness, generation_best_fitness, num_nonfinite, update_norm: the bookkeeping of
    `base.BaseStrategy.BOOKKEEPING`."""

    mean: jax.Array
    sigma: jax.Array
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class OpenAIES(base.BaseStrategy[OpenAIESState]):
    """OpenAI-ES; fitness is MAXIMISED.

    Args:
      num_dims: genome length.
      population_size: P, even when antithetic; default 4 + floor(3 ln D) rounded up to even.
      sigma_init: noise scale (Salimans et al. use 0.02 on network weights).
      sigma_decay: sigma <- max(sigma * sigma_decay, sigma_min) after each tell (1.0 = fixed).
      sigma_min: floor of the decayed sigma.
      learning_rate: Adam's step size when `optimizer` is None.
      optimizer: any optax.GradientTransformation for the mean (default optax.adam(learning_rate)).
      fitness_shaping: name in essa_jax.es.shaping.SHAPING_FNS or a `fn(fitness [P]) -> [P]`.
      antithetic: mirrored sampling (requires an even population).
    """

    num_dims: int
    population_size: int | None = None
    sigma_init: float = 0.02
    sigma_decay: float = 1.0
    sigma_min: float = 0.0
    learning_rate: float = 0.01
    optimizer: optax.GradientTransformation | None = None
    fitness_shaping: str | ShapingFn = "centred_ranks"
    antithetic: bool = True
    state_type: ClassVar[type] = OpenAIESState

    def __post_init__(self) -> None:
        n = base.check_int("num_dims", self.num_dims, 1)
        p = self.population_size
        if p is None:
            p = base.default_population_size(n)
            p += p % 2 if self.antithetic else 0
        p = base.check_int("population_size", p, 2)
        if self.antithetic and p % 2:
            raise ValueError(f"population_size must be even with antithetic=True, got {p}")
        base.check_positive("sigma_init", self.sigma_init)
        base.check_rate("sigma_decay", self.sigma_decay)
        if self.sigma_decay == 0:
            raise ValueError("sigma_decay must lie in (0, 1], got 0")
        base.check_positive("sigma_min", self.sigma_min, allow_zero=True)
        base.check_positive("learning_rate", self.learning_rate)
        get_shaping_fn(self.fitness_shaping)  # validates the name
        opt = self.optimizer if self.optimizer is not None else optax.adam(self.learning_rate)
        if not isinstance(opt, optax.GradientTransformation):
            raise ValueError(f"optimizer must be an optax.GradientTransformation, got {opt!r}")
        object.__setattr__(self, "population_size", p)
        object.__setattr__(self, "optimizer", opt)

    @property
    def shaping_fn(self) -> Callable[[jax.Array], jax.Array]:
        return get_shaping_fn(self.fitness_shaping)

    def _init(self, key: jax.Array, mean: jax.Array) -> dict[str, Any]:
        """The optimiser's state for the mean (`key` is unused)."""
        return dict(opt_state=self.optimizer.init(mean))

    @partial(jax.jit, static_argnums=0)
    def ask(self, key: jax.Array, state: OpenAIESState) -> jax.Array:
        """x_i = m + sigma eps_i, eps ~ N(0, I), mirrored when antithetic. -> [P, D]."""
        p, d, dt = self.population_size, self.num_dims, state.mean.dtype
        if self.antithetic:
            eps = jax.random.normal(key, (p // 2, d), dt)
            eps = jnp.concatenate([eps, -eps])
        else:
            eps = jax.random.normal(key, (p, d), dt)
        return state.mean + state.sigma * eps

    def _tell(
        self, state: OpenAIESState, population: jax.Array, fitness: jax.Array, skip: jax.Array
    ) -> OpenAIESState:
        """Optimiser step on the mean along the search gradient; the identity when `skip`."""
        return jax.lax.cond(skip, lambda s, *_: s, self._update, state, population, fitness)

    def _update(self, s: OpenAIESState, population: jax.Array, fitness: jax.Array) -> OpenAIESState:
        """g = F_shaped @ eps / (P sigma) (Salimans et al. 2017, Alg. 1), one optax step on -g."""
        dt = s.mean.dtype
        eps = (population.astype(dt) - s.mean) / s.sigma
        shaped = self.shaping_fn(fitness).astype(dt)
        grad = shaped @ eps / (self.population_size * s.sigma)  # Salimans et al., Alg. 1, line 5
        updates, opt_state = self.optimizer.update(-grad, s.opt_state, s.mean)  # ascend fitness
        mean = optax.apply_updates(s.mean, updates)
        sigma = jnp.maximum(s.sigma * self.sigma_decay, self.sigma_min).astype(dt)
        return s.replace(
            mean=mean,
            sigma=sigma,
            opt_state=opt_state,
        )
