"""Per-token log-probabilities of a sequence under the model, computed in time chunks.

The full [B, T, V] float32 logits of a realistic batch do not fit (SmolLM2, B=64, T=57: 0.7 GB for
the logits alone, several times that in the backward pass), so the lm_head and log-softmax run over
chunks of the time axis under `lax.map` with `jax.checkpoint`: the backward pass recomputes each
chunk's logits instead of keeping them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from essa_jax.models.config import ModelConfig
from essa_jax.models.transformer import LayerGather, Params, hidden_states, output_kernel

_CHUNK_ELEMENTS = 1 << 25  # ~128 MiB of float32 logits per chunk.


def sequence_logprobs(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    attention_mask: jax.Array,
    *,
    lora: Mapping[str, Any] | None = None,
    positions: jax.Array | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_size: int | None = None,
    remat: bool = False,
    last: int | None = None,
    gather: LayerGather | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for t < T-1: [B, T-1] float32 (and entropies).

    tokens, attention_mask: [B, T] (left-padded; 1 = real token). Entries whose target token is
    padding, or whose previous token is padding, are 0. `temperature` divides the logits (to
    match `generate`'s sampling distribution).
    Entropy is that of the full next-token distribution, [B, T-1]. `chunk_size` (time steps per
    chunk) defaults to keep each chunk's logits near 128 MiB. Differentiable (w.r.t. params and
    lora) without materialising [B, T, V]. `remat` checkpoints each decoder layer
    (`hidden_states`): the backward pass keeps one [B, T, d] input per layer instead of the
    layer's activations. `gather`: FSDP's per-layer gather of sharded layer weights
    (`hidden_states`); the other leaves come whole.

    `last` = K scores only the final K targets (tokens[:, T-K:]): [B, K], equal to the last K
    columns of the full result. The lm_head, its log-softmax and the entropy (a [V]-wide pass
    each, about a third of a SmolLM2 token's forward and backward cost) then run only there:
    a policy-gradient loss reads only the completion's log-probs, not the prompt's.
    """
    B, T = tokens.shape
    n = T - 1 if last is None else last
    if not 1 <= n <= T - 1:
        raise ValueError(f"last={last} must be in [1, T-1 = {T - 1}]")
    h = hidden_states(
        params,
        config,
        tokens,
        attention_mask=attention_mask,
        positions=positions,
        lora=lora,
        remat=remat,
        gather=gather,
    )[:, T - 1 - n : T - 1]
    targets = tokens[:, T - n :]
    if chunk_size is None:
        chunk_size = max(1, min(n, _CHUNK_ELEMENTS // max(1, B * config.vocab_size)))
    num_chunks = -(-n // chunk_size)
    pad = num_chunks * chunk_size - n
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [num_chunks, B, chunk, ...] so lax.map walks the chunks.
    h = h.reshape(B, num_chunks, chunk_size, -1).swapaxes(0, 1)
    targets = targets.reshape(B, num_chunks, chunk_size).swapaxes(0, 1)
    w = output_kernel(params, config)

    @jax.checkpoint
    def chunk(xs):
        hc, tc = xs
        logits = jnp.matmul(hc, w, preferred_element_type=jnp.float32) / temperature
        logz = jax.nn.logsumexp(logits, axis=-1)
        lp = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0] - logz
        probs = jnp.exp(logits - logz[..., None])
        ent = logz - jnp.sum(probs * logits, axis=-1)
        return lp, ent

    lp, ent = jax.lax.map(chunk, (h, targets))
    # A target counts only if it and the token before it are real (the first real token of a
    # left-padded row has no prefix to be predicted from).
    valid = (attention_mask[:, T - n :] * attention_mask[:, T - 1 - n : T - 1]).astype(jnp.float32)
    lp = lp.swapaxes(0, 1).reshape(B, -1)[:, :n] * valid
    if not return_entropy:
        return lp
    ent = ent.swapaxes(0, 1).reshape(B, -1)[:, :n] * valid
    return lp, ent
