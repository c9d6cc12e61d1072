"""The evolution step: PopulationEvaluator (rows -> rewards -> fitness) and essa_generation, on no
mesh, one device and 8 virtual devices (the 2-process run is tests/distributed/test_determinism)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pop_helpers import left_padded, randn, setup

from essa_jax.es import get_strategy
from essa_jax.mesh import make_mesh
from essa_jax.population import (
    PopulationEvaluator,
    PromptBatch,
    essa_generation,
    population_generate,
    text_reward,
)


def decode(ids):
    return " ".join(str(i) for i in ids)


def reward_fn(prompts, completions, answer):
    """Deterministic, token-dependent reward: does the completion contain the answer token?"""
    assert len(prompts) == len(completions) == len(answer)
    pairs = zip(completions, answer, strict=True)
    return [float(a in c.split()) + 0.01 * len(c.split()) for c, a in pairs]


def _batch(config, b=3, seed=1):
    tokens, mask = left_padded(seed, (b, 5), config.vocab_size)
    return PromptBatch(tokens, mask, [f"p{j}" for j in range(b)], {"answer": ["10", "11", "12"]})


def _evaluator(mesh, greedy=True, score=None):
    config, params, _, basis, layout = setup("llama")
    ev = PopulationEvaluator(
        params,
        config,
        layout,
        mesh=mesh,
        score=score or text_reward(reward_fn, decode, config.eos_token_ids),
        max_new_tokens=6,
        greedy=greedy,
        temperature=1.0,
    )
    return ev, config, params, basis, layout


def _evaluate(mesh, greedy=True, num_members=5, seed=0):
    ev, config, _, basis, layout = _evaluator(mesh, greedy)
    genomes = 0.5 * randn(seed, (num_members, layout.size))
    return ev(basis, genomes, _batch(config), jax.random.key(seed))


def _assert_same(a, b):
    assert a.fitness.dtype == b.fitness.dtype == np.float32
    np.testing.assert_array_equal(a.fitness, b.fitness)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    np.testing.assert_array_equal(a.finished, b.finished)
    assert a.metrics == b.metrics


def test_fitness_is_mean_reward_of_each_members_completions():
    """Against the engine's own rows decoded and rewarded by hand."""
    ev, config, params, basis, layout = _evaluator(None)
    genomes = 0.5 * randn(0, (5, layout.size))
    batch = _batch(config)
    res = ev(basis, genomes, batch, jax.random.key(0))
    gen = population_generate(
        params, config, basis, layout, genomes, batch.tokens, batch.mask, jax.random.key(0),
        max_new_tokens=6, greedy=True,
    )  # fmt: skip
    tokens, lengths = np.asarray(gen.tokens), np.asarray(gen.lengths)
    eos = set(config.eos_token_ids)
    for p in range(5):
        texts = []
        for b in range(3):
            ids = tokens[p, b, : lengths[p, b]].tolist()
            texts.append(decode(ids[:-1] if ids and ids[-1] in eos else ids))
        want = reward_fn(batch.prompts, texts, batch.fields["answer"])
        np.testing.assert_allclose(res.rewards[p], want, atol=1e-6)
        np.testing.assert_allclose(res.fitness[p], np.mean(want), atol=1e-6)
    np.testing.assert_array_equal(res.lengths, lengths)
    assert res.metrics["completion_len"] == pytest.approx(lengths.mean())
    assert res.metrics["tokens"] == lengths.sum()
    assert len(set(res.fitness.tolist())) > 1  # members differ: the test can tell them apart


def test_one_device_mesh_equals_no_mesh():
    _assert_same(_evaluate(make_mesh(pop=1, devices=jax.devices()[:1])), _evaluate(None))


def test_8_devices_equal_one_with_padding():
    """P=5 members on 4 pop shards and B=3 prompts on 2 data shards: both padded, then dropped."""
    _assert_same(_evaluate(make_mesh(pop=4, data=2)), _evaluate(None))


