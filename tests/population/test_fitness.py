"""Fitness evaluation: rewards -> fitness, prompt sampling, and sharded == single-device results."""

import jax
import numpy as np
import pytest
from pop_helpers import left_padded, randn, setup

from essa_jax.population import (
    evaluate_genome,
    evaluate_population,
    make_population_mesh,
    sample_prompt_indices,
)


def decode(ids):
    return " ".join(str(i) for i in ids)


def reward_fn(prompts, completions, answer):
    """Deterministic, token-dependent reward: does the completion contain the answer token?"""
    assert len(prompts) == len(completions) == len(answer)
    pairs = zip(completions, answer, strict=True)
    return [float(a in c.split()) + 0.01 * len(c.split()) for c, a in pairs]


def _evaluate(mesh, greedy=True, num_members=5, b=3, seed=0):
    config, params, _, basis, layout = setup("llama")
    genomes = 0.5 * randn(seed, (num_members, layout.size))
    tokens, mask = left_padded(seed + 1, (b, 5), config.vocab_size)
    answers = [str(a) for a in range(10, 10 + b)]
    return evaluate_population(
        params,
        config,
        basis,
        layout,
        genomes,
        tokens,
        mask,
        jax.random.key(seed),
        prompts=[f"p{j}" for j in range(b)],
        task_fields={"answer": answers},
        reward_fn=reward_fn,
        decode=decode,
        max_new_tokens=6,
        greedy=greedy,
        temperature=1.0,
        mesh=mesh,
    )


def _assert_same(a, b):
    np.testing.assert_array_equal(a.generation.tokens, b.generation.tokens)
    np.testing.assert_array_equal(a.generation.lengths, b.generation.lengths)
    np.testing.assert_allclose(a.generation.logprobs, b.generation.logprobs, atol=1e-4)
    np.testing.assert_allclose(a.fitness, b.fitness, atol=1e-6)
    assert a.completions == b.completions


def test_fitness_is_mean_reward_per_member():
    res = _evaluate(None)
    assert res.fitness.shape == (5,) and res.rewards.shape == (5, 3)
    for p in range(5):
        want = reward_fn(["p0", "p1", "p2"], res.completions[p], ["10", "11", "12"])
        np.testing.assert_allclose(res.rewards[p], want, atol=1e-6)
        np.testing.assert_allclose(res.fitness[p], np.mean(want), atol=1e-6)
        for b in range(3):
            n = res.generation.lengths[p, b]
            assert res.completions[p][b] == decode(res.generation.tokens[p, b, :n].tolist())
    assert res.metrics["completion_len"] == pytest.approx(res.generation.lengths.mean())
    assert len(set(map(tuple, res.generation.tokens[:, 0].tolist()))) > 1  # members differ


def test_sharded_8_devices_equals_single_device_with_padding():
    """P=5 members on 4 pop shards and B=3 prompts on 2 data shards: both padded, then dropped."""
    _assert_same(_evaluate(make_population_mesh(4, 2)), _evaluate(None))


@pytest.mark.slow
@pytest.mark.parametrize("pop, data", [(2, 1), (4, 1), (8, 1), (1, 8)])
@pytest.mark.parametrize("greedy", [True, False])
def test_sharded_equals_single_device_all_meshes(pop, data, greedy):
    """Tokens, log-probs and fitness do not depend on the device count (sampling included)."""
    _assert_same(_evaluate(make_population_mesh(pop, data), greedy), _evaluate(None, greedy))


def test_per_member_prompts_and_fields():
    config, params, _, basis, layout = setup("llama")
    num_members, b = 2, 2
    genomes = 0.5 * randn(4, (num_members, layout.size))
    tokens, mask = left_padded(5, (num_members, b, 5), config.vocab_size)
    answers = [["1", "2"], ["3", "4"]]
    seen = {}

    def spy(prompts, completions, answer):
        seen["prompts"], seen["answer"] = prompts, answer
        return [0.0] * len(prompts)

    evaluate_population(
        params,
        config,
        basis,
        layout,
        genomes,
        tokens,
        mask,
        jax.random.key(0),
        prompts=[["a", "b"], ["c", "d"]],
        task_fields={"answer": answers},
        reward_fn=spy,
        decode=decode,
        max_new_tokens=2,
        greedy=True,
    )
    assert seen == {"prompts": ["a", "b", "c", "d"], "answer": ["1", "2", "3", "4"]}
    with pytest.raises(ValueError, match="answer must have B=2"):
        evaluate_population(
            params,
            config,
            basis,
            layout,
            genomes,
            tokens,
            mask,
            jax.random.key(0),
            prompts=["a", "b"],
            task_fields={"answer": ["1", "2", "3"]},
            reward_fn=spy,
            decode=decode,
            max_new_tokens=2,
            greedy=True,
        )


def test_evaluate_genome_matches_population_member():
    """Held-out helper (P=1, prompts over a (1, 8) mesh) == that member of a population."""
    pop = _evaluate(None)  # same shapes as the other tests: the compiled program is reused
    config, params, _, basis, layout = setup("llama")
    genomes = 0.5 * randn(0, (5, layout.size))
    tokens, mask = left_padded(1, (3, 5), config.vocab_size)
    one = evaluate_genome(
        params,
        config,
        basis,
        layout,
        genomes[3],
        tokens,
        mask,
        jax.random.key(0),
        mesh=make_population_mesh(4, 2),
        prompts=["p0", "p1", "p2"],
        task_fields={"answer": ["10", "11", "12"]},
        reward_fn=reward_fn,
        decode=decode,
        max_new_tokens=6,
        greedy=True,
    )
    assert one.fitness.shape == (1,)
    np.testing.assert_array_equal(one.generation.tokens[0], pop.generation.tokens[3])
    np.testing.assert_allclose(one.fitness[0], pop.fitness[3], atol=1e-6)


def test_sample_prompt_indices():
    key = jax.random.key(3)
    shared = sample_prompt_indices(key, 50, 4, 8, per_member=False)
    own = sample_prompt_indices(key, 50, 4, 8, per_member=True)
    assert shared.shape == own.shape == (4, 8)
    assert (shared == shared[0]).all() and len(set(shared[0].tolist())) == 8
    assert len({tuple(r) for r in own.tolist()}) == 4
    assert all(len(set(r)) == 8 for r in own.tolist())  # without replacement
    assert own.min() >= 0 and own.max() < 50
    # Member i's batch depends only on (key, i), not on the population size.
    np.testing.assert_array_equal(sample_prompt_indices(key, 50, 2, 8, per_member=True), own[:2])
    with pytest.raises(ValueError, match="prompts_per_member"):
        sample_prompt_indices(key, 50, 4, 0, per_member=True)
