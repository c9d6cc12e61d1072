"""CMA-ES and sep-CMA-ES against references: pycma's constants, a float64 NumPy transcription of
Hansen's purecmaes update (arXiv 1604.00772, App. C; with and without jit, `chex.variants`), and
pycma's evaluation counts (slow)."""

import functools

import chex
import cma
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from es_problems import rosenbrock, sphere, unjitted

from essa_jax.es import CMAES, SepCMAES


@pytest.mark.parametrize("num_dims", [5, 40, 448])
def test_default_constants_match_pycma(num_dims):
    """Weights, mu, mu_eff, c_c and c_1 follow the same formulas in pycma (positive weights)."""
    es = cma.CMAEvolutionStrategy(np.zeros(num_dims), 1.0, {"CMA_active": False, "verbose": -9})
    ours, sep = CMAES(num_dims), SepCMAES(num_dims)
    assert ours.population_size == es.popsize
    assert ours.num_parents == es.sp.weights.mu
    np.testing.assert_allclose(ours.weights, np.asarray(es.sp.weights)[: ours.num_parents])
    np.testing.assert_allclose(ours.mu_eff, es.sp.weights.mueff, rtol=1e-12)
    np.testing.assert_allclose(ours.c_c, es.sp.cc, rtol=1e-12)
    np.testing.assert_allclose(ours.c_1, es.sp.c1, rtol=1e-12)
    # pycma's c_sigma (denominator n + mu_eff + 3) and c_mu (+0.25 in the numerator) are from an
    # older revision of the tutorial than the Table 1 values used here; they stay close.
    np.testing.assert_allclose(ours.c_mu, es.sp.cmu, rtol=0.25)
    # sep-CMA-ES: Ros & Hansen (2008) multiply the covariance rates by (n + 2) / 3.
    np.testing.assert_allclose(sep.c_1, ours.c_1 * (num_dims + 2) / 3, rtol=1e-12)
    np.testing.assert_allclose(sep.c_mu, min(1 - sep.c_1, ours.c_mu * (num_dims + 2) / 3))


def purecmaes_tell(s, st, pop, fit):
    """One generation of Hansen's purecmaes.m (tutorial App. C) in float64, positive weights."""
    n, lam, mu, w = s.num_dims, s.population_size, s.num_parents, np.asarray(s.weights)
    mean, sigma, ps, pc, C, B, D = (
        np.asarray(x, np.float64) for x in (st.mean, st.sigma, st.p_sigma, st.p_c, st.C, st.B, st.D)
    )
    cs, cc, c1, cmu, mueff, chin = s.c_sigma, s.c_c, s.c_1, s.c_mu, s.mu_eff, s.chi_n
    counteval = (int(st.generation) + 1) * lam
    arx = np.asarray(pop, np.float64)
    arindex = np.argsort(-np.asarray(fit, np.float64))  # maximise
    xold = mean
    xmean = w @ arx[arindex[:mu]]
    invsqrt_c = B @ np.diag(1 / D) @ B.T
    ps = (1 - cs) * ps + np.sqrt(cs * (2 - cs) * mueff) * invsqrt_c @ (xmean - xold) / sigma
    hsig = np.linalg.norm(ps) / np.sqrt(1 - (1 - cs) ** (2 * counteval / lam)) / chin < 1.4 + 2 / (
        n + 1
    )
    pc = (1 - cc) * pc + hsig * np.sqrt(cc * (2 - cc) * mueff) * (xmean - xold) / sigma
    artmp = (arx[arindex[:mu]] - xold) / sigma
    C = (
        (1 - c1 - cmu) * C
        + c1 * (np.outer(pc, pc) + (1 - hsig) * cc * (2 - cc) * C)
        + cmu * artmp.T @ np.diag(w) @ artmp
    )
    sigma = sigma * np.exp((cs / s.d_sigma) * (np.linalg.norm(ps) / chin - 1))
    return dict(mean=xmean, sigma=sigma, p_sigma=ps, p_c=pc, C=C)


def assert_state_close(new, ref):
    chex.assert_trees_all_close({k: getattr(new, k) for k in ref}, ref, rtol=2e-4, atol=1e-6)


class PureCMAESReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_cma_tell_matches_purecmaes_and_eigen_refresh_is_lazy(self):
        s = CMAES(5, population_size=8, sigma_init=0.7, eigen_interval=3)
        tell = self.variant(unjitted(s, "tell"))
        st = s.init(jax.random.key(0), jnp.full(5, 2.0))
        history = []
        for g in range(5):
            pop = s.ask(jax.random.fold_in(jax.random.key(1), g), st)
            fit = -rosenbrock(pop)
            new = tell(st, pop, fit)
            assert_state_close(new, purecmaes_tell(s, st, pop, fit))
            history.append(new)
            st = new
        eye = np.eye(5, dtype=np.float32)
        # B and D only change on generations that are multiples of eigen_interval
        chex.assert_trees_all_equal(history[0].B, history[1].B, eye)
        assert not np.allclose(history[2].B, eye)
        chex.assert_trees_all_equal(history[3].B, history[2].B)
        chex.assert_trees_all_equal(history[4].D, history[2].D)
        b, d, c = (np.asarray(x, np.float64) for x in (history[2].B, history[2].D, history[2].C))
        chex.assert_trees_all_close(b @ b.T, eye, atol=1e-5)
        chex.assert_trees_all_close(b @ np.diag(d**2) @ b.T, c, rtol=1e-4, atol=1e-6)
        chex.assert_trees_all_close(np.sort(d**2), np.linalg.eigvalsh(c), rtol=1e-4)

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(False, True)
    def test_sep_cma_tell_matches_purecmaes_with_diagonal_covariance(self, all_nonfinite):
        """With C diagonal, the full update's diagonal equals sep-CMA-ES's with the same rates; a
        generation with no finite fitness leaves the distribution as it was."""
        sep = SepCMAES(5, population_size=8, sigma_init=0.7)
        full = CMAES(5, population_size=8, sigma_init=0.7, c_1=sep.c_1, c_mu=sep.c_mu)
        tell = self.variant(unjitted(sep, "tell"))
        st = sep.init(jax.random.key(0), jnp.full(5, 2.0))
        pop = sep.ask(jax.random.key(1), st)
        fit = jnp.full(8, jnp.nan) if all_nonfinite else -rosenbrock(pop)
        new = tell(st, pop, fit)
        if all_nonfinite:
            fields = ("mean", "sigma", "p_sigma", "p_c", "C")
            chex.assert_trees_all_equal(*({k: getattr(x, k) for k in fields} for x in (new, st)))
            return
        ref = purecmaes_tell(full, full.init(jax.random.key(0), jnp.full(5, 2.0)), pop, fit)
        ref["C"] = np.diag(ref["C"])
        assert_state_close(new, ref)


# ---------------------------------------------------------------------------------------------
# evaluations to reach f < 1e-8 against pycma (CMA_active=False, same lambda and sigma_0)

TARGET = 1e-8
SEEDS = 5


def ellipsoid(x):
    d = x.shape[-1]
    return jnp.sum(1e6 ** (jnp.arange(d) / (d - 1)) * x**2, axis=-1)


@functools.cache
def _chunk_runner(num_dims, cost, chunk):
    s = CMAES(num_dims, sigma_init=0.5)

    @jax.jit
    def run(states, keys, start):
        def gen(st, g):
            pop = jax.vmap(s.ask)(jax.vmap(jax.random.fold_in, (0, None))(keys, g), st)
            fit = -cost(pop)
            return jax.vmap(s.tell)(st, pop, fit), -jnp.max(fit, axis=-1)

        return jax.lax.scan(gen, states, start + jnp.arange(chunk))

    return s, run


def evals_ours(num_dims, cost, x0, max_generations=4000, chunk=200):
    """Evaluations until the best of a generation is < TARGET, for SEEDS runs vmapped together."""
    s, run = _chunk_runner(num_dims, cost, chunk)
    keys = jax.random.split(jax.random.key(42), SEEDS)
    states = jax.vmap(s.init)(keys, jnp.full((SEEDS, num_dims), x0))
    hit = np.full(SEEDS, np.inf)
    for start in range(0, max_generations, chunk):
        states, best = run(states, keys, start)
        best = np.asarray(best)  # [chunk, SEEDS]
        for i in range(SEEDS):
            reached = np.nonzero(best[:, i] < TARGET)[0]
            if np.isinf(hit[i]) and reached.size:
                hit[i] = (start + reached[0] + 1) * s.population_size
        if np.all(np.isfinite(hit)):
            break
    return hit


def evals_pycma(num_dims, cost_np, x0, max_generations=4000):
    lam = CMAES(num_dims).population_size
    out = []
    for seed in range(1, SEEDS + 1):
        opts = {"popsize": lam, "seed": seed, "CMA_active": False, "ftarget": TARGET,
                "verbose": -9, "maxiter": max_generations, "tolfun": 0, "tolx": 0,
                "tolfunhist": 0, "tolflatfitness": 10**6, "tolstagnation": 10**6}  # fmt: skip
        es = cma.CMAEvolutionStrategy([x0] * num_dims, 0.5, opts)
        while not es.stop():
            xs = es.ask()
            es.tell(xs, [cost_np(np.asarray(x)) for x in xs])
        out.append(es.countevals if es.best.f < TARGET else np.inf)
    return np.asarray(out, float)


def _np(cost):
    return lambda x: float(cost(jnp.asarray(x[None], jnp.float32))[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "problem, num_dims, x0",
    [("sphere", 10, 1.0), ("sphere", 40, 1.0), ("ellipsoid", 10, 1.0), ("rosenbrock", 10, 0.0)],
)
def test_evaluations_to_target_within_1_3x_of_pycma(problem, num_dims, x0):
    cost = {"sphere": sphere, "ellipsoid": ellipsoid, "rosenbrock": rosenbrock}[problem]
    ours = np.median(evals_ours(num_dims, cost, x0))
    theirs = np.median(evals_pycma(num_dims, _np(jax.jit(cost)), x0))
    assert np.isfinite(ours) and np.isfinite(theirs), (ours, theirs)
    ratio = ours / theirs
    assert 1 / 1.3 <= ratio <= 1.3, (problem, num_dims, ours, theirs, ratio)
