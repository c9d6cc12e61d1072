"""The population engine against per-member merged weights, and sharded against single-device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from pop_helpers import fwd, left_padded, randn, setup

from essa_jax.lora import merge_lora, sft_genome, svd_lora_to_lora
from essa_jax.mesh import make_mesh, padded_size
from essa_jax.models import generate_jit
from essa_jax.population import (
    population_forward,
    population_generate,
)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_member_logits_equal_merged_adapter(name):
    """Row block i of the batched program == the model with member i's adapter merged into W."""
    config, params, _, basis, layout = setup(name, rank=3, alpha_frac=2 / 3)
    num_members, b, t = 3, 2, 6
    genomes = 0.3 * randn(0, (num_members, layout.size))
    tokens, mask = left_padded(1, (num_members, b, t), config.vocab_size)
    logits = population_forward(params, config, basis, layout, genomes, tokens, mask)
    assert logits.shape == (num_members, b, t, config.vocab_size)
    for i in range(num_members):
        merged = merge_lora(params, svd_lora_to_lora(basis, layout, jnp.asarray(genomes[i])))
        want = fwd(merged, config, tokens[i], attention_mask=mask[i])
        real = mask[i].astype(bool)
        np.testing.assert_allclose(np.asarray(logits[i])[real], np.asarray(want)[real], atol=3e-5)
    # Members really differ (the test would pass trivially if the genome were ignored).
    assert np.abs(np.asarray(logits[0] - logits[1])).max() > 1e-3


def test_zero_genome_generates_like_sft_adapter():
    config, params, sft, basis, layout = setup("llama")
    tokens, mask = left_padded(2, (3, 5), config.vocab_size)
    genomes = jnp.stack([sft_genome(layout)] * 2)
    got = population_generate(
        params,
        config,
        basis,
        layout,
        genomes,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=6,
        greedy=True,
    )
    want = generate_jit(
        params, config, tokens, mask, jax.random.key(0), max_new_tokens=6, greedy=True, lora=sft
    )
    assert got.tokens.shape == (2, 3, 6)
    for i in range(2):
        np.testing.assert_array_equal(got.tokens[i], want.tokens)
        np.testing.assert_allclose(got.logprobs[i], want.logprobs, atol=1e-4)


def test_input_validation():
    config, params, _, basis, layout = setup("llama")
    tokens, mask = left_padded(3, (2, 4), config.vocab_size)
    with pytest.raises(ValueError, match="layout.size"):
        population_forward(params, config, basis, layout, np.zeros((2, 3)), tokens, mask)
    with pytest.raises(ValueError, match="per-member prompts"):
        population_forward(
            params, config, basis, layout, np.zeros((2, layout.size)), np.stack([tokens] * 3)
        )
    with pytest.raises(ValueError, match="prompt_mask"):
        population_generate(
            params,
            config,
            basis,
            layout,
            np.zeros((2, layout.size)),
            tokens,
            mask[:, 1:],
            jax.random.key(0),
            max_new_tokens=2,
        )


def test_mesh_construction():
    mesh = make_mesh(pop=4, data=2)
    assert dict(mesh.shape) == {"pop": 4, "data": 2, "model": 1}
    n = len(jax.devices())
    assert dict(make_mesh().shape) == {"pop": n, "data": 1, "model": 1}
    with pytest.raises(ValueError, match="valid pop values: 1..4"):
        make_mesh(pop=8, data=2)
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        make_mesh(data=3)
    assert [padded_size(n, 4) for n in (1, 4, 5, 8)] == [4, 4, 8, 8]


def test_sampled_member_rows_equal_merged_adapter_alone():
    """Sampling: row (member i, prompt j) equals the merged-adapter model generating prompt j
    alone with key fold_in(fold_in(key, i), j) (the documented per-row key)."""
    config, params, _, basis, layout = setup("qwen2", rank=3)
    num_members, b, t = 3, 2, 5
    genomes = 0.3 * randn(4, (num_members, layout.size))
    tokens, mask = left_padded(5, (b, t), config.vocab_size)
    key = jax.random.key(7)
    settings = dict(max_new_tokens=6, temperature=1.3, top_k=20, eos_token_ids=())
    got = population_generate(params, config, basis, layout, genomes, tokens, mask, key, **settings)
    for i in range(num_members):
        merged = merge_lora(params, svd_lora_to_lora(basis, layout, jnp.asarray(genomes[i])))
        for j in range(b):
            row_key = jax.random.fold_in(jax.random.fold_in(key, i), j)
            want = generate_jit(
                merged, config, tokens[j : j + 1], mask[j : j + 1], row_key, **settings
            )
            np.testing.assert_array_equal(np.asarray(got.tokens)[i, j], np.asarray(want.tokens)[0])
            np.testing.assert_allclose(
                np.asarray(got.logprobs)[i, j], np.asarray(want.logprobs)[0], atol=1e-4
            )
    assert not np.array_equal(np.asarray(got.tokens)[0], np.asarray(got.tokens)[1])
