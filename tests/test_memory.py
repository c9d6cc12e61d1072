"""essa_jax.memory: the analytic byte counts against real arrays, and the chunk choice."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from essa_jax import config as config_lib
from essa_jax.memory import (
    cache_slots,
    choose_rows_per_chunk,
    generation_bytes_per_row,
    kv_cache_bytes,
    kv_cache_bytes_per_row,
    param_bytes,
    tree_bytes,
)
from essa_jax.models import init_cache, init_params, prefill
from essa_jax.models.tiny import tiny_model_config
from essa_jax.train import validate_config

CFG = tiny_model_config("tiny")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kv_cache_bytes_equal_init_cache(dtype):
    slots = cache_slots(7, 5)
    cache = jax.eval_shape(lambda: init_cache(CFG, 3, slots, dtype))
    assert kv_cache_bytes(CFG, 3, slots, dtype) == tree_bytes(cache)
    assert kv_cache_bytes_per_row(CFG, 7, 5, dtype) * 3 + 4 == tree_bytes(cache)


def test_kv_cache_bytes_equal_the_cache_generate_prefills():
    """`models.generate` prefills into T + N - 1 slots; the estimate counts exactly that cache."""
    params = jax.eval_shape(lambda: init_params(jax.random.key(0), CFG, jnp.bfloat16))
    tokens = jax.ShapeDtypeStruct((2, 7), jnp.int32)
    _, cache = jax.eval_shape(
        lambda p, t: prefill(p, CFG, t, max_len=cache_slots(7, 5), attention_mask=jnp.ones_like(t)),
        params,
        tokens,
    )
    assert tree_bytes(cache) == kv_cache_bytes(CFG, 2, cache_slots(7, 5), jnp.bfloat16)


@pytest.mark.parametrize("tied,bias", [(True, False), (False, True)])
def test_param_bytes_equal_init_params(tied, bias):
    cfg = dataclasses.replace(CFG, tie_embeddings=tied, attention_bias=bias)
    params = jax.eval_shape(lambda: init_params(jax.random.key(0), cfg, jnp.bfloat16))
    assert param_bytes(cfg, jnp.bfloat16) == tree_bytes(params)


def _choose(memory, rows=100, reserved=1000):
    return choose_rows_per_chunk(
        CFG,
        rows=rows,
        prompt_len=16,
        max_new_tokens=8,
        cache_dtype=jnp.float32,
        device_memory_bytes=memory,
        reserved_bytes=reserved,
        setting="essa.rows_per_chunk",
    )


def test_choose_rows_per_chunk():
    per_row = generation_bytes_per_row(CFG, 16, 8, jnp.float32)
    assert _choose(10**12) == 100  # everything fits: no chunking
    big = _choose(int((1000 + 40 * per_row) / 0.9) + 1)
    small = _choose(int((1000 + 10 * per_row) / 0.9) + 1)
    assert small < big < 100
    assert big == 34 and small == 10  # 40 fit -> 3 chunks of 34; 10 fit -> 10 chunks of 10
    assert _choose(int((1000 + per_row) / 0.9) + 1) == 1


def test_choose_rows_per_chunk_raises_when_no_row_fits():
    with pytest.raises(ValueError, match=r"essa.rows_per_chunk=0 .*not even one row fits"):
        _choose(2000, reserved=1900)


def test_qwen_7b_paper_setting():
    """The issue's numbers: Qwen2.5-7B, bf16, 384 + 512 tokens: ~51 MB of KV cache per row."""
    from essa_jax.models import ModelConfig

    qwen = ModelConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
        num_heads=28, num_kv_heads=4, head_dim=128, attention_bias=True, tie_embeddings=False,
    )  # fmt: skip
    assert 51e6 < kv_cache_bytes_per_row(qwen, 384, 512, jnp.bfloat16) < 52e6
    assert 15.2e9 < param_bytes(qwen, jnp.bfloat16) < 15.3e9
    chunk = choose_rows_per_chunk(
        qwen, rows=1200, prompt_len=384, max_new_tokens=512, cache_dtype=jnp.bfloat16,
        device_memory_bytes=80 * 10**9, reserved_bytes=param_bytes(qwen, jnp.bfloat16),
    )  # fmt: skip
    assert 1 <= chunk < 1200


@pytest.mark.parametrize("bad", [-1, True])  # ConfigDict itself refuses 2.5, "4"
def test_config_validates_essa_rows_per_chunk(bad):
    c = config_lib.base_config()
    c.method = "essa"
    c.model.path = "random:tiny"
    c.essa.rows_per_chunk = bad
    with pytest.raises(config_lib.ConfigError, match="essa.rows_per_chunk"):
        validate_config(c, num_devices=1)


def test_config_grpo_rows_per_chunk_reaches_grpo_config():
    c = config_lib.base_config()
    c.grpo.rows_per_chunk = 6
    assert config_lib.grpo_config(c).rows_per_chunk == 6
    assert config_lib.base_config().essa.rows_per_chunk == 0
