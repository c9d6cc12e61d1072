"""Tensor parallelism over the mesh's ``model`` axis (docs/ARCHITECTURE.md, "Meshes"): weights
placed by `mesh.place_params` are really split, and forward, log-probs and generation (greedy and
sampled) equal the single-device model, on 8 virtual CPU devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from essa_jax.memory import param_bytes, tree_bytes
from essa_jax.mesh import check_model_axis, make_mesh, param_specs, place_params
from essa_jax.models import (
    forward,
    generate_jit,
    init_params,
    sequence_logprobs,
    tiny_model_config,
)

MODELS = (2, 4, 8)
_init = jax.jit(init_params, static_argnums=1)
fwd = jax.jit(forward, static_argnums=1)
logprobs = jax.jit(sequence_logprobs, static_argnums=1)


def _model(tied: bool = True):
    """The "tp" preset (16 heads / 8 KV heads, q/k/v biases), weights x4 so that greedy choices
    have margins far above float reordering; untied: its own lm_head."""
    config = tiny_model_config("tp")
    if not tied:
        config = dataclasses.replace(config, tie_embeddings=False)
    # Jitted: eager init_params compiles every random op on its own (seconds on a small CPU).
    params = _init(jax.random.key(0 if tied else 1), config)
    return config, jax.tree.map(lambda x: 4.0 * x, params)


def _mesh(model: int):
    return make_mesh(pop=1, data=1, model=model, devices=jax.devices()[:model])


def _prompts(b: int = 4, t: int = 7):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 99, (b, t)).astype(np.int32)
    mask = (np.arange(t) >= rng.integers(0, t - 1, (b, 1))).astype(np.int32)  # left padding
    return jnp.asarray(np.where(mask == 1, tokens, 0)), jnp.asarray(mask)


def test_specs_follow_the_megatron_table_and_shards_are_split():
    config, params = _model(tied=False)
    specs = param_specs(params, config, 4)
    layers = specs["layers"]
    assert specs["embed"] == P("model", None)
    assert specs["lm_head"]["kernel"] == P(None, "model")
    for name in ("q", "k", "v", "gate", "up"):
        assert layers[name]["kernel"] == P(None, None, "model")
    for name in ("q", "k", "v"):
        assert layers[name]["bias"] == P(None, "model")
    assert layers["o"]["kernel"] == layers["down"]["kernel"] == P(None, "model", None)
    assert layers["attn_norm"] == layers["mlp_norm"] == specs["final_norm"] == P()
    assert all(s == P() for s in jax.tree.leaves(param_specs(params, config, 1)))

    placed = place_params(params, _mesh(4), config)
    q = placed["layers"]["q"]["kernel"]
    assert q.sharding.spec == P(None, None, "model")
    assert {s.data.shape for s in q.addressable_shards} == {(2, 32, 8)}  # 32 q columns / 4
    down = placed["layers"]["down"]["kernel"]
    assert {s.data.shape for s in down.addressable_shards} == {(2, 16, 32)}  # 64 MLP rows / 4
    assert {s.data.shape for s in placed["embed"].addressable_shards} == {(32, 32)}  # V / 4
    norm = placed["layers"]["attn_norm"]
    assert {s.data.shape for s in norm.addressable_shards} == {(2, 32)}  # replicated
    assert tree_bytes(placed, per_device=True) == param_bytes(config, jnp.float32, model_shards=4)
    assert tree_bytes(placed) == param_bytes(config, jnp.float32)
    # Abstract weights (the plan's) get the same shardings.
    abstract = place_params(jax.eval_shape(lambda: params), _mesh(4), config)
    assert abstract["layers"]["q"]["kernel"].sharding.spec == P(None, None, "model")


def test_model_axis_must_divide_the_heads():
    config = tiny_model_config("tiny")  # 4 heads, 2 KV heads, 64 MLP columns
    check_model_axis(config, 2)
    with pytest.raises(ValueError) as e:
        check_model_axis(config, 4)
    msg = str(e.value)
    assert "mesh.model=4" in msg and "num_kv_heads=2" in msg and "valid mesh.model values: [1, 2]"
    with pytest.raises(ValueError, match=r"valid mesh.model values: \[1, 2\]"):
        param_specs(jax.eval_shape(_init, jax.random.key(0), config), config, 4)


@pytest.mark.parametrize("model", MODELS)
def test_forward_and_logprobs_equal_one_device(model):
    config, params = _model(tied=False)
    tokens, mask = _prompts()
    placed = place_params(params, _mesh(model), config)
    want = fwd(params, config, tokens, attention_mask=mask)
    got = fwd(placed, config, tokens, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
    lp_want = logprobs(params, config, tokens, mask)
    lp_got = logprobs(placed, config, tokens, mask)
    np.testing.assert_allclose(np.asarray(lp_got), np.asarray(lp_want), atol=2e-5)


@pytest.mark.parametrize("model", MODELS)
def test_generation_equals_one_device(model):
    """Greedy and sampled (per-row keys, top-k) generations: tokens exactly, log-probs to float
    rounding (the all-reduces sum partial products in another order)."""
    config, params = _model()
    tokens, mask = _prompts()
    placed = place_params(params, _mesh(model), config)
    keys = jax.random.split(jax.random.key(5), tokens.shape[0])
    for settings in (dict(greedy=True), dict(temperature=1.3, top_k=20)):
        kw = dict(max_new_tokens=8, eos_token_ids=(), **settings)
        want = generate_jit(params, config, tokens, mask, keys, **kw)
        got = generate_jit(placed, config, tokens, mask, keys, **kw)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
        np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-4)


def test_compiled_generation_is_split_without_gathering_weights():
    """Per-device bytes of the weights (arguments) and of the KV cache and activations
    (temporaries) fall with the model axis; the only all-gathers are the argmax's per-shard
    candidates ([rows, model] values and indices), never a weight."""
    config, params = _model()
    tokens, mask = _prompts(b=16, t=24)
    kw = dict(max_new_tokens=8, greedy=True, eos_token_ids=())
    smallest = min(x.size for x in jax.tree.leaves(params) if x.ndim == 3)
    stats = {}
    for model in (1, 2, 4):
        placed = place_params(params, _mesh(model), config)
        compiled = generate_jit.lower(placed, config, tokens, mask, jax.random.key(0), **kw)
        compiled = compiled.compile()
        stats[model] = compiled.memory_analysis()
        for line in compiled.as_text().splitlines():
            if " all-gather(" in line or " all-gather-start(" in line:
                shape = line.split("=", 1)[1].split("all-gather")[0]
                dims = [int(d) for d in shape[shape.index("[") + 1 : shape.index("]")].split(",")]
                assert np.prod(dims) < smallest, line
    inputs = stats[1].argument_size_in_bytes - param_bytes(config, jnp.float32)  # tokens, key
    for model in (2, 4):
        args = stats[model].argument_size_in_bytes - inputs
        assert args == param_bytes(config, jnp.float32, model_shards=model), (model, args)
        ratio = stats[model].temp_size_in_bytes / stats[1].temp_size_in_bytes
        assert ratio < 1.2 / model, (model, ratio)
