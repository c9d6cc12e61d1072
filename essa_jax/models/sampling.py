"""Picking the next token from logits [B, V]: greedy, or a draw from softmax(logits / T).

Both are written for what a decode step on CPU spends its time on (SmolLM2, V = 49152, batch 64;
docs/ARCHITECTURE.md, Contracts, essa_jax.models):

* `greedy_tokens` is argmax as two vectorised reductions (the max, then the first index that
  holds it): XLA's CPU argmax is one variadic (value, index) reduction that does not vectorise.
* `draw_tokens` inverts the CDF with one uniform per row, in two levels (block masses, then one
  block), instead of `jax.random.categorical`'s Gumbel-max, which draws V Gumbel variates per
  row: 3.1 ms against 38.7 ms per step (experiments/results/decode_profile.json, 2026-12-05),
  about a fifth of a sampled decode step before. It draws from the same distribution (exactly,
  up to float32 rounding of the partial sums).

The same functions run on every backend; both are a few memory-bound passes over [B, V].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Tokens per block of the two-level CDF: about sqrt(V) for vocabularies of 32k-152k, so both
# levels' cumulative sums are short.
CDF_BLOCK = 512


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """argmax over the last axis of logits [B, V] -> int32 [B], exactly as `jnp.argmax`: the first
    maximal index, and the first NaN's index when a row holds a NaN."""
    V = logits.shape[-1]
    top = jnp.max(logits, axis=-1, keepdims=True)  # NaN when the row holds one
    hit = (logits == top) | jnp.isnan(logits)
    return jnp.min(jnp.where(hit, jnp.arange(V, dtype=jnp.int32), V), axis=-1)


def _first_above(cum: jax.Array, target: jax.Array, mass: jax.Array) -> jax.Array:
    """Per row, the first index i with cum[i] > target (cum [B, n] non-decreasing, target [B]):
    the entry whose CDF interval holds the target, which always has mass > 0. Where rounding puts
    the target at or above the last cumulative value, the last index with mass > 0."""
    n = cum.shape[-1]
    idx = jnp.arange(n, dtype=jnp.int32)
    first = jnp.sum(cum <= target[:, None], axis=-1, dtype=jnp.int32)
    last_with_mass = jnp.max(jnp.where(mass > 0, idx, 0), axis=-1)
    return jnp.minimum(first, last_with_mass)


def draw_tokens(u: jax.Array, logits: jax.Array, block: int = CDF_BLOCK) -> jax.Array:
    """Tokens int32 [B] drawn from softmax(logits) [B, V] by inverting its CDF at u [B] in [0, 1).

    Inverse-transform sampling: token t is drawn when u * Z falls in [c_{t-1}, c_t), c the
    cumulative unnormalised masses exp(logit - max), Z their total. Two levels keep every
    cumulative sum short: the block (of `block` tokens) whose cumulative mass passes u * Z, then
    the token inside it. Tokens of zero mass (logit -inf, e.g. removed by top-k / top-p) are
    never drawn. With u from one key per row, a row's draw does not depend on the batch.
    """
    B, V = logits.shape
    nb = -(-V // block)
    top = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.exp(logits - top)
    p = jnp.pad(p, ((0, 0), (0, nb * block - V))).reshape(B, nb, block)
    block_mass = p.sum(-1)  # [B, nb]
    cum = jnp.cumsum(block_mass, axis=-1)
    target = u.astype(cum.dtype) * cum[:, -1]
    b = _first_above(cum, target, block_mass)
    before = jnp.where(b > 0, jnp.take_along_axis(cum, jnp.maximum(b - 1, 0)[:, None], -1)[:, 0], 0)
    inner = jnp.take_along_axis(p, b[:, None, None], axis=1)[:, 0]  # [B, block]
    j = _first_above(jnp.cumsum(inner, axis=-1), target - before, inner)
    return (b * block + j).astype(jnp.int32)


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Top-k (Fan et al. 2018) then nucleus / top-p (Holtzman et al. 2020) filtering of [B, V]."""
    if top_k and top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if not (isinstance(top_p, int | float) and top_p >= 1.0):
        sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p: a token is kept if the mass strictly
        # before it is < top_p (so the most likely token is always kept).
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def sample_tokens(
    key: jax.Array | None,
    logits: jax.Array,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy: bool,
    per_row: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Pick a token per row from logits [B, V]; return (tokens int32 [B], logprobs [B]).

    greedy: the argmax (key unused). Otherwise a draw from softmax(filter(logits / temperature))
    with one uniform per row: from `key`, or from key[b] for row b when per_row (key [B]).
    The logprob is the token's log_softmax(logits / temperature): the behaviour policy at the
    sampling temperature, before top-k / top-p, which importance ratios need.
    """
    scaled = logits / temperature
    if greedy:
        tok = greedy_tokens(logits)
    else:
        B = logits.shape[0]
        if per_row:
            u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key)
        else:
            u = jax.random.uniform(key, (B,), jnp.float32)
        tok = draw_tokens(u, filter_logits(scaled, top_k, top_p))
    # log_softmax(scaled)[tok] without writing the [B, V] log_softmax out (a tenth of a SmolLM2
    # decode step at batch 256 went to it): only the logsumexp reduction touches all of V.
    chosen = jnp.take_along_axis(scaled, tok[:, None], axis=-1)[:, 0]
    return tok, chosen - jax.nn.logsumexp(scaled, axis=-1)