@pytest.mark.slow
@pytest.mark.parametrize("pop, data", [(2, 1), (8, 1), (1, 8)])
@pytest.mark.parametrize("greedy", [True, False])
def test_sharded_equals_single_device_all_meshes(pop, data, greedy):
    """Fitness does not depend on the layout (sampling included: keys follow the member index)."""
    _assert_same(_evaluate(make_mesh(pop=pop, data=data), greedy), _evaluate(None, greedy))


def test_per_candidate_prompts_reach_the_reward_member_major():
    ev, config, _, basis, layout = _evaluator(make_mesh(pop=2, data=2))
    tokens, mask = left_padded(5, (3, 2, 5), config.vocab_size)
    seen = {}

    def spy(rows):
        seen["texts"], seen["answer"] = rows.texts, rows.fields["answer"]
        seen["rows"] = list(zip(rows.members.tolist(), rows.prompts.tolist(), strict=True))
        return [float(m) + 0.1 * q for m, q in seen["rows"]]

    ev.score = spy
    batch = PromptBatch(
        tokens,
        mask,
        [["a", "b"], ["c", "d"], ["e", "f"]],
        {"answer": [["1", "2"], ["3", "4"], ["5", "6"]]},
    )
    res = ev(basis, 0.5 * randn(4, (3, layout.size)), batch, jax.random.key(0))
    assert seen["rows"] == [(m, q) for m in range(3) for q in range(2)]
    assert seen["texts"] == ["a", "b", "c", "d", "e", "f"]
    assert seen["answer"] == ["1", "2", "3", "4", "5", "6"]
    np.testing.assert_allclose(res.fitness, [0.05, 1.05, 2.05], atol=1e-6)
    with pytest.raises(ValueError, match="P=3, but the population has P=2"):
        ev(basis, 0.5 * randn(4, (2, layout.size)), batch, jax.random.key(0))


def test_score_must_return_one_reward_per_row():
    ev, config, _, basis, layout = _evaluator(None, score=lambda rows: [0.0])
    with pytest.raises(ValueError, match="one per completion"):
        ev(basis, np.zeros((2, layout.size)), _batch(config), jax.random.key(0))


def _run_generations(mesh, gens=3):
    ev, config, _, basis, layout = _evaluator(mesh)
    strategy = get_strategy("cma_es", num_dims=layout.size, population_size=6, sigma_init=0.5)
    state = strategy.init(jax.random.key(0), jnp.zeros(layout.size))
    batch, history = _batch(config), []
    for g in range(gens):
        state, res = essa_generation(
            strategy, state, jax.random.key(g), lambda z, k: ev(basis, z, batch, k)
        )
        history.append(res.fitness)
    return state, np.stack(history)


def test_essa_generation_moves_and_is_layout_independent():
    state1, fit1 = _run_generations(None)
    state8, fit8 = _run_generations(make_mesh(pop=4, data=2))
    assert float(jnp.linalg.norm(state1.mean)) > 0.05  # the search moved
    assert np.ptp(fit1) > 0
    np.testing.assert_array_equal(fit1, fit8)
    np.testing.assert_array_equal(np.asarray(state1.mean), np.asarray(state8.mean))
    np.testing.assert_array_equal(np.asarray(state1.C), np.asarray(state8.C))


def test_essa_generation_skip_flat_keeps_the_state():
    ev, config, _, basis, layout = _evaluator(None, score=lambda rows: [1.0] * len(rows.texts))
    strategy = get_strategy("cma_es", num_dims=layout.size, population_size=4, sigma_init=0.5)
    state = strategy.init(jax.random.key(0), jnp.zeros(layout.size))
    batch = _batch(config)
    kept, res = essa_generation(
        strategy, state, jax.random.key(1), lambda z, k: ev(basis, z, batch, k), skip_flat=True
    )
    assert res.metrics["skipped_tell"] == 1.0 and kept is state
    moved, res = essa_generation(
        strategy, state, jax.random.key(1), lambda z, k: ev(basis, z, batch, k)
    )
    assert res.metrics["skipped_tell"] == 0.0 and int(moved.generation) == 1
