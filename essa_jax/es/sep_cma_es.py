"""sep-CMA-ES: CMA-ES with a diagonal covariance (Ros & Hansen 2008).

R. Ros and N. Hansen, "A Simple Modification in CMA-ES Achieving Linear Time and Space Complexity",
PPSN X (2008), inria-00287367. The covariance is restricted to its diagonal, so sampling and the
update cost O(n) per candidate and no eigendecomposition is needed; the covariance learning rates
are multiplied by (n + 2) / 3 (their Eq. 6) because a diagonal has only n free parameters to learn.
Everything else (weights, paths, step-size control) is the full CMA-ES of Hansen's tutorial
(arXiv 1604.00772, "Eq. (n)" below) restricted to diagonal matrices, with positive weights only.

Fitness is MAXIMISED. Non-finite fitness ranks last; a generation with no finite fitness leaves the
distribution untouched and only advances the counter and the metrics.

The bookkeeping (shape checks, best-so-far, non-finite count, the no-finite-fitness skip,
generation counter, update norm, common metrics and initial fields) lives in
`essa_jax.es.base.BaseStrategy`; this module holds the diagonal update only.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from essa_jax.es import base
from essa_jax.es.cma_es import CMAES


@struct.dataclass
class SepCMAESState(base.Bookkeeping):
    """Everything needed to resume a sep-CMA-ES run (D = num_dims).

    mean [D], sigma [], p_sigma [D], p_c [D], C [D] (the diagonal of the covariance); generation,
    best_member, best_fitness, generation_best_fitness, num_nonfinite, update_norm: the
    bookkeeping of `base.BaseStrategy.BOOKKEEPING`.
    """

    mean: jax.Array
    sigma: jax.Array
    p_sigma: jax.Array
    p_c: jax.Array
    C: jax.Array


@dataclasses.dataclass(frozen=True)
class SepCMAES(CMAES):
    """Separable (diagonal) CMA-ES; fitness is MAXIMISED. Same arguments and defaults as `CMAES`
    except that the default c_1 and c_mu carry the (n + 2) / 3 factor (Ros & Hansen 2008, Eq. 6)
    and ``eigen_interval`` is unused (there is no eigendecomposition)."""

    state_type: ClassVar[type] = SepCMAESState
    # no eigendecomposition to schedule: the base class's tell, not CMAES's two-program one
    tell = base.BaseStrategy.tell

    def __post_init__(self) -> None:
        if self.mirrored:  # sampling and selection here are CMA-ES's plain ones
            raise ValueError("mirrored=True is implemented for CMAES only, not SepCMAES")
        super().__post_init__()

    @staticmethod
    def _covariance_rates(n: int, mu_eff: float) -> tuple[float, float]:
        c_1, c_mu = CMAES._covariance_rates(n, mu_eff)
        scale = (n + 2) / 3  # Ros & Hansen 2008, Eq. (6)
        return min(1.0, c_1 * scale), c_mu * scale

    def _init(self, key: jax.Array, mean: jax.Array) -> dict[str, Any]:
        """C = 1 (the identity's diagonal) and zero paths (`key` is unused)."""
        n, dt = self.num_dims, mean.dtype
        return dict(p_sigma=jnp.zeros(n, dt), p_c=jnp.zeros(n, dt), C=jnp.ones(n, dt))

    @partial(jax.jit, static_argnums=0)
    def ask(self, key: jax.Array, state: SepCMAESState) -> jax.Array:
        """x_k = m + sigma sqrt(C) z_k, z_k ~ N(0, I) (Eqs. 38-40 with diagonal C). -> [P, D]."""
        z = jax.random.normal(key, (self.population_size, self.num_dims), state.mean.dtype)
        return state.mean + state.sigma * jnp.sqrt(state.C) * z

    def _tell(
        self, state: SepCMAESState, population: jax.Array, fitness: jax.Array, skip: jax.Array
    ) -> SepCMAESState:
        """The diagonal update from the mu best candidates; the identity when `skip`."""
        parents = self._parents(state, population, fitness)
        return jax.lax.cond(skip, lambda s, _: s, self._update, state, parents)

    def _metrics(self, state: SepCMAESState) -> dict[str, jax.Array]:
        """Axis ratio of the diagonal C: sqrt(max C / min C)."""
        return {"axis_ratio": jnp.sqrt(jnp.max(state.C) / jnp.min(state.C))}

    def _update(self, s: SepCMAESState, parents: jax.Array) -> SepCMAESState:
        """Eqs. (41)-(47) with C diagonal, from the mu best candidates [mu, D], best first."""
        w, cs, c1, cmu = jnp.asarray(self.weights, s.mean.dtype), self.c_sigma, self.c_1, self.c_mu
        y = (parents - s.mean) / s.sigma
        y_w = w @ y  # Eq. (41)
        mean = s.mean + self.c_m * s.sigma * y_w  # Eq. (42)
        ps_rate = math.sqrt(cs * (2 - cs) * self.mu_eff)  # Eq. (43) with C^{-1/2} = diag(C)^{-1/2}
        p_sigma = (1 - cs) * s.p_sigma + ps_rate * y_w / jnp.sqrt(s.C)
        sigma, p_c, delta_h = self._step_size_and_path(s, p_sigma, y_w, cs)  # Eqs. (44), (45)
        rank_mu = w @ (y * y)  # diag(sum_i w_i y_i y_i^T)
        C = (1 + c1 * delta_h - c1 - cmu) * s.C + c1 * p_c * p_c + cmu * rank_mu  # Eq. (47), diag
        C = jnp.maximum(C, jnp.max(C) * jnp.finfo(C.dtype).eps)  # keep sqrt(C) and 1/sqrt(C) finite
        return s.replace(mean=mean, sigma=sigma, p_sigma=p_sigma, p_c=p_c, C=C)
