"""sep-CMA-ES: CMA-ES with a diagonal covariance (Ros & Hansen 2008).

R. Ros and N. Hansen, "A Simple Modification in CMA-ES Achieving Linear Time and Space Complexity",
PPSN X (2008), inria-00287367. The covariance is restricted to its diagonal, so sampling and the
update cost O(n) per candidate and no eigendecomposition is needed; the covariance learning rates
are multiplied by (n + 2) / 3 (their Eq. 6) because a diagonal has only n free parameters to learn.
Everything else (weights, paths, step-size control) is the full CMA-ES of Hansen's tutorial
(arXiv 1604.00772, "Eq. (n)" below) restricted to diagonal matrices, with positive weights only.

Fitness is MAXIMISED. Non-finite fitness ranks last; a generation with no finite fitness leaves the
distribution untouched and only advances the counter and the metrics.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
from flax import struct

from essa_jax.es import base
from essa_jax.es.cma_es import CMAES


@struct.dataclass
class SepCMAESState:
    """Everything needed to resume a sep-CMA-ES run (D = num_dims).

    mean [D], sigma [], p_sigma [D], p_c [D], C [D] (the diagonal of the covariance), generation [],
    best_member [D], best_fitness [], generation_best_fitness [], num_nonfinite [], update_norm [].
    """

    mean: jax.Array
    sigma: jax.Array
    p_sigma: jax.Array
    p_c: jax.Array
    C: jax.Array
    generation: jax.Array
    best_member: jax.Array
    best_fitness: jax.Array
    generation_best_fitness: jax.Array
    num_nonfinite: jax.Array
    update_norm: jax.Array


@dataclasses.dataclass(frozen=True)
class SepCMAES(CMAES):
    """Separable (diagonal) CMA-ES; fitness is MAXIMISED. Same arguments and defaults as `CMAES`
    except that the default c_1 and c_mu carry the (n + 2) / 3 factor (Ros & Hansen 2008, Eq. 6)
    and ``eigen_interval`` is unused (there is no eigendecomposition)."""

    @staticmethod
    def _covariance_rates(n: int, mu_eff: float) -> tuple[float, float]:
        c_1, c_mu = CMAES._covariance_rates(n, mu_eff)
        scale = (n + 2) / 3  # Ros & Hansen 2008, Eq. (6)
        return min(1.0, c_1 * scale), c_mu * scale

    @partial(jax.jit, static_argnums=0)
    def init(self, key: jax.Array, mean: jax.Array) -> SepCMAESState:
        """Initial state around `mean` [D] (C = I, sigma = sigma_init); `key` is unused."""
        del key
        mean = base.check_mean(mean, self.num_dims)
        n, dt = self.num_dims, mean.dtype
        return SepCMAESState(
            mean=mean,
            sigma=jnp.asarray(self.sigma_init, dt),
            p_sigma=jnp.zeros(n, dt),
            p_c=jnp.zeros(n, dt),
            C=jnp.ones(n, dt),
            generation=jnp.zeros((), jnp.int32),
            best_member=mean,
            best_fitness=jnp.asarray(-jnp.inf, dt),
            generation_best_fitness=jnp.asarray(-jnp.inf, dt),
            num_nonfinite=jnp.zeros((), jnp.int32),
            update_norm=jnp.zeros((), dt),
        )

    @partial(jax.jit, static_argnums=0)
    def ask(self, key: jax.Array, state: SepCMAESState) -> jax.Array:
        """x_k = m + sigma sqrt(C) z_k, z_k ~ N(0, I) (Eqs. 38-40 with diagonal C). -> [P, D]."""
        z = jax.random.normal(key, (self.population_size, self.num_dims), state.mean.dtype)
        return state.mean + state.sigma * jnp.sqrt(state.C) * z

    @partial(jax.jit, static_argnums=0)
    def tell(
        self, state: SepCMAESState, population: jax.Array, fitness: jax.Array
    ) -> SepCMAESState:
        """Update the search distribution from `population` [P, D] and `fitness` [P] (MAXIMISED)."""
        base.check_tell_shapes(population, fitness, self.population_size, self.num_dims)
        order, num_bad = base.sort_best_first(fitness)
        best_member, best_fitness, gen_best = base.update_best(
            state.best_member, state.best_fitness, population, fitness
        )
        parents = population[order[: self.num_parents]].astype(state.mean.dtype)
        skip = num_bad == self.population_size
        new = jax.lax.cond(skip, lambda s, _: s, self._update, state, parents)
        return new.replace(
            generation=state.generation + 1,
            best_member=best_member,
            best_fitness=best_fitness,
            generation_best_fitness=gen_best,
            num_nonfinite=num_bad,
        )

    def metrics(self, state: SepCMAESState) -> dict[str, jax.Array]:
        """Scalars worth logging: step size, axis ratio of C, counts and best fitness."""
        return {
            "sigma": state.sigma,
            "axis_ratio": jnp.sqrt(jnp.max(state.C) / jnp.min(state.C)),
            "generation": state.generation,
            "best_fitness": state.best_fitness,
            "generation_best_fitness": state.generation_best_fitness,
            "num_nonfinite": state.num_nonfinite,
            "update_norm": state.update_norm,
        }

    def _update(self, s: SepCMAESState, parents: jax.Array) -> SepCMAESState:
        """Eqs. (41)-(47) with C diagonal, from the mu best candidates [mu, D], best first."""
        n, w = self.num_dims, jnp.asarray(self.weights, s.mean.dtype)
        cs, cc, c1, cmu, mu_eff = self.c_sigma, self.c_c, self.c_1, self.c_mu, self.mu_eff
        y = (parents - s.mean) / s.sigma
        y_w = w @ y  # Eq. (41)
        mean = s.mean + self.c_m * s.sigma * y_w  # Eq. (42)
        p_sigma = (1 - cs) * s.p_sigma + math.sqrt(cs * (2 - cs) * mu_eff) * y_w / jnp.sqrt(s.C)
        norm_ps = jnp.linalg.norm(p_sigma)  # Eq. (43) above, with C^{-1/2} = diag(C)^{-1/2}
        sigma = s.sigma * jnp.exp((cs / self.d_sigma) * (norm_ps / self.chi_n - 1))  # Eq. (44)
        g = (s.generation + 1).astype(s.mean.dtype)
        h_sigma = norm_ps / jnp.sqrt(1 - (1 - cs) ** (2 * g)) < (1.4 + 2 / (n + 1)) * self.chi_n
        h = h_sigma.astype(s.mean.dtype)
        p_c = (1 - cc) * s.p_c + h * math.sqrt(cc * (2 - cc) * mu_eff) * y_w  # Eq. (45)
        delta_h = (1 - h) * cc * (2 - cc)
        rank_mu = w @ (y * y)  # diag(sum_i w_i y_i y_i^T)
        C = (1 + c1 * delta_h - c1 - cmu) * s.C + c1 * p_c * p_c + cmu * rank_mu  # Eq. (47), diag
        C = jnp.maximum(C, jnp.max(C) * jnp.finfo(C.dtype).eps)  # keep sqrt(C) and 1/sqrt(C) finite
        return s.replace(
            mean=mean,
            sigma=jnp.clip(sigma, self.sigma_min, self.sigma_max),
            p_sigma=p_sigma,
            p_c=p_c,
            C=C,
            update_norm=jnp.linalg.norm(mean - s.mean),
        )
