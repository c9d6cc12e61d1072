"""ESSA's SVD reparametrisation: reconstruction, genome layout, frozen tail, batched adapters."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_helpers import fwd, rand_tokens, randn, random_lora, tiny_model

from essa_jax.lora import (
    GenomeLayout,
    LoraConfig,
    SVDLoRA,
    fuse_shared_input,
    genome_to_singular_values,
    genome_to_svd_lora,
    merge_lora,
    num_free_values,
    population_svd_lora,
    sft_genome,
    svd_factorize,
    svd_lora_to_lora,
)

TARGETS = ("q", "k", "v", "o")


@pytest.fixture
def sft():
    config, params = tiny_model("llama")
    lc = LoraConfig(rank=4, alpha=8.0, targets=TARGETS)
    return config, params, random_lora(7, config, lc)


def test_svd_reconstructs_factors(sft):
    _, _, lora = sft
    basis, layout = svd_factorize(lora)
    for t, f in basis.factors.items():
        a = np.einsum("lrk,lk,lik->lri", f.u_a, f.s_a, f.v_a)
        b = np.einsum("lok,lk,lrk->lor", f.u_b, f.s_b, f.v_b)
        np.testing.assert_allclose(a, lora[t].a, atol=1e-6)
        np.testing.assert_allclose(b, lora[t].b, atol=1e-6)
        # B A from the hot-path form U_B diag(s_B) M^T... : V_A s_A M s_B U_B^T = (B A)^T.
        ba_t = np.einsum("lik,lk,lkq,lq,loq->lio", f.v_a, f.s_a, f.m, f.s_b, f.u_b)
        np.testing.assert_allclose(ba_t, np.einsum("lor,lri->lio", lora[t].b, lora[t].a), atol=1e-5)
        assert np.all(np.diff(np.asarray(f.s_a), axis=-1) <= 0)  # largest first
        assert layout.size == 4 * 2 * 2 * 4


def test_zero_genome_is_the_sft_adapter(sft):
    config, params, lora = sft
    basis, layout = svd_factorize(lora, alpha_frac=0.5)
    rebuilt = svd_lora_to_lora(basis, layout, sft_genome(layout))
    for t in TARGETS:
        np.testing.assert_allclose(rebuilt[t].a, lora[t].a, atol=1e-6)
        np.testing.assert_allclose(rebuilt[t].b, lora[t].b, atol=1e-6)
        assert rebuilt[t].scale == lora[t].scale
    tokens = rand_tokens(1, (2, 6), config.vocab_size)
    want = fwd(params, config, tokens, lora=lora)
    got = fwd(params, config, tokens, lora=genome_to_svd_lora(basis, layout, sft_genome(layout)))
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("alpha_frac, k", [(1.0, 4), (0.5, 2), (0.3, 2), (0.25, 1), (0.01, 1)])
def test_alpha_keeps_lower_singular_values_fixed(sft, alpha_frac, k):
    _, _, lora = sft
    assert num_free_values(4, alpha_frac) == k
    basis, layout = svd_factorize(lora, alpha_frac)
    assert layout.num_free == k and layout.size == len(TARGETS) * 2 * 2 * k
    genome = randn(2, (layout.size,))
    svals = genome_to_singular_values(basis, layout, genome)
    parts = layout.split(genome)
    for t, f in basis.factors.items():
        for s, s0, off in (
            (svals[t][0], f.s_a, parts[t]["a"]),
            (svals[t][1], f.s_b, parts[t]["b"]),
        ):
            np.testing.assert_allclose(s[:, :k], s0[:, :k] + off, atol=1e-6)
            np.testing.assert_array_equal(s[:, k:], s0[:, k:])


def test_alpha_out_of_range():
    with pytest.raises(ValueError, match="alpha_frac"):
        num_free_values(4, 0.0)
    with pytest.raises(ValueError, match="alpha_frac"):
        num_free_values(4, 1.5)


def test_layout_round_trip_and_index():
    layout = GenomeLayout(targets=("q", "v"), num_layers=3, rank=4, num_free=2)
    assert layout.size == 2 * 2 * 3 * 2
    genome = jnp.arange(layout.size, dtype=jnp.float32)
    parts = layout.split(genome)
    np.testing.assert_array_equal(layout.join(parts), genome)
    # Documented order: target-major, then factor (a, b), then layer, then singular-value index.
    assert layout.index("q", "a", 0, 0) == 0
    assert layout.index("q", "a", 1, 0) == 2
    assert layout.index("q", "b", 0, 1) == 7
    assert layout.index("v", "a", 2, 1) == 17
    for i in range(layout.size):
        t, f, layer, j = layout.describe(i)
        assert layout.index(t, f, layer, j) == i
        assert parts[t][f][layer, j] == i
    batched = jnp.stack([genome, -genome])
    np.testing.assert_array_equal(layout.join(layout.split(batched)), batched)
    with pytest.raises(ValueError, match="length 5"):
        layout.split(jnp.zeros(5))
    with pytest.raises(ValueError, match="no genome segment"):
        layout.segment("k", "a")


def test_genome_size_matches_paper_formula():
    # ESSA: Qwen2.5-7B, 28 layers, rank 2, q/k/v/o -> 28 * 4 * 2 * 2 = 448.
    assert GenomeLayout(targets=TARGETS, num_layers=28, rank=2, num_free=2).size == 448


def test_population_rows_equal_single_adapters(sft):
    config, params, lora = sft
    basis, layout = svd_factorize(lora)
    genomes = 0.2 * randn(3, (3, layout.size))
    pop = population_svd_lora(basis, layout, genomes, rows_per_member=2)
    assert pop["q"].s_a.shape == (config.num_layers, 6, 4)
    x = randn(4, (6, 5, config.hidden_size))
    layer = lambda ad, i: jax.tree.map(lambda z: z[i], ad)
    for i in range(3):
        single = genome_to_svd_lora(basis, layout, genomes[i])
        dense = svd_lora_to_lora(basis, layout, genomes[i])
        for t in TARGETS:
            for li in range(config.num_layers):
                got = layer(pop[t], li).delta(x)[2 * i : 2 * i + 2]
                want = layer(single[t], li).delta(x[2 * i : 2 * i + 2])
                want_dense = layer(dense[t], li).delta(x[2 * i : 2 * i + 2])
                np.testing.assert_allclose(got, want, atol=1e-5)
                np.testing.assert_allclose(got, want_dense, atol=1e-5)


def test_per_row_shape_mismatch_is_an_error(sft):
    _, _, lora = sft
    basis, layout = svd_factorize(lora)
    pop = population_svd_lora(basis, layout, jnp.zeros((2, layout.size)), rows_per_member=2)
    layer0 = jax.tree.map(lambda z: z[0], pop["q"])
    with pytest.raises(ValueError, match="4 rows"):
        layer0.delta(jnp.zeros((3, 2, 32)))


def test_svd_lora_forward_equals_merged():
    """All seven targets, Qwen2-style bias + tied embeddings (Llama is covered by the population
    tests)."""
    config, params = tiny_model("qwen2")
    lc = LoraConfig(rank=3, alpha=6.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    lora = random_lora(5, config, lc)
    basis, layout = svd_factorize(lora, alpha_frac=2 / 3)
    genome = 0.3 * randn(6, (layout.size,))
    tokens = rand_tokens(7, (2, 6), config.vocab_size)
    got = fwd(params, config, tokens, lora=genome_to_svd_lora(basis, layout, genome))
    want = fwd(merge_lora(params, svd_lora_to_lora(basis, layout, genome)), config, tokens)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert isinstance(genome_to_svd_lora(basis, layout, genome)["q"], SVDLoRA)
    assert math.isclose(basis.factors["q"].scale, 2.0)


def test_layout_order_survives_jit():
    """Regression: jit re-orders dict pytrees; the genome order must not depend on dict order."""
    config, _ = tiny_model("llama")
    lora = random_lora(8, config, LoraConfig(rank=2, targets=("v", "q")))
    lora = {"v": lora["v"], "q": lora["q"]}  # insertion order != sorted order
    basis, layout = svd_factorize(lora)
    assert layout.targets == ("q", "v")
    genome = randn(9, (layout.size,))
    eager = svd_lora_to_lora(basis, layout, genome)
    jitted = jax.jit(svd_lora_to_lora, static_argnums=1)(basis, layout, genome)
    for t in ("q", "v"):
        np.testing.assert_allclose(jitted[t].a, eager[t].a, atol=1e-6)
        np.testing.assert_allclose(jitted[t].b, eager[t].b, atol=1e-6)


def test_fused_shared_input_adapters_equal_separate():
    """q/k/v -> "qkv" and gate/up -> "gate_up": block-diagonal fused adapters compute the same
    deltas and logits as the separate ones, per row of a population, and the model rejects a
    fused key given together with one of its members."""
    config, params = tiny_model("qwen2")
    lc = LoraConfig(rank=3, alpha=5.0, targets=("q", "k", "v", "o", "gate", "up", "down"))
    basis, layout = svd_factorize(random_lora(11, config, lc), alpha_frac=2 / 3)
    genomes = 0.3 * randn(12, (2, layout.size))
    pop = population_svd_lora(basis, layout, genomes, rows_per_member=2)
    fused = fuse_shared_input(pop)
    assert sorted(fused) == ["down", "gate_up", "o", "qkv"]
    assert fused["qkv"].v_a.shape == (config.num_layers, config.hidden_size, 9)
    assert fused["qkv"].s_a.shape == (config.num_layers, 4, 9)
    x = randn(13, (4, 3, config.hidden_size))
    for li in range(config.num_layers):
        at = lambda ad: jax.tree.map(lambda z: z[li], ad)  # noqa: B023
        want = jnp.concatenate([at(pop[t]).delta(x) for t in ("q", "k", "v")], axis=-1)
        np.testing.assert_allclose(at(fused["qkv"]).delta(x), want, atol=1e-5)
        want = jnp.concatenate([at(pop[t]).delta(x) for t in ("gate", "up")], axis=-1)
        np.testing.assert_allclose(at(fused["gate_up"]).delta(x), want, atol=1e-5)
    tokens = jnp.tile(rand_tokens(14, (2, 6), config.vocab_size), (2, 1))
    got = fwd(params, config, tokens, lora=fused)
    for i in range(2):
        merged = merge_lora(params, svd_lora_to_lora(basis, layout, genomes[i]))
        want = fwd(merged, config, tokens[2 * i : 2 * i + 2])
        np.testing.assert_allclose(got[2 * i : 2 * i + 2], want, atol=2e-5)
    # A group with a member missing stays as it is.
    partial = {t: pop[t] for t in ("q", "k", "o")}
    assert sorted(fuse_shared_input(partial)) == ["k", "o", "q"]
    with pytest.raises(ValueError, match="already adapts"):
        fwd(params, config, tokens, lora={**fused, "q": pop["q"]})
