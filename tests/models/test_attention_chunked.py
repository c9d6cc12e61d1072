"""Query-chunked prefill attention and per-layer remat against the plain paths (issue #16).

A long prompt is attended `ATTENTION_QUERY_CHUNK` queries at a time (no [B, H, T, T] float32
scores); the result, its gradients, and the cache path must equal the one-block attention. Layer
checkpointing (`remat=True`) must give the same values and gradients.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.lora import LoraConfig, init_lora
from essa_jax.models import attention as tr
from essa_jax.models import forward, hidden_states, init_cache
from essa_jax.models.tiny import tiny_model_config
from essa_jax.models.transformer import init_params, per_layer_params

B, T = 3, 13


def _setup(dtype, sliding_window=None):
    cfg = dataclasses.replace(
        tiny_model_config("tiny"), attention_bias=True, sliding_window=sliding_window
    )  # GQA: 4 query heads over 2 kv heads
    params = init_params(jax.random.PRNGKey(0), cfg, dtype)
    lora = init_lora(jax.random.PRNGKey(1), cfg, LoraConfig(rank=2, alpha=4.0, targets=("q", "v")))
    # Non-zero B, so the adapter acts (and gets gradients through both factors).
    lora = {t: ad.replace(b=0.1 * jnp.ones_like(ad.b)) for t, ad in lora.items()}
    tokens = jax.random.randint(jax.random.PRNGKey(2), (B, T), 3, cfg.vocab_size)
    mask = np.ones((B, T), np.int32)
    mask[1, :4] = 0  # left padding
    mask[2, :9] = 0
    return cfg, params, lora, tokens, jnp.asarray(mask)


def _rounding_tol(cfg, ref) -> dict:
    """Tolerance of two float32 evaluations of one function that differ only in the order of
    their sums (the query-chunked and one-block attention): Higham's bound for a sum of n terms,
    |error| <= n u sum|terms| (Accuracy and Stability of Numerical Algorithms, Sec. 3.1), with n
    the longest reduction of a layer (the MLP's intermediate_size, the hidden size, or the keys),
    u float32's unit roundoff, times the layers the error passes through, against the scale of the
    compared array. No relative part: values near 0 (a gradient element of 0.008 beside ones of
    50, a hidden unit near 0) carry the absolute rounding of their neighbours' scale."""
    n = max(cfg.intermediate_size, cfg.hidden_size, T)
    u = float(np.finfo(np.float32).eps) / 2
    scale = float(np.abs(np.asarray(ref, np.float64)).max())
    assert scale > 0  # an all-zero reference would make any tolerance vacuous
    return dict(rtol=0, atol=n * u * cfg.num_layers * scale)


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == jnp.bfloat16 else dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_chunked_prefill_equals_one_block(monkeypatch, dtype, window):
    cfg, params, lora, tokens, mask = _setup(dtype, window)
    run = jax.jit(lambda p: forward(p, cfg, tokens, attention_mask=mask, lora=lora))
    want = run(params)
    monkeypatch.setattr(tr, "ATTENTION_QUERY_CHUNK", 4)  # 13 = 4 + 4 + 4 + 1 (padded chunk)
    got = jax.jit(lambda p: forward(p, cfg, tokens, attention_mask=mask, lora=lora))(params)
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(
        np.asarray(got, np.float32)[real], np.asarray(want, np.float32)[real], **_tol(dtype)
    )
    if dtype == jnp.float32:
        # Unrolled layers take the same attention path.
        got_u = forward(per_layer_params(params), cfg, tokens, attention_mask=mask, lora=lora)
        np.testing.assert_allclose(np.asarray(got_u)[real], np.asarray(want)[real], atol=1e-6)


def test_chunked_attention_gradients_and_cache_blocks(monkeypatch):
    cfg, params, lora, tokens, mask = _setup(jnp.float32, 6)

    def loss(lora):
        h = hidden_states(params, cfg, tokens, attention_mask=mask, lora=lora)
        return jnp.sum(jnp.sin(h) * mask[..., None])

    want_l, want_g = jax.jit(jax.value_and_grad(loss))(lora)
    # A prompt chunk into a cache: the cache block and the new-token block, queries chunked.
    cache = init_cache(cfg, B, T + 3)
    _, cache = hidden_states(params, cfg, tokens[:, :5], attention_mask=mask[:, :5], cache=cache)
    want_c, _ = hidden_states(params, cfg, tokens[:, 5:], attention_mask=mask[:, 5:], cache=cache)

    monkeypatch.setattr(tr, "ATTENTION_QUERY_CHUNK", 3)
    got_l, got_g = jax.jit(jax.value_and_grad(loss))(lora)
    # Both losses sum sin(h) in the same order; sin is 1-Lipschitz, so they differ by at most the
    # number of summed hidden values times the bound on each (not relative to the cancelling sum).
    h = hidden_states(params, cfg, tokens, attention_mask=mask, lora=lora)
    summed = int(np.asarray(mask).sum()) * cfg.hidden_size
    np.testing.assert_allclose(got_l, want_l, rtol=0, atol=summed * _rounding_tol(cfg, h)["atol"])
    for g, w in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g), strict=True):
        np.testing.assert_allclose(g, w, **_rounding_tol(cfg, w))
    got_c, _ = hidden_states(params, cfg, tokens[:, 5:], attention_mask=mask[:, 5:], cache=cache)
    real = np.asarray(mask[:, 5:], bool)
    want_real = np.asarray(want_c)[real]
    np.testing.assert_allclose(np.asarray(got_c)[real], want_real, **_rounding_tol(cfg, want_real))


def test_chunked_path_has_no_full_score_matrix(monkeypatch):
    """The compiled long-prompt pass holds no [B, Hkv, g, T, T] buffer (only chunk-sized ones)."""
    cfg, params, lora, _, _ = _setup(jnp.float32)
    Tl = 48  # scores are [B, Hkv, g, T, S] = 1x2x2x48x48 unchunked
    tokens = jnp.ones((1, Tl), jnp.int32)
    monkeypatch.setattr(tr, "ATTENTION_QUERY_CHUNK", 16)
    hlo = jax.jit(lambda p: hidden_states(p, cfg, tokens, lora=lora)).lower(params).as_text()
    assert f"2x2x{Tl}x{Tl}xf32" not in hlo and f"2x2x16x{Tl}xf32" in hlo


@pytest.mark.parametrize("stacked", [True, False])
def test_remat_same_values_and_gradients(stacked):
    cfg, params, lora, tokens, mask = _setup(jnp.float32, None)
    p = params if stacked else per_layer_params(params)

    def loss(lora, remat):
        logits = forward(p, cfg, tokens, attention_mask=mask, lora=lora, remat=remat)
        return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask)

    want = jax.jit(jax.value_and_grad(loss), static_argnums=1)(lora, False)
    got = jax.jit(jax.value_and_grad(loss), static_argnums=1)(lora, True)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
