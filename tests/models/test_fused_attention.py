"""The fused path of a pass without a cache (`jax.nn.dot_product_attention`: cuDNN's flash
attention on a GPU with 16-bit activations) against the float32 einsum path.

On CPU the call's "xla" implementation runs the same masks, so these tests check what the GPU path
is given: the causal, left-padding and sliding-window mask, GQA, the self-slot that keeps padding
rows finite, gradients, and a prefill whose cache decoding continues from.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_kv_cache import _batch, _config, _model

from essa_jax.models import attention as T
from essa_jax.models import forward, generate_jit, prefill


@pytest.mark.parametrize("sliding_window", [None, 3])
def test_fused_self_attention_is_the_einsum_path(sliding_window):
    config = _config(sliding_window=sliding_window)
    params, lora = _model(config, seed=4)
    tokens, mask = _batch(config)
    real = np.asarray(mask, bool)

    def run():
        fwd = jax.jit(forward, static_argnums=1)
        logits = fwd(params, config, tokens, attention_mask=mask, lora=lora)
        loss = lambda lo: jnp.sum(  # noqa: E731
            jnp.where(
                mask[..., None] > 0, fwd(params, config, tokens, attention_mask=mask, lora=lo), 0
            )
            ** 2
        )
        return np.asarray(logits), jax.grad(loss)(lora)

    ref, ref_grad = run()
    with T.self_attention("xla"):
        assert T._fused_implementation(jnp.float32) == "xla"
        got, grad = run()
    assert T._fused_implementation(jnp.float32) is None  # restored: einsum on CPU
    assert np.all(np.isfinite(got))  # padding rows included (they attend to their own slot)
    np.testing.assert_allclose(got[real], ref[real], atol=2e-4)
    for g, r in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-3, atol=2e-3)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) > 1e-3


def test_fused_prefill_feeds_the_same_decode():
    """A prompt pass through the fused path leaves the cache the einsum path leaves: greedy decoding
    from it gives the same tokens and log-probs."""
    config = _config()
    params, _ = _model(config, seed=5)
    tokens, mask = _batch(config)

    def gen():
        out = generate_jit(
            params, config, tokens, mask, jax.random.key(0), max_new_tokens=5, greedy=True
        )
        _, cache = jax.jit(lambda p: prefill(p, config, tokens, max_len=16, attention_mask=mask))(
            params
        )
        return out, cache

    ref, ref_cache = gen()
    with T.self_attention("xla"):
        got, cache = gen()
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4)
    # Keys of real slots agree; a padding slot's (never attended) come from a padding row's
    # hidden state, which differs (it attends to its own slot in the fused path).
    real = np.asarray(cache.mask)  # [B, S]
    k, ref_k = np.moveaxis(np.asarray(cache.k), 3, 2), np.moveaxis(np.asarray(ref_cache.k), 3, 2)
    np.testing.assert_allclose(k[:, real], ref_k[:, real], atol=1e-5)  # [L, B, S, ...] at real


def test_self_attention_mode_is_checked():
    with pytest.raises(ValueError, match="valid modes"):
        with T.self_attention("flash"):
            pass
