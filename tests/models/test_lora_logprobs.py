"""The LoRA hook (against merging the delta into the kernel) and chunked sequence log-probs."""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from essa_jax.models import forward, generate_jit, pad_left, sequence_logprobs


@flax.struct.dataclass
class TinyLoRA:
    """delta(x) = x a^T b^T with a [L, r, in], b [L, out, r] (sliced to one layer by the scan)."""

    a: jax.Array
    b: jax.Array

    def delta(self, x):
        return (x @ self.a.T) @ self.b.T


def _adapters(params, key, targets=("q", "v", "down"), r=3):
    out = {}
    for i, t in enumerate(targets):
        L, n_in, n_out = params["layers"][t]["kernel"].shape
        ka, kb = jax.random.split(jax.random.fold_in(key, i))
        out[t] = TinyLoRA(
            a=0.3 * jax.random.normal(ka, (L, r, n_in)),
            b=0.3 * jax.random.normal(kb, (L, n_out, r)),
        )
    return out


def _merged(params, lora):
    layers = dict(params["layers"])
    for t, ad in lora.items():
        # delta W^T for [in, out] kernels: (b a)^T = a^T b^T, per layer.
        dw = jnp.einsum("lri,lor->lio", ad.a, ad.b)
        layers[t] = {**layers[t], "kernel": layers[t]["kernel"] + dw}
    return {**params, "layers": layers}


def _batch():
    return pad_left([[5, 17, 9, 22, 41, 8, 30, 12], [7, 11, 13, 19, 23], [50, 2, 44]], pad_id=0)


def test_lora_hook_equals_merged_kernel(tiny_model, fwd):
    config, params = tiny_model
    lora = _adapters(params, jax.random.key(1))
    tokens, mask = _batch()
    with_hook = fwd(params, config, tokens, attention_mask=mask, lora=lora)
    merged = fwd(_merged(params, lora), config, tokens, attention_mask=mask)
    base = fwd(params, config, tokens, attention_mask=mask)
    np.testing.assert_allclose(np.asarray(with_hook), np.asarray(merged), atol=1e-4)
    assert float(jnp.max(jnp.abs(with_hook - base))) > 1e-2  # the adapter does something


def test_lora_in_generate_equals_merged(tiny_model):
    config, params = tiny_model
    lora = _adapters(params, jax.random.key(2), targets=("k", "o", "gate", "up"))
    tokens, mask = _batch()
    kw = dict(max_new_tokens=6, greedy=True, eos_token_ids=())
    a = generate_jit(params, config, tokens, mask, jax.random.key(0), lora=lora, **kw)
    b = generate_jit(_merged(params, lora), config, tokens, mask, jax.random.key(0), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-4)


def _naive(params, config, tokens, mask, lora):
    logits = forward(params, config, tokens, attention_mask=mask, lora=lora)[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    lp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    valid = mask[:, 1:] * mask[:, :-1]
    return lp * valid, ent * valid


def test_sequence_logprobs_chunked_matches_full_softmax(tiny_model):
    config, params = tiny_model
    lora = _adapters(params, jax.random.key(3))
    tokens, mask = _batch()
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)

    @jax.jit
    def both(lora):
        # chunk_size 3 does not divide T - 1 = 7: checks the padding of the last chunk.
        lp, ent = sequence_logprobs(
            params, config, tokens, mask, lora=lora, return_entropy=True, chunk_size=3
        )
        ref_lp, ref_ent = _naive(params, config, tokens, mask, lora)
        grad = jax.grad(
            lambda l: jnp.sum(sequence_logprobs(params, config, tokens, mask, lora=l, chunk_size=3))
        )(lora)
        ref_grad = jax.grad(lambda l: jnp.sum(_naive(params, config, tokens, mask, l)[0]))(lora)
        return lp, ent, ref_lp, ref_ent, grad, ref_grad

    lp, ent, ref_lp, ref_ent, grad, ref_grad = both(lora)
    assert lp.shape == (3, 7)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(ref_lp), atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(ref_ent), atol=1e-5)
    assert float(jnp.max(jnp.abs(lp))) > 0.1
    # Padding targets (and the first real token of padded rows) are zeroed.
    np.testing.assert_array_equal(np.asarray(lp)[2, :5], 0.0)
    for g, r in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("last", [1, 4, 7])
def test_sequence_logprobs_last_scores_only_the_final_targets(tiny_model, last):
    """`last` = K (what GRPO uses for the completion) gives the final K columns of the full
    result, entropies and gradients included; an impossible K is refused."""
    config, params = tiny_model
    lora = _adapters(params, jax.random.key(4))
    tokens, mask = (jnp.asarray(x) for x in _batch())

    def run(lora, last):
        return sequence_logprobs(
            params, config, tokens, mask, lora=lora, return_entropy=True, chunk_size=3, last=last
        )

    lp, ent = run(lora, last)
    full_lp, full_ent = run(lora, None)
    assert lp.shape == (3, last)
    np.testing.assert_allclose(np.asarray(lp), np.asarray(full_lp[:, -last:]), atol=1e-6)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(full_ent[:, -last:]), atol=1e-6)
    weights = jax.random.normal(jax.random.key(5), (3, last))
    grad = jax.grad(lambda l: jnp.sum(weights * run(l, last)[0]))(lora)
    full_grad = jax.grad(lambda l: jnp.sum(weights * run(l, None)[0][:, -last:]))(lora)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)) > 1e-4
    for g, r in zip(jax.tree.leaves(grad), jax.tree.leaves(full_grad), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="last=8"):
        run(lora, 8)
