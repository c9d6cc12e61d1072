"""Row chunks (`essa.rows_per_chunk`): a device generating its rows in chunks gives the unchunked
tokens and fitness exactly (log-probs to float rounding), greedy and sampled, on no mesh and on a
pop=4 x data=2 mesh; 0 picks the chunk from the (overridable) device memory; the chunked program
lowers from abstract inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pop_helpers import left_padded, randn, setup

from essa_jax.memory import generation_bytes_per_row, tree_bytes
from essa_jax.mesh import make_mesh
from essa_jax.population import PopulationEvaluator, PromptBatch, text_reward

P, B, T, N = 5, 3, 5, 6


def decode(ids):
    return " ".join(str(i) for i in ids)


def reward_fn(prompts, completions, answer):
    return [
        float(a in c.split()) + 0.01 * len(c.split())
        for c, a in zip(completions, answer, strict=True)
    ]


def _setup():
    config, params, _, basis, layout = setup("llama")
    tokens, mask = left_padded(1, (B, T), config.vocab_size)
    batch = PromptBatch(tokens, mask, [f"p{j}" for j in range(B)], {"answer": ["10", "11", "12"]})
    genomes = 0.5 * randn(0, (P, layout.size))
    return config, params, basis, layout, batch, genomes


def _evaluator(config, params, layout, mesh, greedy, **kw):
    return PopulationEvaluator(
        params,
        config,
        layout,
        mesh=mesh,
        score=text_reward(reward_fn, decode, config.eos_token_ids),
        max_new_tokens=N,
        greedy=greedy,
        temperature=1.0,
        **kw,
    )


def _assert_same(ev_a, ev_b, args):
    a, b = ev_a(*args), ev_b(*args)
    np.testing.assert_array_equal(a.fitness, b.fitness)
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    ga, gb = ev_a.generate(*args), ev_b.generate(*args)
    for name in ("tokens", "mask", "lengths", "finished"):
        np.testing.assert_array_equal(np.asarray(getattr(ga, name)), np.asarray(getattr(gb, name)))
    # Log-probs to float rounding: XLA's CPU kernels round a batch of 4 rows unlike one of 15.
    np.testing.assert_allclose(np.asarray(ga.logprobs), np.asarray(gb.logprobs), rtol=0, atol=2e-6)


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize(
    "mesh_shape,chunks",
    # No mesh: 15 rows, chunks of 4 (padded to 16) and 5 (divides). pop=4 x data=2: each device
    # has 2 members x 2 prompts = 4 rows (padded from 5 x 3), chunks of 3 (padded) and 2.
    [(None, (4, 5)), ((4, 2), (3, 2))],
)
def test_chunked_equals_unchunked(mesh_shape, chunks, greedy):
    config, params, basis, layout, batch, genomes = _setup()
    mesh = None if mesh_shape is None else make_mesh(pop=mesh_shape[0], data=mesh_shape[1])
    args = (basis, genomes, batch, jax.random.key(3))
    whole = _evaluator(config, params, layout, mesh, greedy)
    assert whole.rows_per_chunk_for(basis, genomes, batch) == 0  # CPU: no memory stats
    for chunk in chunks:
        chunked = _evaluator(config, params, layout, mesh, greedy, rows_per_chunk=chunk)
        _assert_same(whole, chunked, args)


def test_zero_chooses_from_the_device_memory():
    """rows_per_chunk=0 with a device memory that fits ~2.5 rows next to the weights: chunks of 2
    (15 rows -> 8 chunks), same fitness; a large memory: all 15 rows at once."""
    config, params, basis, layout, batch, genomes = _setup()
    per_row = generation_bytes_per_row(config, T, N, jnp.float32)
    reserved = tree_bytes(params) + tree_bytes(basis)
    small = int((reserved + 2.5 * per_row) / 0.9)
    ev = _evaluator(config, params, layout, None, False, device_memory_bytes=small)
    assert ev.rows_per_chunk_for(basis, genomes, batch) == 2
    big = _evaluator(config, params, layout, None, False, device_memory_bytes=10**12)
    assert big.rows_per_chunk_for(basis, genomes, batch) == P * B
    _assert_same(
        _evaluator(config, params, layout, None, False),
        ev,
        (basis, genomes, batch, jax.random.key(0)),
    )
    tiny = _evaluator(config, params, layout, None, False, device_memory_bytes=reserved)
    with pytest.raises(ValueError, match="essa.rows_per_chunk"):
        tiny.rows_per_chunk_for(basis, genomes, batch)


def test_rejects_a_negative_chunk():
    config, params, _, layout, _, _ = _setup()
    with pytest.raises(ValueError, match="rows_per_chunk"):
        _evaluator(config, params, layout, None, True, rows_per_chunk=-1)


def test_lowers_from_abstract_inputs_with_the_chosen_chunk():
    """A planner's call: abstract params, basis, genomes, prompts and key on a pop=4 x data=2 mesh,
    a device memory given; the chunked program compiles and needs less temporary memory."""
    config, params, basis, layout, _, _ = _setup()
    sds = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    mesh = make_mesh(pop=4, data=2)
    p, b = 8, 16  # 2 members x 8 prompts = 16 rows per device
    tok = jax.ShapeDtypeStruct((b, T), jnp.int32)
    batch = PromptBatch(tok, tok, [])
    genomes = jax.ShapeDtypeStruct((p, layout.size), jnp.float32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    per_row = generation_bytes_per_row(config, T, N, jnp.float32)
    memory = int((tree_bytes(params) + tree_bytes(basis) + 4.5 * per_row) / 0.9)
    temp = {}
    for name, kw in (("whole", {}), ("chunked", {"device_memory_bytes": memory})):
        ev = _evaluator(config, sds(params), layout, mesh, True, **kw)
        chunk = ev.rows_per_chunk_for(sds(basis), genomes, batch)
        assert chunk == (0 if name == "whole" else 4)
        compiled = ev.lower(sds(basis), genomes, batch, key).compile()
        temp[name] = compiled.memory_analysis().temp_size_in_bytes
    assert temp["chunked"] < temp["whole"], temp
