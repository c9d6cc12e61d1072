"""Every registered strategy through the same tests: optimisation, sign, purity, checkpoints, edges.

Strategies are built once per (name, shape) so the jitted ask / tell compile once and are reused.
The bookkeeping all built-in strategies share (es.base.BaseStrategy) is checked against a NumPy
reference, with and without jit (`chex.variants`).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from absl.testing import parameterized
from es_problems import make_rotated_ellipsoid, rosenbrock, sphere, unjitted
from scipy.stats import rankdata

from essa_jax.es import STRATEGIES, BaseStrategy, OpenAIES, get_strategy

NAMES = sorted(STRATEGIES)
KWARGS = {
    "cma_es": dict(sigma_init=0.5),
    "sep_cma_es": dict(sigma_init=0.5),
    "openai_es": dict(sigma_init=0.05, learning_rate=0.02),
}
GENERATIONS = 300


@functools.cache
def strategy(name, num_dims, population_size=None):
    return get_strategy(name, num_dims=num_dims, population_size=population_size, **KWARGS[name])


def run_loop(s, cost, mean, key, generations):
    """Plain Python loop over the public (jitted) ask / tell; maximises -cost."""
    cost = jax.jit(cost)
    state = s.init(key, mean)
    for g in range(generations):
        pop = s.ask(jax.random.fold_in(key, g), state)
        state = s.tell(state, pop, -cost(pop))
    return state


def scan_run(s, cost, state, key, generations):
    def gen(state, g):
        pop = s.ask(jax.random.fold_in(key, g), state)
        return s.tell(state, pop, -cost(pop)), state.mean

    return jax.lax.scan(gen, state, jnp.arange(generations))


def assert_improved(name, problem, initial, final):
    # Rosenbrock's bent valley takes hundreds of generations to follow; asking for a clear drop
    # (rather than convergence) keeps the first-order OpenAI-ES to the same test.
    factor = 0.75 if problem == "rosenbrock" else 1e-2
    assert np.isfinite(final) and final < factor * initial, (name, problem, initial, final)
    if name != "openai_es" and problem == "sphere":
        assert final < 1e-8 * initial, (name, problem, initial, final)


@pytest.mark.parametrize("name", NAMES)
def test_improves_in_python_loop(name):
    num_dims = 3  # the scan test below covers D = 10 (each new shape costs a compile)
    s = strategy(name, num_dims)
    problems = {
        "sphere": (sphere, 1.0),
        "rotated_ellipsoid": (make_rotated_ellipsoid(num_dims), 1.0),
        "rosenbrock": (rosenbrock, 0.0),
    }
    for problem, (cost, x0) in problems.items():
        mean = jnp.full(num_dims, x0, jnp.float32)
        state = run_loop(s, cost, mean, jax.random.key(0), GENERATIONS)
        assert_improved(name, problem, float(cost(mean)), float(cost(state.mean)))
        assert int(state.generation) == GENERATIONS
        assert np.isfinite(float(state.best_fitness))
        assert float(state.best_fitness) >= float(state.generation_best_fitness)


@pytest.mark.parametrize("name", NAMES)
def test_improves_inside_scan_vmapped_over_problems(name):
    """One compiled lax.scan of GENERATIONS generations, vmapped over the three problems."""
    num_dims = 10
    s = strategy(name, num_dims)
    ellipsoid = make_rotated_ellipsoid(num_dims)
    costs = [sphere, ellipsoid, rosenbrock]

    def cost(pid, x):
        return jax.lax.switch(pid, costs, x)

    @jax.jit
    def run(pids, means, key):
        def one(pid, mean):
            state = s.init(key, mean)
            state, _ = scan_run(s, functools.partial(cost, pid), state, key, GENERATIONS)
            return cost(pid, mean), cost(pid, state.mean)

        return jax.vmap(one)(pids, means)

    means = jnp.asarray([[1.0] * num_dims, [1.0] * num_dims, [0.0] * num_dims])
    initial, final = run(jnp.arange(3), means, jax.random.key(1))
    for i, problem in enumerate(["sphere", "rotated_ellipsoid", "rosenbrock"]):
        assert_improved(name, problem, float(initial[i]), float(final[i]))


@pytest.mark.parametrize("name", NAMES)
def test_sign_convention_fitness_is_maximised(name):
    """Maximising -||x - t||^2 pulls the mean to t; maximising +||x - t||^2 pushes it away."""
    s = strategy(name, 3)
    target = jnp.asarray([2.0, -1.0, 0.5])
    mean = jnp.zeros(3)
    toward = run_loop(s, lambda x: jnp.sum((x - target) ** 2, -1), mean, jax.random.key(2), 100)
    away = run_loop(s, lambda x: -jnp.sum((x - target) ** 2, -1), mean, jax.random.key(2), 100)
    d0 = float(jnp.linalg.norm(mean - target))
    assert float(jnp.linalg.norm(toward.mean - target)) < 0.5 * d0
    assert float(jnp.linalg.norm(away.mean - target)) > 1.5 * d0


@pytest.mark.parametrize("name", NAMES)
def test_scan_matches_python_loop(name):
    s = strategy(name, 3)
    mean, key = jnp.full(3, 1.0), jax.random.key(3)
    looped = run_loop(s, sphere, mean, key, 20)
    scanned, _ = jax.jit(lambda st: scan_run(s, sphere, st, key, 20))(s.init(key, mean))
    chex.assert_trees_all_close(looped, scanned, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_orbax_round_trip(name, tmp_path):
    s = strategy(name, 3)
    mean, key = jnp.full(3, 1.0), jax.random.key(4)
    a = run_loop(s, sphere, mean, key, 5)
    b = run_loop(s, sphere, mean, key, 5)
    chex.assert_trees_all_equal(a, b)
    c = run_loop(s, sphere, mean, jax.random.key(5), 5)
    assert not np.array_equal(np.asarray(a.mean), np.asarray(c.mean))  # the key matters

    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "state", a)
    ckpt.wait_until_finished()
    restored = ckpt.restore(tmp_path / "state", a)
    assert type(restored) is type(a)

    def cont(state):
        for g in range(5):
            pop = s.ask(jax.random.fold_in(jax.random.key(6), g), state)
            state = s.tell(state, pop, -sphere(pop))
        return state

    x, y = cont(a), cont(restored)
    chex.assert_trees_all_equal(x, y)
    assert int(y.generation) == 10


@pytest.mark.parametrize("name", NAMES)
def test_nonfinite_fitness_ranks_last_and_is_counted(name):
    s = strategy(name, 3)
    state = run_loop(s, sphere, jnp.full(3, 1.0), jax.random.key(7), 3)
    pop = s.ask(jax.random.key(8), state)
    fit = -sphere(pop)
    best = int(jnp.argmax(fit))
    bad = fit.at[best].set(jnp.nan).at[(best + 1) % s.population_size].set(jnp.inf)
    # the same candidates given a finite fitness below every other one must give the same update
    worst = jnp.min(fit) - 1.0  # both tie below everything, as the two non-finite values do
    ref = fit.at[best].set(worst).at[(best + 1) % s.population_size].set(worst)
    new, expected = s.tell(state, pop, bad), s.tell(state, pop, ref)
    assert int(new.num_nonfinite) == 2 and int(expected.num_nonfinite) == 0
    chex.assert_trees_all_close((new.mean, new.sigma), (expected.mean, expected.sigma), rtol=1e-6)
    chex.assert_tree_all_finite(new)
    # the best-so-far ignores the non-finite candidates
    finite_best = jnp.max(jnp.where(jnp.isfinite(bad), bad, -jnp.inf))
    assert float(new.generation_best_fitness) == float(finite_best)


@pytest.mark.parametrize("name", NAMES)
def test_all_nonfinite_generation_skips_the_update(name):
    s = strategy(name, 3)
    state = run_loop(s, sphere, jnp.full(3, 1.0), jax.random.key(9), 3)
    pop = s.ask(jax.random.key(10), state)
    fit = jnp.where(jnp.arange(s.population_size) % 2 == 0, jnp.nan, -jnp.inf)
    new = s.tell(state, pop, fit)
    assert int(new.num_nonfinite) == s.population_size
    assert int(new.generation) == int(state.generation) + 1
    # only the counter, the count and this generation's best move; the rest (the distribution, the
    # best-so-far, update_norm) is bit-identical
    expected = state.replace(
        generation=state.generation + 1,
        num_nonfinite=jnp.int32(s.population_size),
        generation_best_fitness=jnp.asarray(-jnp.inf, state.generation_best_fitness.dtype),
    )
    chex.assert_trees_all_equal(new, expected)
    assert float(new.generation_best_fitness) == -np.inf
    assert np.isfinite(float(new.best_fitness))


@pytest.mark.parametrize("name", NAMES)
def test_population_of_two_and_dimension_one(name):
    for num_dims, pop_size, x0 in [(3, 2, 1.0), (1, None, 3.0)]:
        s = strategy(name, num_dims, pop_size)
        mean = jnp.full(num_dims, x0)
        state = run_loop(s, sphere, mean, jax.random.key(11), 150)
        assert s.ask(jax.random.key(0), state).shape == (s.population_size, num_dims)
        chex.assert_tree_all_finite(state)
        assert float(sphere(state.mean)) < 0.1 * float(sphere(mean)), (num_dims, pop_size)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_independent_runs(name):
    s = strategy(name, 3)
    keys = jax.random.split(jax.random.key(12), 4)
    means = jnp.stack([jnp.full(3, v) for v in (1.0, 2.0, -1.0, 0.5)])

    def step(state, key):
        pop = s.ask(key, state)
        return s.tell(state, pop, -sphere(pop))

    states = jax.vmap(s.init)(keys, means)
    vstep = jax.jit(jax.vmap(step))
    for g in range(5):
        states = vstep(states, jax.vmap(lambda k, g=g: jax.random.fold_in(k, g))(keys))
    for i in range(4):
        single = s.init(keys[i], means[i])
        for g in range(5):
            single = step(single, jax.random.fold_in(keys[i], g))
        # vmapped eigh / matmuls round differently from the unbatched ones: tolerance, not equality
        batched = (states.mean[i], states.sigma[i])
        chex.assert_trees_all_close(batched, (single.mean, single.sigma), rtol=1e-3, atol=1e-5)
    assert len({tuple(np.asarray(m).round(6)) for m in states.mean}) == 4


@pytest.mark.parametrize("name", NAMES)
def test_bad_arguments_raise_clear_errors(name):
    cls = STRATEGIES[name]
    with pytest.raises(ValueError, match="num_dims"):
        cls(num_dims=0)
    with pytest.raises(ValueError, match="population_size"):
        cls(num_dims=3, population_size=1)
    with pytest.raises(ValueError, match="sigma_init"):
        cls(num_dims=3, sigma_init=-1.0)
    s = strategy(name, 3)
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        s.init(jax.random.key(0), jnp.zeros(4))
    state = s.init(jax.random.key(0), jnp.zeros(3))
    pop = s.ask(jax.random.key(0), state)
    with pytest.raises(ValueError, match="fitness must have shape"):
        s.tell(state, pop, jnp.zeros(s.population_size + 1))


def test_registry_lists_valid_names():
    with pytest.raises(ValueError, match="cma_es.*openai_es.*sep_cma_es"):
        get_strategy("cmaes", num_dims=3)
    assert {type(get_strategy(n, num_dims=2)) for n in NAMES} == set(STRATEGIES.values())


def test_strategy_specific_validation():
    from essa_jax.es import CMAES, OpenAIES

    with pytest.raises(ValueError, match="even"):
        OpenAIES(num_dims=3, population_size=5)
    assert OpenAIES(num_dims=3, population_size=5, antithetic=False).population_size == 5
    with pytest.raises(ValueError, match="fitness shaping"):
        OpenAIES(num_dims=3, fitness_shaping="ranks_please")
    with pytest.raises(ValueError, match="num_parents"):
        CMAES(num_dims=3, population_size=4, num_parents=5)
    with pytest.raises(ValueError, match="c_1 \\+ c_mu"):
        CMAES(num_dims=3, c_1=0.6, c_mu=0.6)


def test_openai_es_mirrored_sampling_and_sigma_decay():
    from essa_jax.es import OpenAIES

    s = OpenAIES(num_dims=3, population_size=6, sigma_init=0.1, sigma_decay=0.5, sigma_min=0.03)
    state = s.init(jax.random.key(0), jnp.asarray([1.0, -2.0, 0.5]))
    pop = s.ask(jax.random.key(1), state)
    # antithetic pairs: x_{i + P/2} - m = -(x_i - m)
    np.testing.assert_allclose(pop[3:] - state.mean, -(pop[:3] - state.mean), atol=1e-6)
    sigmas = []
    for g in range(3):
        pop = s.ask(jax.random.key(g), state)
        state = s.tell(state, pop, -sphere(pop))
        sigmas.append(float(state.sigma))
    np.testing.assert_allclose(sigmas, [0.05, 0.03, 0.03], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# the shared bookkeeping (es.base.BaseStrategy) and OpenAI-ES's update against NumPy references,
# with and without jit


def numpy_bookkeeping(state, population, fitness, new_mean):
    """What BaseStrategy.tell must record, computed in NumPy."""
    pop, f = np.asarray(population), np.asarray(fitness)
    finite = np.isfinite(f)
    best_member, best_fitness = np.asarray(state.best_member), np.asarray(state.best_fitness)
    gen_best = np.float32(-np.inf)
    if finite.any():
        i = int(np.argmax(np.where(finite, f, -np.inf)))
        gen_best = f[i]
        if gen_best > best_fitness:
            best_member, best_fitness = pop[i], gen_best
    moved = np.linalg.norm(np.asarray(new_mean) - np.asarray(state.mean))
    return {
        "generation": np.int32(int(state.generation) + 1),
        "best_member": best_member,
        "best_fitness": np.float32(best_fitness),
        "generation_best_fitness": np.float32(gen_best),
        "num_nonfinite": np.int32((~finite).sum()),
        "update_norm": np.float32(moved if finite.any() else state.update_norm),
    }


class BookkeepingTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.parameters(*NAMES)
    def test_tell_bookkeeping_matches_numpy(self, name):
        s = strategy(name, 3)
        assert isinstance(s, BaseStrategy)
        ask, tell = self.variant(unjitted(s, "ask")), self.variant(unjitted(s, "tell"))
        state = s.init(jax.random.key(0), jnp.full(3, 1.0))
        p = s.population_size
        for g, kind in enumerate(["finite", "some_bad", "all_bad", "finite", "worse"]):
            key = jax.random.key(20 + g)
            pop = ask(key, state)
            chex.assert_trees_all_close(pop, s.ask(key, state), rtol=1e-6, atol=1e-6)
            fit = -sphere(pop)
            if kind == "some_bad":  # the best is NaN, another +inf: neither may become the best
                best = int(jnp.argmax(fit))
                fit = fit.at[best].set(jnp.nan).at[(best + 1) % p].set(jnp.inf)
            elif kind == "all_bad":
                fit = jnp.where(jnp.arange(p) % 2 == 0, jnp.nan, -jnp.inf)
            elif kind == "worse":  # finite, below the best so far: the best-so-far stays
                fit = fit - 1e3
            new = tell(state, pop, fit)
            expected = numpy_bookkeeping(state, pop, fit, new.mean)
            got = {k: getattr(new, k) for k in expected}
            chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-7)
            if kind == "all_bad":
                chex.assert_trees_all_equal((new.mean, new.sigma), (state.mean, state.sigma))
            else:
                assert float(jnp.linalg.norm(new.mean - state.mean)) > 0
            # the public (jitted) tell agrees with the variant
            chex.assert_trees_all_close(new, s.tell(state, pop, fit), rtol=1e-5, atol=1e-6)
            state = new
        assert int(state.num_nonfinite) == 0 and int(state.generation) == 5

    @parameterized.parameters(*NAMES)
    def test_metrics_are_the_bookkeeping_plus_the_strategy_own(self, name):
        s = strategy(name, 3)
        state = run_loop(s, make_rotated_ellipsoid(3), jnp.full(3, 1.0), jax.random.key(13), 8)
        m = s.metrics(state)
        common = ["generation", "best_fitness", "generation_best_fitness", "num_nonfinite"]
        common += ["update_norm", "sigma"]
        chex.assert_trees_all_equal(
            {k: m[k] for k in common}, {k: getattr(state, k) for k in common}
        )
        if name == "openai_es":
            assert set(m) == set(common)
            return
        if name == "cma_es":  # eigen_interval is 1 at D = 3: B, D are those of the current C
            assert s.eigen_interval == 1
            eig = np.linalg.eigvalsh(np.asarray(state.C, np.float64))
        else:
            eig = np.asarray(state.C, np.float64)
        chex.assert_trees_all_close(m["axis_ratio"], np.sqrt(eig.max() / eig.min()), rtol=1e-4)


class OpenAIESReferenceTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_tell_is_an_sgd_step_along_the_centred_rank_gradient(self):
        lr, sigma, p = 0.1, 0.2, 8
        s = OpenAIES(
            3, population_size=p, sigma_init=sigma, sigma_decay=0.9, optimizer=optax.sgd(lr)
        )
        ask, tell = self.variant(unjitted(s, "ask")), self.variant(unjitted(s, "tell"))
        state = s.init(jax.random.key(0), jnp.asarray([1.0, -0.5, 2.0]))
        for g in range(3):
            pop = ask(jax.random.key(g), state)
            fit = np.asarray(-sphere(pop), np.float64)
            new = tell(state, pop, jnp.asarray(fit, jnp.float32))
            # Salimans et al. 2017, Alg. 1 with centred ranks (Sec. 2.2), one SGD ascent step
            m, sg = np.asarray(state.mean, np.float64), float(state.sigma)
            eps = (np.asarray(pop, np.float64) - m) / sg
            shaped = (rankdata(fit) - 1) / (p - 1) - 0.5
            expected_mean = m + lr * shaped @ eps / (p * sg)
            chex.assert_trees_all_close(
                (new.mean, new.sigma), (expected_mean, sg * 0.9), rtol=1e-5, atol=1e-6
            )
            state = new
