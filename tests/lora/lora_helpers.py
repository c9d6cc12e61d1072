"""Tiny random models and adapters shared by the LoRA tests.

Random values come from numpy: every new jax.random shape is a fresh XLA compile, which dominates
test time on a small shared CPU. `fwd` is one jitted forward reused by all tests.
"""

import functools

import jax
import numpy as np

from essa_jax.lora import LoRA, LoraConfig, target_shape
from essa_jax.models import ModelConfig, forward, init_params

TINY = {
    "llama": dict(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        eos_token_ids=(2,),
        pad_token_id=0,
    ),
    "qwen2": dict(
        vocab_size=89,
        hidden_size=24,
        intermediate_size=40,
        num_layers=3,
        num_heads=6,
        num_kv_heads=2,
        head_dim=4,
        rope_theta=1000000.0,
        attention_bias=True,
        tie_embeddings=True,
        rms_norm_eps=1e-6,
        eos_token_ids=(3,),
        pad_token_id=0,
    ),
}
ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")

fwd = jax.jit(forward, static_argnames="config")


@functools.cache
def tiny_model(name: str, seed: int = 0):
    """(config, params): the pytree of `init_params` (via eval_shape), filled from numpy.

    Norm weights are 1 + noise, everything else N(0, 0.02^2) as init_params; numpy avoids one XLA
    compile per random shape.
    """
    config = ModelConfig(**TINY[name])
    shapes = jax.eval_shape(lambda k: init_params(k, config), jax.random.key(seed))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = jax.tree_util.keystr(path)
        noise = rng.standard_normal(leaf.shape).astype(np.float32)
        return jax.numpy.asarray(1.0 + 0.1 * noise if "norm" in name else 0.02 * noise)

    return config, jax.tree_util.tree_map_with_path(fill, shapes)


def random_lora(seed: int, model_config, lora_config: LoraConfig, std: float = 0.3):
    """An 'SFT-like' adapter: A ~ U(+-1/sqrt(in)) as PEFT, B random non-zero (fresh B = 0)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in lora_config.targets:
        fan_in, fan_out = target_shape(model_config, t)
        L, r = model_config.num_layers, lora_config.rank
        a = rng.uniform(-1, 1, (L, r, fan_in)) / np.sqrt(fan_in)
        b = std * rng.standard_normal((L, fan_out, r))
        out[t] = LoRA(
            a=np.asarray(a, np.float32), b=np.asarray(b, np.float32), scale=lora_config.scale
        )
    return jax.tree.map(jax.numpy.asarray, out)


def rand_tokens(seed: int, shape, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def randn(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
