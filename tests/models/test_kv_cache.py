"""KV-cache forward passes against the no-cache forward, for stacked and per-layer params.

A sequence fed in chunks through a cache (a prompt chunk, single-token decode steps, a multi-token
chunk) must give the logits of one no-cache forward over the whole sequence, for both layer-loop
forms (`lax.scan` over stacked params and the unrolled loop over `per_layer_params`), with LoRA
adapters, left padding, sliding-window attention and a narrower cache dtype.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.models import ModelConfig, forward, hidden_states, init_cache, init_params, prefill
from essa_jax.models.transformer import per_layer_cache, per_layer_lora, per_layer_params

# prompt chunk, four single-token steps, a 3-token chunk: 12 tokens in all
CHUNKS = ((0, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 12))


@flax.struct.dataclass
class _LoRA:
    a: jax.Array  # [L, r, in]
    b: jax.Array  # [L, out, r]

    def delta(self, x):
        return (x @ self.a.T) @ self.b.T


def _config(**kw):
    base = dict(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=40,
        num_layers=3,
        num_heads=6,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        eos_token_ids=(3,),
        pad_token_id=0,
    )
    return ModelConfig(**{**base, **kw})


def _model(config, seed=0):
    params = init_params(jax.random.key(seed), config)
    params = jax.tree.map(lambda x: x * 3.0, params)  # peaked enough that errors would show
    lora = {}
    for i, t in enumerate(("q", "v", "gate", "up")):
        L, n_in, n_out = params["layers"][t]["kernel"].shape
        ka, kb = jax.random.split(jax.random.key(100 + i))
        lora[t] = _LoRA(
            a=0.3 * jax.random.normal(ka, (L, 2, n_in)),
            b=0.3 * jax.random.normal(kb, (L, n_out, 2)),
        )
    return params, lora


def _batch(config):
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, config.vocab_size, (3, 12)).astype(np.int32)
    mask = np.ones((3, 12), np.int32)
    mask[1, :2] = 0  # left padding inside the prompt chunk
    mask[2, :4] = 0
    return jnp.asarray(tokens), jnp.asarray(mask)


def _chunked_logits(
    params, config, tokens, mask, lora, cache_dtype=jnp.float32, capacity=14, split_cache=False
):
    """Logits [B, 12, V] from feeding CHUNKS through a cache with `capacity` slots (split per
    layer with `per_layer_cache` if split_cache)."""

    @jax.jit
    def step(params, lora, cache, tok, m):
        return forward(params, config, tok, attention_mask=m, lora=lora, cache=cache)

    cache = init_cache(config, tokens.shape[0], capacity, cache_dtype)
    if split_cache:
        cache = per_layer_cache(cache)
    out = []
    for a, b in CHUNKS:
        logits, cache = step(params, lora, cache, tokens[:, a:b], mask[:, a:b])
        out.append(logits)
    assert int(cache.index) == 12
    np.testing.assert_array_equal(np.asarray(cache.mask[:, :12]), np.asarray(mask, bool))
    assert isinstance(cache.k, tuple) == split_cache
    return jnp.concatenate(out, axis=1)


@pytest.mark.parametrize("sliding_window", [None, 4])
@pytest.mark.parametrize("per_layer", ["stacked", "per_layer_params", "per_layer_params_and_cache"])
def test_chunked_cache_equals_full_forward(per_layer, sliding_window):
    config = _config(sliding_window=sliding_window)
    params, lora = _model(config)
    tokens, mask = _batch(config)
    fwd = jax.jit(forward, static_argnums=1)
    full = fwd(params, config, tokens, attention_mask=mask, lora=lora)
    run_params = per_layer_params(params) if per_layer != "stacked" else params
    split_cache = per_layer == "per_layer_params_and_cache"
    chunked = _chunked_logits(run_params, config, tokens, mask, lora, split_cache=split_cache)
    real = np.asarray(mask, bool)  # padding queries attend to nothing: their logits are arbitrary
    np.testing.assert_allclose(np.asarray(chunked)[real], np.asarray(full)[real], atol=2e-4)
    if sliding_window is not None:  # the window changes the result (so it is exercised)
        unwindowed = fwd(params, _config(), tokens, attention_mask=mask, lora=lora)
        assert float(jnp.max(jnp.abs(unwindowed - full)[real])) > 1e-2


def test_per_layer_params_equal_stacked():
    """Same function: no cache, and (bit-for-bit up to float reordering) a bf16 cache."""
    config = _config(attention_bias=True)
    params, lora = _model(config, seed=1)
    # A gate bias and no up bias: a bias on one projection of a shared input is applied alone.
    L, intermediate = config.num_layers, config.intermediate_size
    gate_bias = 0.5 * jax.random.normal(jax.random.key(7), (L, intermediate))
    params["layers"]["gate"] = {**params["layers"]["gate"], "bias": gate_bias}
    tokens, mask = _batch(config)
    per_layer = per_layer_params(params)
    assert isinstance(per_layer["layers"], tuple) and len(per_layer["layers"]) == L
    assert per_layer_params(per_layer) is per_layer
    fwd = jax.jit(forward, static_argnums=1)
    stacked = fwd(params, config, tokens, attention_mask=mask, lora=lora)
    unrolled = fwd(per_layer, config, tokens, attention_mask=mask, lora=lora)
    np.testing.assert_allclose(np.asarray(unrolled), np.asarray(stacked), atol=1e-4)
    # Adapters split per layer once (as `generate` does before its decode loop): same function;
    # a per-layer LoRA with stacked params is a usage error.
    split = per_layer_lora(lora, L)
    np.testing.assert_array_equal(
        np.asarray(fwd(per_layer, config, tokens, attention_mask=mask, lora=split)),
        np.asarray(unrolled),
    )
    with pytest.raises(ValueError, match="per-layer params"):
        forward(params, config, tokens, lora=split)
    with pytest.raises(ValueError, match="per-layer params"):
        forward(params, config, tokens, cache=per_layer_cache(init_cache(config, 3, 14)))
    no_bias = {**params["layers"]["gate"]}
    del no_bias["bias"]
    without = fwd({**params, "layers": {**params["layers"], "gate": no_bias}}, config, tokens)
    assert float(jnp.max(jnp.abs(without - fwd(params, config, tokens)))) > 1e-2

    real = np.asarray(mask, bool)
    bf16 = [
        _chunked_logits(p, config, tokens, mask, lora, cache_dtype=jnp.bfloat16)
        for p in (params, per_layer)
    ]
    np.testing.assert_allclose(np.asarray(bf16[1])[real], np.asarray(bf16[0])[real], atol=1e-4)
    # A bf16 cache rounds keys and values: close to the float32 forward, not equal to it.
    err = np.abs(np.asarray(bf16[0]) - np.asarray(stacked))[real]
    assert 1e-5 < err.max() < 0.5


@pytest.mark.parametrize("cache_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("per_layer", [False, True])
def test_prefill_equals_prompt_pass_into_an_empty_cache(per_layer, cache_dtype):
    """`prefill` (the prompt attending to itself alone) = `hidden_states` into `init_cache`: the
    same hidden states and the same cache on real tokens, so decoding continues identically."""
    config = _config(sliding_window=4)
    params, lora = _model(config, seed=2)
    if per_layer:
        params = per_layer_params(params)
    tokens, mask = _batch(config)
    prompt, prompt_mask, capacity = tokens[:, :7], mask[:, :7], 11

    @jax.jit
    def reference(params, lora):
        cache = init_cache(config, 3, capacity, cache_dtype)
        return hidden_states(
            params, config, prompt, attention_mask=prompt_mask, lora=lora, cache=cache
        )

    @jax.jit
    def ours(params, lora):
        return prefill(
            params,
            config,
            prompt,
            max_len=capacity,
            attention_mask=prompt_mask,
            lora=lora,
            cache_dtype=cache_dtype,
        )

    (h_ref, c_ref), (h, c) = reference(params, lora), ours(params, lora)
    real = np.asarray(prompt_mask, bool)  # padding positions hold arbitrary values in both
    # Float sums reorder between the two programs: equal to float32 rounding.
    np.testing.assert_allclose(np.asarray(h)[real], np.asarray(h_ref)[real], rtol=1e-5, atol=1e-5)
    assert c.k.shape == c_ref.k.shape and c.k.dtype == c_ref.k.dtype == cache_dtype
    slot_real = np.zeros((3, capacity), bool)
    slot_real[:, :7] = real
    for new, old in ((c.k, c_ref.k), (c.v, c_ref.v)):
        new, old = np.asarray(new, np.float32), np.asarray(old, np.float32)
        # [L, B, Hkv, S, hd] -> [B, S, L, Hkv, hd]: real slots compared, the rest must be empty.
        new, old = new.transpose(1, 3, 0, 2, 4), old.transpose(1, 3, 0, 2, 4)
        np.testing.assert_allclose(new[slot_real], old[slot_real], rtol=1e-5, atol=1e-5)
        assert not new[:, 7:].any()
    np.testing.assert_array_equal(np.asarray(c.mask), np.asarray(c_ref.mask))
    np.testing.assert_array_equal(np.asarray(c.next_pos), np.asarray(c_ref.next_pos))
    assert int(c.index) == int(c_ref.index) == 7

    @jax.jit
    def decode(params, lora, cache):
        return forward(params, config, tokens[:, 7:11], lora=lora, cache=cache)[0]

    np.testing.assert_allclose(
        np.asarray(decode(params, lora, c)), np.asarray(decode(params, lora, c_ref)), atol=1e-4
    )
    with pytest.raises(ValueError, match="max_len=6 is shorter than the prompt"):
        prefill(params, config, prompt, max_len=6)
