"""LoRA config validation, PEFT initialisation, the forward hook and merging into W."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_helpers import fwd, rand_tokens, randn, random_lora, tiny_model

from essa_jax.lora import LoraConfig, init_lora, merge_lora, target_shape


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="rank"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="alpha"):
        LoraConfig(alpha=-1.0)
    with pytest.raises(ValueError, match="unknown names"):
        LoraConfig(targets=("q", "qkv"))
    with pytest.raises(ValueError, match="tuple of target names"):
        LoraConfig(targets="q")
    with pytest.raises(ValueError, match="duplicates"):
        LoraConfig(targets=("q", "q"))
    config, _ = tiny_model("llama")
    # k projects 32 -> 2 kv heads * 8 = 16, so rank 17 cannot fit.
    with pytest.raises(ValueError, match=r"rank=17 .* min\(in, out\)=16 of target 'k'"):
        init_lora(jax.random.key(0), config, LoraConfig(rank=17, targets=("q", "k")))


def test_scale_matches_peft():
    assert LoraConfig(rank=8, alpha=16.0).scale == 2.0
    assert LoraConfig(rank=16, alpha=16.0, use_rslora=True).scale == 4.0


def test_init_is_peft_default(lora_config):
    config, _ = tiny_model("llama")
    lora = init_lora(jax.random.key(0), config, lora_config)
    assert tuple(lora) == lora_config.targets
    for t, ad in lora.items():
        fan_in, fan_out = target_shape(config, t)
        assert ad.a.shape == (config.num_layers, 4, fan_in)
        assert ad.b.shape == (config.num_layers, fan_out, 4)
        assert ad.scale == 2.0
        bound = 1 / math.sqrt(fan_in)
        a = np.asarray(ad.a)
        assert np.abs(a).max() <= bound
        # U(-b, b) has std b / sqrt(3): the kaiming_uniform(a=sqrt(5)) of nn.Linear.
        assert abs(a.std() - bound / math.sqrt(3)) < 0.2 * bound
        assert not np.any(np.asarray(ad.b))


def test_lora_hook_equals_merged_weights(model, lora_config):
    config, params = model
    lora = random_lora(1, config, lora_config)
    tokens = rand_tokens(2, (2, 7), config.vocab_size)
    hooked = fwd(params, config, tokens, lora=lora)
    merged = fwd(merge_lora(params, lora), config, tokens)
    base = fwd(params, config, tokens)
    np.testing.assert_allclose(hooked, merged, atol=2e-5, rtol=1e-5)
    assert np.abs(np.asarray(hooked - base)).max() > 1e-2  # the adapter does change the model


def test_merge_matches_dense_formula():
    config, params = tiny_model("llama")
    lc = LoraConfig(rank=2, alpha=3.0, targets=("v",))
    lora = random_lora(3, config, lc)
    merged = merge_lora(params, lora)
    a, b = np.asarray(lora["v"].a), np.asarray(lora["v"].b)
    for layer in range(config.num_layers):
        want = np.asarray(params["layers"]["v"]["kernel"][layer]) + 1.5 * (b[layer] @ a[layer]).T
        np.testing.assert_allclose(merged["layers"]["v"]["kernel"][layer], want, atol=1e-6)
    assert merged["layers"]["q"]["kernel"] is params["layers"]["q"]["kernel"]


def test_merge_rejects_wrong_shapes():
    config, params = tiny_model("llama")
    other, _ = tiny_model("qwen2")
    lora = init_lora(jax.random.key(0), other, LoraConfig(rank=2, targets=("q",)))
    with pytest.raises(ValueError, match="do not fit kernel"):
        merge_lora(params, lora)


def test_merge_refuses_a_quantised_kernel():
    from essa_jax.models import quantize_params

    config, params = tiny_model("llama")
    lora = random_lora(3, config, LoraConfig(rank=2, targets=("v",)))
    with pytest.raises(ValueError, match="the 'v' kernel is quantised"):
        merge_lora(quantize_params(params, "int8"), lora)


def test_delta_under_jit_and_bf16():
    config, params = tiny_model("llama")
    lora = random_lora(4, config, LoraConfig(rank=2, targets=("q",)))
    layer0 = jax.tree.map(lambda z: z[0], lora["q"])
    x = randn(5, (3, 4, config.hidden_size))
    y = jax.jit(lambda ad, x: ad.delta(x))(layer0, x)
    want = lora["q"].scale * np.einsum("bti,ri,or->bto", x, layer0.a, layer0.b)
    np.testing.assert_allclose(y, want, atol=1e-5)
    assert layer0.delta(x.astype(jnp.bfloat16)).dtype == jnp.bfloat16
