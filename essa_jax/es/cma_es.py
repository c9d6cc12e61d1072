"""CMA-ES: Covariance Matrix Adaptation Evolution Strategy (Hansen & Ostermeier 2001).

Equations and default hyper-parameters follow N. Hansen, "The CMA Evolution Strategy: A Tutorial",
arXiv 1604.00772 (2016); "Eq. (n)" below refers to that text. Choices where the tutorial offers
several:

- Positive recombination weights only (Eq. 49, mu = floor(lambda / 2)): no active CMA, i.e. the
  same algorithm as pycma with ``CMA_active=False``.
- The eigendecomposition C = B diag(D^2) B^T is refreshed lazily, every ``eigen_interval``
  generations (tutorial, Sec. B.2: about every 1 / ((c_1 + c_mu) n 10) generations, which keeps
  the O(n^3) decomposition at O(n^2) per evaluation), after symmetrising C; eigenvalues are
  floored at ``max_eigenvalue * eps(dtype)`` so B, D stay finite. Between refreshes nothing reads
  C (sampling and C^{-1/2} use the B, D of the last refresh), so C is not touched either
  (``defer_covariance``, the default when it saves memory traffic): Eq. (47) unrolled over the k
  generations since the refresh is

      C_k = (prod_g a_g) C_0 + sum_g (prod_{g' > g} a_g') Z_g^T Z_g,
      a_g = 1 - c_1 - c_mu + c_1 delta(h_sigma),  Z_g = [sqrt(c_1) p_c; sqrt(c_mu w_i) y_i]
      ([mu + 1, n]: the rank-one and rank-mu terms as rows),

  so a generation appends its mu + 1 rows to a buffer ``C_factors`` (scaled so that
  C = C_scale (C_0 + C_factors^T C_factors)) and the refresh applies every pending row in one
  matmul (k (mu + 1) deep) before ``eigh``. A generation without a refresh costs the sampling
  matmul and two matrix-vector products with B, and writes no [n, n] array. With few dimensions
  (k (mu + 1) >= n) the buffer would be larger than C, and C is updated every generation instead,
  still as one matmul.
- ``tell`` called on concrete arrays (the ESSA loop) decides on the host whether the refresh is
  due (one scalar read) and runs one of two compiled programs, so a generation without a refresh
  passes C and B through untouched (jit forwards unchanged inputs; no copy). Traced (under jit,
  vmap, scan) it uses a ``lax.cond``; XLA copies the [n, n] operands of a cond's identity branch,
  and under ``vmap`` the cond becomes a select, so every generation pays for ``eigh`` there.
- Optional mirrored sampling with pairwise selection (``mirrored=True``; Brockhoff et al. 2010,
  "Mirrored sampling and sequential selection for evolution strategies", PPSN; Auger, Brockhoff &
  Hansen 2011, "Mirrored sampling in evolution strategies with weighted recombination", GECCO):
  ``ask`` returns lambda/2 pairs m +- sigma y_i; ``tell`` keeps the better member of every pair and
  recombines the best mu of those lambda/2 with the weights of a population of lambda/2. A pair
  shares every even-order effect of its perturbation (a random direction that hurts whatever its
  sign), so only the odd, gradient-like part decides which member wins. That is what noisy,
  coarse fitness (accuracy on a few prompts) needs; under random fitness the kept member is a
  random sign of y_i, so the step-size path sees no selection bias.
- Fitness is MAXIMISED: candidates are ranked best = largest fitness. Non-finite fitness ranks last;
  a generation with no finite fitness leaves the distribution (mean, sigma, paths, C, B, D)
  untouched and only advances the counter and the metrics.

The bookkeeping shared with the other strategies (shape checks, best-so-far, non-finite count, the
no-finite-fitness skip, generation counter, update norm, common metrics and initial fields) lives
in `essa_jax.es.base.BaseStrategy`; this module holds the CMA-ES update only: pairwise selection,
Eqs. (41)-(47), the deferred covariance update and the lazy eigendecomposition.
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


@struct.dataclass
class CMAESState(base.Bookkeeping):
    """Everything needed to resume a CMA-ES run. Shapes: D = num_dims.

    mean [D]; sigma [] (step size); p_sigma [D], p_c [D] (evolution paths); C [D, D], C_factors
    [K, D], C_scale []: the covariance is C_scale (C + C_factors^T C_factors) (`CMAES.covariance`;
    without ``defer_covariance`` C is the covariance itself, C_factors one unused row of zeros);
    since_refresh [] int32 (updates since the last eigendecomposition); B [D, D], D [D]
    (eigenvectors and square-rooted eigenvalues of the covariance at the last refresh, the
    tutorial's B and D); generation, best_member, best_fitness, generation_best_fitness,
    num_nonfinite, update_norm: the bookkeeping of `base.BaseStrategy.BOOKKEEPING`.
    """

    mean: jax.Array
    sigma: jax.Array
    p_sigma: jax.Array
    p_c: jax.Array
    C: jax.Array
    C_factors: jax.Array
    C_scale: jax.Array
    since_refresh: jax.Array
    B: jax.Array
    D: jax.Array


@dataclasses.dataclass(frozen=True)
class CMAES(base.BaseStrategy[CMAESState]):
    """Full-covariance CMA-ES; fitness is MAXIMISED. Hyper-parameters left as None get Hansen's
    defaults (arXiv 1604.00772, Table 1), resolved at construction (``repr`` shows them all).

    Args:
      num_dims: genome length n.
      population_size: lambda; default 4 + floor(3 ln n).
      sigma_init: initial step size sigma_0 (about 1/4 to 1/2 of the search-range width).
      num_parents: mu; default floor(lambda / 2).
      c_sigma, d_sigma: step-size cumulation rate and damping (Eq. 55).
      c_c: cumulation rate of the rank-one path (Eq. 56).
      c_1, c_mu: learning rates of the rank-one and rank-mu updates (Eqs. 57, 58).
      c_m: learning rate of the mean (Eq. 54, default 1).
      eigen_interval: generations between eigendecompositions of C (tutorial, Sec. B.2).
      sigma_min, sigma_max: clip of the step size, keeping the state finite.
      mirrored: sample lambda/2 mirrored pairs and select pairwise (module docstring); lambda must
        be even, mu then defaults to floor(lambda / 4) and the weights are those of lambda / 2.
      defer_covariance: keep each generation's rank-one and rank-mu terms as rows and apply them
        to C at the eigendecomposition, in one matmul (module docstring). None: when the buffer
        (eigen_interval x (mu + 1) rows) is smaller than n rows, i.e. when it saves traffic.
    """

    num_dims: int
    population_size: int | None = None
    sigma_init: float = 1.0
    num_parents: int | None = None
    c_sigma: float | None = None
    d_sigma: float | None = None
    c_c: float | None = None
    c_1: float | None = None
    c_mu: float | None = None
    c_m: float = 1.0
    eigen_interval: int | None = None
    sigma_min: float = 0.0
    sigma_max: float = 1e8
    mirrored: bool = False
    defer_covariance: bool | None = None
    # derived in __post_init__: recombination weights (Eq. 49), mu_eff (Eq. 8), E||N(0, I)||
    weights: tuple[float, ...] = dataclasses.field(init=False, repr=False, default=())
    mu_eff: float = dataclasses.field(init=False, repr=False, default=0.0)
    chi_n: float = dataclasses.field(init=False, repr=False, default=0.0)
    state_type: ClassVar[type] = CMAESState

    def __post_init__(self) -> None:
        n = base.check_int("num_dims", self.num_dims, 1)
        lam = self.population_size
        lam = base.default_population_size(n) if lam is None else lam
        lam = base.check_int("population_size", lam, 2)
        if self.mirrored and lam % 2:
            raise ValueError(
                f"population_size must be even with mirrored=True (pairs m +- sigma y), got {lam}"
            )
        # With pairwise selection only lambda/2 candidates (the better of each pair) are ranked.
        ranked = lam // 2 if self.mirrored else lam
        mu = max(ranked // 2, 1) if self.num_parents is None else self.num_parents
        mu = base.check_int("num_parents", mu, 1)
        if mu > ranked:
            what = "population_size / 2 (mirrored)" if self.mirrored else "population_size"
            raise ValueError(f"num_parents must be <= {what} ({ranked}), got {mu}")
        base.check_positive("sigma_init", self.sigma_init)
        w = base.recombination_weights(ranked, mu)  # Eq. (49)
        mu_eff = 1.0 / sum(x * x for x in w)  # Eq. (8), sum(w) = 1
        c_sigma = (mu_eff + 2) / (n + mu_eff + 5) if self.c_sigma is None else self.c_sigma  # (55)
        d_sigma = self.d_sigma
        if d_sigma is None:  # Eq. (55)
            d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
        c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n) if self.c_c is None else self.c_c  # (56)
        c_1, c_mu = self._covariance_rates(n, mu_eff)
        c_1 = c_1 if self.c_1 is None else self.c_1
        c_mu = min(1 - c_1, c_mu) if self.c_mu is None else self.c_mu
        interval = self.eigen_interval
        if interval is None:  # tutorial, Sec. B.2: lazy update of B and D
            interval = int(1.0 / ((c_1 + c_mu) * n * 10)) + 1 if c_1 + c_mu > 0 else 1
        defer = self.defer_covariance
        if defer is None:  # the buffer must be smaller than C to save anything
            defer = interval > 1 and interval * (mu + 1) < n
        resolved = dict(
            population_size=lam, num_parents=mu, c_sigma=c_sigma, d_sigma=d_sigma, c_c=c_c,
            c_1=c_1, c_mu=c_mu, eigen_interval=interval, weights=w, mu_eff=mu_eff,
            chi_n=base.expected_norm(n), defer_covariance=bool(defer),
        )  # fmt: skip
        for k, v in resolved.items():
            object.__setattr__(self, k, v)
        base.check_rate("c_sigma", c_sigma, upper_inclusive=False)
        base.check_positive("d_sigma", d_sigma)
        base.check_rate("c_c", c_c)
        base.check_rate("c_1", c_1)
        base.check_rate("c_mu", c_mu)
        if c_1 + c_mu > 1:
            raise ValueError(f"c_1 + c_mu must be <= 1, got {c_1} + {c_mu}")
        base.check_positive("c_m", self.c_m)
        base.check_int("eigen_interval", interval, 1)
        base.check_positive("sigma_min", self.sigma_min, allow_zero=True)
        base.check_positive("sigma_max", self.sigma_max)

    @staticmethod
    def _covariance_rates(n: int, mu_eff: float) -> tuple[float, float]:
        """c_1 = 2 / ((n + 1.3)^2 + mu_eff) (Eq. 57); c_mu (Eq. 58) before the 1 - c_1 cap."""
        c_1 = 2.0 / ((n + 1.3) ** 2 + mu_eff)
        c_mu = 2.0 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff)
        return c_1, c_mu

    @property
    def factor_rows(self) -> int:
        """K, the rows of the deferred-update buffer: eigen_interval x (mu + 1), or 0."""
        return self.eigen_interval * (self.num_parents + 1) if self.defer_covariance else 0

    def tell(self, state: CMAESState, population: jax.Array, fitness: jax.Array) -> CMAESState:
        """`base.BaseStrategy.tell` (bookkeeping + Eqs. 41-47, no eigendecomposition), then the
        lazy refresh when `eigen_interval` updates are pending.

        On concrete arrays the host reads the counter and runs the refresh program only when it
        is due, so other generations leave C and B untouched (no [D, D] copy); traced (inside
        jit / vmap / scan) the same choice is a `lax.cond` (module docstring)."""
        if isinstance(state.since_refresh, jax.core.Tracer):
            new = super().tell(state, population, fitness)
            due = new.since_refresh >= self.eigen_interval
            return jax.lax.cond(due, self._refresh, lambda s: s, new)
        # The update program returns only what a generation changes; the [D, D] arrays it leaves
        # alone are passed on as the same arrays (a jitted function's output is a new buffer).
        new = state.replace(**self._update_program(state, population, fitness))
        return self._refresh_program(new) if int(new.since_refresh) >= self.eigen_interval else new

    @partial(jax.jit, static_argnums=0)
    def _update_program(
        self, state: CMAESState, population: jax.Array, fitness: jax.Array
    ) -> dict[str, jax.Array]:
        """`base.BaseStrategy.tell` without the fields only a refresh changes: B, D, and C when
        the update is deferred. -> {field: new value}."""
        new = base.BaseStrategy.tell.__wrapped__(self, state, population, fitness)
        unchanged = ("B", "D", "C") if self.factor_rows else ("B", "D")
        return {
            f.name: getattr(new, f.name) for f in dataclasses.fields(new) if f.name not in unchanged
        }

    @partial(jax.jit, static_argnums=0)
    def covariance(self, state: CMAESState) -> jax.Array:
        """The current covariance C_scale (C + C_factors^T C_factors) [D, D] (Eq. 47 up to this
        generation; C itself when nothing is deferred)."""
        if not self.factor_rows:
            return state.C
        return state.C_scale * (state.C + state.C_factors.T @ state.C_factors)

    # -- hooks of base.BaseStrategy (which holds init / tell / metrics and the bookkeeping) -----

    def _init(self, key: jax.Array, mean: jax.Array) -> dict[str, Any]:
        """C = B = I, D = 1, zero paths and no pending update (`key` is unused)."""
        n, dt = self.num_dims, mean.dtype
        return dict(
            p_sigma=jnp.zeros(n, dt),
            p_c=jnp.zeros(n, dt),
            C=jnp.eye(n, dtype=dt),
            # one unused row when nothing is deferred: orbax cannot save zero-size arrays
            C_factors=jnp.zeros((max(self.factor_rows, 1), n), dt),
            C_scale=jnp.ones((), dt),
            since_refresh=jnp.zeros((), jnp.int32),
            B=jnp.eye(n, dtype=dt),
            D=jnp.ones(n, dt),
        )

    @partial(jax.jit, static_argnums=0)
    def ask(self, key: jax.Array, state: CMAESState) -> jax.Array:
        """Sample lambda candidates x_k = m + sigma B D z_k, z_k ~ N(0, I) (Eqs. 38-40). -> [P, D].

        A pure function of (key, state): the state is not advanced."""
        if self.mirrored:
            half = jax.random.normal(key, (self.population_size // 2, self.num_dims))
            z = jnp.concatenate([half, -half]).astype(state.mean.dtype)  # pair i: rows i, i + P/2
        else:
            z = jax.random.normal(key, (self.population_size, self.num_dims), state.mean.dtype)
        return state.mean + state.sigma * ((z * state.D) @ state.B.T)

    def _tell(
        self, state: CMAESState, population: jax.Array, fitness: jax.Array, skip: jax.Array
    ) -> CMAESState:
        """Pairwise selection (if mirrored) and the update of Eqs. (41)-(47); the lazy eigen
        refresh follows in `tell`. `skip` zeroes the learning rates (see `_update`) and does not
        count towards the refresh."""
        if self.mirrored:
            population, fitness = _pairwise_select(population, fitness)
        return self._update(state, self._parents(state, population, fitness), skip)

    def _metrics(self, state: CMAESState) -> dict[str, jax.Array]:
        """Axis ratio of C: sqrt(max / min eigenvalue) at the last refresh."""
        return {"axis_ratio": jnp.max(state.D) / jnp.min(state.D)}

    def _parents(self, state: Any, population: jax.Array, fitness: jax.Array) -> jax.Array:
        """The mu best candidates [mu, D], best first, in the dtype of the mean."""
        order = base.sort_best_first(fitness)
        return population[order[: self.num_parents]].astype(state.mean.dtype)

    # -- the update (Eqs. 41-47) --------------------------------------------------------------

    def _update(self, s: CMAESState, parents: jax.Array, skip: jax.Array) -> CMAESState:
        """One generation's distribution update from the mu best candidates [mu, D], best first.

        Eq. (47) is C' = a C + Z^T Z with a = 1 - c_1 - c_mu + c_1 delta(h_sigma) and the rows
        Z = [sqrt(c_1) p_c; sqrt(c_mu w_i) y_i] [mu + 1, D]: one matmul, or (deferred) Z is
        appended to `C_factors` (module docstring). With `skip` every learning rate is 0, which
        leaves the distribution bit-identical without a lax.cond (whose identity branch would
        copy the [D, D] matrices every generation)."""
        dt = s.mean.dtype
        w, cs, mu_eff = jnp.asarray(self.weights, dt), self.c_sigma, self.mu_eff
        keep = 1.0 - skip.astype(dt)
        c1, cmu, cm, cs_eff = keep * self.c_1, keep * self.c_mu, keep * self.c_m, keep * cs
        y = (parents - s.mean) / s.sigma  # y_{i:lambda} ~ N(0, C)
        y_w = w @ y  # Eq. (41)
        mean = s.mean + cm * s.sigma * y_w  # Eq. (42)
        # C^{-1/2} y_w = B D^{-1} B^T y_w with the B, D used to sample: two passes over B
        c_inv_sqrt_y_w = s.B @ ((y_w @ s.B) / s.D)
        ps_new = (1 - cs) * s.p_sigma + math.sqrt(cs * (2 - cs) * mu_eff) * c_inv_sqrt_y_w  # (43)
        p_sigma = jnp.where(skip, s.p_sigma, ps_new)
        sigma, p_c, delta_h = self._step_size_and_path(s, p_sigma, y_w, cs_eff)  # Eqs. (44), (45)
        p_c = jnp.where(skip, s.p_c, p_c)
        a = 1 + c1 * delta_h - c1 - cmu  # Eq. (47): the factor of the old C
        rows = jnp.concatenate([jnp.sqrt(c1) * p_c[None], jnp.sqrt(cmu * w)[:, None] * y])
        since = s.since_refresh + (~skip).astype(jnp.int32)
        new = s.replace(mean=mean, sigma=sigma, p_sigma=p_sigma, p_c=p_c, since_refresh=since)
        if not self.factor_rows:  # Eq. (47): rank-one and rank-mu terms in one [D, mu+1] matmul
            return new.replace(C=a * s.C + rows.T @ rows)
        # C' = a C_scale (C + F^T F) + Z^T Z = C_scale' (C + F^T F + Z'^T Z'), C_scale' = a C_scale,
        # Z' = Z / sqrt(C_scale'): this generation's rows go to slot since_refresh of the buffer
        # (a skipped generation writes zeros there and does not advance the slot).
        scale = a * s.C_scale
        offset = s.since_refresh * (self.num_parents + 1)
        factors = jax.lax.dynamic_update_slice(
            s.C_factors, rows / jnp.sqrt(scale), (offset, jnp.zeros((), offset.dtype))
        )
        return new.replace(C_factors=factors, C_scale=scale)

    def _refresh(self, s: CMAESState) -> CMAESState:
        """Apply the deferred rows (one [D, K] @ [K, D] matmul), symmetrise C and refresh B, D:
        C = B diag(D^2) B^T, eigenvalues floored at max * eps(dtype)."""
        C = self.covariance(s)
        C = 0.5 * (C + C.T)
        eigvals, B = jnp.linalg.eigh(C, symmetrize_input=False)  # symmetrised above
        floor = jnp.max(eigvals) * jnp.finfo(C.dtype).eps
        D = jnp.sqrt(jnp.maximum(eigvals, floor))
        return s.replace(
            C=C,
            C_factors=jnp.zeros_like(s.C_factors),
            C_scale=jnp.ones_like(s.C_scale),
            since_refresh=jnp.zeros_like(s.since_refresh),
            B=B,
            D=D,
        )

    @partial(jax.jit, static_argnums=0)
    def _refresh_program(self, s: CMAESState) -> CMAESState:
        """`_refresh` as its own compiled program (what an eager `tell` runs when it is due)."""
        return self._refresh(s)

    def _step_size_and_path(
        self, s: Any, p_sigma: jax.Array, y_w: jax.Array, c_sigma: Any
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The part of the update that does not involve C, shared with sep-CMA-ES: sigma' (Eq. 44,
        clipped to [sigma_min, sigma_max]), p_c' (Eq. 45, with h_sigma of p. 28) and
        delta(h_sigma) = (1 - h_sigma) c_c (2 - c_c) (p. 29, used in Eq. 47), from the new p_sigma
        and y_w. `c_sigma` is the rate in the exponent of Eq. (44) (CMA-ES zeroes it to skip)."""
        n, cs, cc, dt = self.num_dims, self.c_sigma, self.c_c, s.mean.dtype
        norm_ps = jnp.linalg.norm(p_sigma)
        sigma = s.sigma * jnp.exp((c_sigma / self.d_sigma) * (norm_ps / self.chi_n - 1))  # (44)
        g = (s.generation + 1).astype(dt)  # generations including this one
        h_sigma = norm_ps / jnp.sqrt(1 - (1 - cs) ** (2 * g)) < (1.4 + 2 / (n + 1)) * self.chi_n
        h = h_sigma.astype(dt)
        p_c = (1 - cc) * s.p_c + h * math.sqrt(cc * (2 - cc) * self.mu_eff) * y_w  # Eq. (45)
        delta_h = (1 - h) * cc * (2 - cc)
        return jnp.clip(sigma, self.sigma_min, self.sigma_max), p_c, delta_h


def _pairwise_select(population: jax.Array, fitness: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The better member of each mirrored pair (rows i and i + P/2): ([P/2, D], [P/2]).

    Ties keep the first (the + member); a non-finite fitness loses to a finite one."""
    half = population.shape[0] // 2
    f = base.finite_or_worst(fitness)
    plus_wins = f[:half] >= f[half:]
    kept = jnp.where(plus_wins[:, None], population[:half], population[half:])
    return kept, jnp.where(plus_wins, fitness[:half], fitness[half:])
