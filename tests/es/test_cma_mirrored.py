"""Mirrored sampling with pairwise selection in CMA-ES (`CMAES(mirrored=True)`).

Reference: Auger, Brockhoff & Hansen 2011, "Mirrored sampling in evolution strategies with
weighted recombination": the better member of each pair m +- sigma y is kept, the best mu of those
lambda/2 are recombined with the weights of a population of lambda/2. The selection is checked
against a NumPy reference with and without jit (`chex.variants`).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from es_problems import unjitted

from essa_jax.es import CMAES
from essa_jax.es.base import recombination_weights


def test_ask_returns_mirrored_pairs():
    s = CMAES(num_dims=5, population_size=8, sigma_init=0.3, mirrored=True)
    mean = jnp.arange(5.0)
    x = np.asarray(s.ask(jax.random.key(0), s.init(jax.random.key(0), mean)))
    np.testing.assert_allclose(x[:4] + x[4:], np.tile(2 * np.asarray(mean), (4, 1)), atol=1e-6)
    assert np.all(np.abs(x[:4] - x[4:]) > 0)


class PairwiseSelectionTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_pairwise_selection_recombines_the_better_member_of_each_pair(self):
        lam, n = 12, 4
        s = CMAES(num_dims=n, population_size=lam, sigma_init=0.5, mirrored=True)
        assert s.num_parents == 3 and s.weights == recombination_weights(6, 3)
        ask, tell = self.variant(unjitted(s, "ask")), self.variant(unjitted(s, "tell"))
        state = s.init(jax.random.key(0), jnp.zeros(n))
        pop = ask(jax.random.key(1), state)
        fitness = jax.random.normal(jax.random.key(2), (lam,))
        new = tell(state, pop, fitness)

        p, f = np.asarray(pop), np.asarray(fitness)
        half = lam // 2
        kept = [p[i] if f[i] >= f[i + half] else p[i + half] for i in range(half)]
        kept_f = np.maximum(f[:half], f[half:])
        parents = np.asarray(kept)[np.argsort(-kept_f)[: s.num_parents]]
        expected_mean = np.asarray(s.weights) @ parents  # m = 0, c_m = 1: m' = sum w_i x_i
        chex.assert_trees_all_close(new.mean, expected_mean, rtol=1e-5, atol=1e-6)
        # the best-so-far is taken over the whole population, before the pairwise selection
        assert float(new.best_fitness) == pytest.approx(f.max())
        chex.assert_trees_all_equal(new.best_member, pop[int(np.argmax(f))])

    @chex.variants(with_jit=True, without_jit=True)
    def test_nonfinite_member_loses_its_pair(self):
        s = CMAES(num_dims=2, population_size=4, sigma_init=1.0, mirrored=True)
        tell = self.variant(unjitted(s, "tell"))
        state = s.init(jax.random.key(0), jnp.zeros(2))
        pop = s.ask(jax.random.key(3), state)
        # Pair 0: the + member is NaN, so the - member (row 2) must win although pair 1 scores
        # lower.
        new = tell(state, pop, jnp.array([jnp.nan, 0.0, 1.0, -5.0]))
        chex.assert_trees_all_close(new.mean, pop[2], atol=1e-6)
        assert int(new.num_nonfinite) == 1


def test_mirrored_cma_converges_on_the_sphere():
    s = CMAES(num_dims=6, population_size=10, sigma_init=0.5, mirrored=True)
    key = jax.random.key(4)
    state = s.init(key, jnp.full((6,), 2.0))

    @jax.jit
    def gen(state, g):
        pop = s.ask(jax.random.fold_in(key, g), state)
        return s.tell(state, pop, -jnp.sum(pop**2, axis=1))

    for g in range(250):
        state = gen(state, g)
    assert float(jnp.sum(state.mean**2)) < 1e-8 * 24.0


def test_mirroring_cancels_even_order_noise():
    """Fitness = a weak linear signal along u minus a large even term that differs per candidate
    (|x_perp|^2 with per-candidate random curvature): the pairwise winner is decided by the odd
    part alone, so the mean climbs u; plain CMA-ES mostly selects small |x_perp| and drifts."""
    n, lam = 40, 16
    u = jnp.ones(n) / jnp.sqrt(n)

    def climb(mirrored):
        s = CMAES(num_dims=n, population_size=lam, sigma_init=0.5, mirrored=mirrored)
        key = jax.random.key(5)
        state = s.init(key, jnp.zeros(n))

        @jax.jit
        def gen(state, g):
            k_ask, k_noise = jax.random.split(jax.random.fold_in(key, g))
            pop = s.ask(k_ask, state)
            d = pop - state.mean
            along = d @ u
            perp = jnp.sum((d - along[:, None] * u) ** 2, axis=1)
            curv = jnp.tile(jax.random.uniform(k_noise, (lam // 2,), minval=0.5, maxval=1.5), 2)
            return s.tell(state, pop, 0.05 * (pop @ u) - curv * perp)

        for g in range(30):
            state = gen(state, g)
        return float(state.mean @ u)

    assert climb(True) > 1.0
    assert climb(True) > 3 * abs(climb(False))


def test_mirrored_needs_an_even_population():
    with pytest.raises(ValueError, match="even"):
        CMAES(num_dims=3, population_size=7, mirrored=True)
    with pytest.raises(ValueError, match="population_size / 2"):
        CMAES(num_dims=3, population_size=8, num_parents=5, mirrored=True)
