"""CMA-ES's deferred covariance update (`CMAES(defer_covariance=True)`): each generation's rank-one
and rank-mu rows wait in a buffer and reach C in one matmul at the lazy eigendecomposition
(Hansen, arXiv 1604.00772, Eq. 47 unrolled; Sec. B.2 for the interval). Checked against the
float64 purecmaes transcription of test_cma_reference.py, against the undeferred update, with and
without jit (`chex.variants`: traced = lax.cond, eager = two programs picked on the host)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from es_problems import rosenbrock, unjitted
from test_cma_reference import purecmaes_tell

from essa_jax.es import CMAES

N, LAM = 12, 8  # mu = 4: 5 rows per generation, interval 2: a 10-row buffer < 12 rows of C


def _strategy(**kw):
    return CMAES(N, population_size=LAM, sigma_init=0.7, eigen_interval=2, **kw)


def test_default_defers_only_where_the_buffer_is_smaller_than_c():
    big = CMAES(7168, population_size=96)
    assert big.eigen_interval == 15 and big.defer_covariance and big.factor_rows == 15 * 49
    assert not CMAES(448, population_size=96).defer_covariance  # interval 1: nothing to defer
    assert not CMAES(5, population_size=8, eigen_interval=3).defer_covariance  # 15 rows >= 5
    assert _strategy().defer_covariance and _strategy().factor_rows == 10


class DeferredTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_deferred_tell_matches_purecmaes_and_skips_hold_the_refresh(self):
        s = _strategy()
        tell = self.variant(unjitted(s, "tell"))
        st = s.init(jax.random.key(0), jnp.full(N, 0.5))
        kinds = ["ok", "ok", "ok", "skip", "ok", "ok"]
        refreshed = []
        for g, kind in enumerate(kinds):
            pop = s.ask(jax.random.fold_in(jax.random.key(1), g), st)
            fit = -rosenbrock(pop) if kind == "ok" else jnp.full(LAM, jnp.nan)
            new = tell(st, pop, fit)
            if kind == "skip":  # nothing moves, the pending count included
                for k in ("mean", "sigma", "p_sigma", "p_c", "B", "D", "since_refresh"):
                    chex.assert_trees_all_equal(getattr(new, k), getattr(st, k))
                chex.assert_trees_all_equal(s.covariance(new), s.covariance(st))
            else:
                ref = purecmaes_tell(s, st.replace(C=s.covariance(st)), pop, fit)
                got = {k: getattr(new, k) for k in ("mean", "sigma", "p_sigma", "p_c")}
                got["C"] = s.covariance(new)
                chex.assert_trees_all_close(got, ref, rtol=2e-4, atol=1e-6)
            refreshed.append(not np.array_equal(np.asarray(new.B), np.asarray(st.B)))
            st = new
        # refreshes after every 2 counted updates: generations 1 and 4 (3 was skipped)
        assert refreshed == [False, True, False, False, True, False]
        b, d = np.asarray(st.B, np.float64), np.asarray(st.D, np.float64)
        c_at_refresh = np.asarray(st.C, np.float64)  # generation 4's C, factors applied
        chex.assert_trees_all_close(b @ np.diag(d**2) @ b.T, c_at_refresh, rtol=1e-4, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_deferred_equals_the_per_generation_update(self):
        deferred, direct = _strategy(), _strategy(defer_covariance=False)
        t_def, t_dir = (self.variant(unjitted(x, "tell")) for x in (deferred, direct))
        a = deferred.init(jax.random.key(0), jnp.full(N, 0.5))
        b = direct.init(jax.random.key(0), jnp.full(N, 0.5))
        for g in range(7):
            pop = deferred.ask(jax.random.fold_in(jax.random.key(2), g), a)
            a, b = t_def(a, pop, -rosenbrock(pop)), t_dir(b, pop, -rosenbrock(pop))
            chex.assert_trees_all_close(deferred.covariance(a), b.C, rtol=1e-4, atol=1e-6)
            for k in ("mean", "sigma", "p_sigma", "p_c", "D", "since_refresh"):
                chex.assert_trees_all_close(getattr(a, k), getattr(b, k), rtol=1e-4, atol=1e-6)


def test_eager_tell_without_refresh_passes_c_and_b_on_uncopied():
    s = _strategy()
    st = s.init(jax.random.key(0), jnp.zeros(N))
    pop = s.ask(jax.random.key(1), st)
    new = s.tell(st, pop, -rosenbrock(pop))
    assert int(new.since_refresh) == 1
    assert new.C is st.C and new.B is st.B and new.D is st.D  # the same arrays, no [D, D] copy
    new2 = s.tell(new, pop, -rosenbrock(pop))  # second update: the refresh is due
    assert int(new2.since_refresh) == 0 and new2.B is not new.B
