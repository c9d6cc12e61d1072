"""Grouped-query attention of the decoder (`models.transformer`), in float32 or fused.

Causal masked GQA (Ainslie et al. 2023) over one or more key blocks (cache | new tokens), the
softmax taken jointly over all of them; long prompts attended in query chunks (docs/
ARCHITECTURE.md, "Training memory"); a pass without a cache on a GPU with 16-bit activations runs
cuDNN's flash attention through `jax.nn.dot_product_attention` (`self_attention` forces a mode).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

_NEG = -1e30  # finite "minus infinity": fully masked rows (padding queries) stay NaN-free.
# Queries per attention chunk of a long prompt (see `attention`): bounds the float32 scores to
# [B, Hq, ATTENTION_QUERY_CHUNK, S] per layer. Read at trace time; tests lower it.
ATTENTION_QUERY_CHUNK = 512


# How a pass without a cache (a prompt into a fresh cache, a training forward) attends: None = by
# backend (cuDNN flash attention through `jax.nn.dot_product_attention` on GPU with 16-bit
# activations, the float32 einsum of `attention` elsewhere), or forced: "einsum", "xla" (jax's
# reference implementation of the same call: how CPU tests check the fused path's masks) or
# "cudnn". See `self_attention`; the environment variable ESSA_JAX_SELF_ATTENTION sets it for a
# whole process (e.g. =einsum, should a GPU's cuDNN fail where it claimed support).
SELF_ATTENTION_MODES = ("einsum", "xla", "cudnn")
_SELF_ATTENTION: str | None = os.environ.get("ESSA_JAX_SELF_ATTENTION") or None
if _SELF_ATTENTION is not None and _SELF_ATTENTION not in SELF_ATTENTION_MODES:
    raise ValueError(
        f"ESSA_JAX_SELF_ATTENTION={_SELF_ATTENTION!r}: valid values are {SELF_ATTENTION_MODES}"
    )


@contextlib.contextmanager
def retraced(get: Callable[[], Any], set_: Callable[[Any], None], value: Any):
    """A trace-time mode switch: `set_(value)` for the block, the previous `get()` restored after.
    JAX's trace caches are cleared on entry and exit, so a program traced under one mode is never
    reused under another (`self_attention`, `generate.decode_layers`)."""
    previous = get()
    set_(value)
    jax.clear_caches()
    try:
        yield
    finally:
        set_(previous)
        jax.clear_caches()


def _set_self_attention(mode: str | None) -> None:
    global _SELF_ATTENTION
    _SELF_ATTENTION = mode


def self_attention(mode: str) -> contextlib.AbstractContextManager:
    """Within this block, programs traced attend without a cache by `mode` (SELF_ATTENTION_MODES)
    whatever the backend (`retraced`)."""
    if mode not in SELF_ATTENTION_MODES:
        raise ValueError(f"self_attention mode {mode!r}: valid modes are {SELF_ATTENTION_MODES}")
    return retraced(lambda: _SELF_ATTENTION, _set_self_attention, mode)


def _fused_implementation(dtype: Any) -> str | None:
    """The `jax.nn.dot_product_attention` implementation for a pass without a cache, or None for
    the einsum path (see `_SELF_ATTENTION`)."""
    if _SELF_ATTENTION is not None:
        return None if _SELF_ATTENTION == "einsum" else _SELF_ATTENTION
    gpu = jax.default_backend() == "gpu"
    return "cudnn" if gpu and dtype in (jnp.bfloat16, jnp.float16) else None


def _fused_self_attention(
    q: jax.Array,
    q_slots: jax.Array,
    block: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
    sliding_window: int | None,
    implementation: str,
) -> jax.Array | None:
    """`attention` of one key block through `jax.nn.dot_product_attention` (cuDNN's flash
    attention on GPU: no [T, S] scores in memory, the causal half skipped), [B, T, Hq*hd] float32;
    None when that implementation refuses the shapes or dtypes (the caller then takes the einsum
    path). The mask is `_attention_block`'s, plus each query's own slot: a left-padding query
    sees no key at all, and an empty softmax row is NaN in flash kernels, which the PV product
    would spread (0 * NaN) to real rows; its output is never read.
    """
    k, v, k_slots, key_mask = block
    B, T, Hq, hd = q.shape
    ok = _visible(q_slots, k_slots, sliding_window)
    mask = ok[None, None] & key_mask[:, None, None, :]  # [B, 1, T, S]
    mask |= (k_slots[None, :] == q_slots[:, None])[None, None]
    # [B, S, Hkv, hd], the layout of the call (the cache's is head-major).
    kt, vt = (jnp.swapaxes(x, 1, 2).astype(q.dtype) for x in (k, v))
    call = functools.partial(jax.nn.dot_product_attention, mask=mask, implementation=implementation)
    if implementation != "cudnn":
        out = call(q, kt, vt)
    else:
        try:  # cuDNN supports a subset of shapes, dtypes and head sizes; it says so by raising
            out = call(q, kt, vt)
        except (NotImplementedError, ValueError, RuntimeError, TypeError):
            return None
    return out.reshape(B, T, Hq * hd).astype(jnp.float32)


def attention(
    q: jax.Array,
    q_slots: jax.Array,
    blocks: Sequence[tuple[jax.Array, jax.Array, jax.Array, jax.Array]],
    sliding_window: int | None,
    q_chunk: int | None = None,
    fusable: bool = False,
) -> jax.Array:
    """Causal masked GQA over one or more key blocks, softmax taken jointly over all of them.

    q [B, T, Hq, hd]; q_slots [T]; blocks: (k, v [B, Hkv, S_i, hd], k_slots [S_i], key_mask
    [B, S_i]) each. A query at slot t sees key slots s <= t with key_mask True (and t - s < window).
    Splitting the keys into blocks (cache | new tokens) gives exactly the softmax over their
    concatenation without materialising it. Returns [B, T, Hq*hd] in float32.

    Keys and values are head-major ([B, Hkv, S, hd], as the cache stores them) so that both
    contractions are batched over (b, kv head) with contiguous [S, hd] operands: with the
    sequence-major layout XLA transposed the whole cache block on every decode step, which took
    more than half of a SmolLM2 decode step at batch 256.

    Long prompts (T > q_chunk, default ATTENTION_QUERY_CHUNK) are attended q_chunk queries at a
    time under `lax.map`, each chunk rematerialised in the backward pass (`jax.checkpoint`): the
    float32 scores and probabilities then live as [B, Hq, q_chunk, S] per chunk instead of
    [B, Hq, T, S] (Qwen2.5-7B, T = 4096: 1.9 GB per row and layer, twice that in the backward
    pass). Each query's softmax is over all its keys either way (rows of a softmax are
    independent), so the chunked result is the same function; decode (T = 1) never chunks.

    fusable (a pass without a cache: the block is the tokens themselves): on GPU with 16-bit
    activations, `_fused_self_attention` (cuDNN flash attention) computes the same function in
    the activations' dtype, with float32 accumulation, instead (`self_attention` forces a mode).
    """
    B, T, Hq, hd = q.shape
    impl = _fused_implementation(q.dtype) if fusable and len(blocks) == 1 and T > 1 else None
    if impl is not None:
        out = _fused_self_attention(q, q_slots, blocks[0], sliding_window, impl)
        if out is not None:
            return out
    Hkv = blocks[0][0].shape[1]
    qf = q.astype(jnp.float32).reshape(B, T, Hkv, Hq // Hkv, hd) * (1.0 / math.sqrt(hd))
    qf = jnp.transpose(qf, (0, 2, 3, 1, 4))  # [B, Hkv, g, T, hd]
    chunk = ATTENTION_QUERY_CHUNK if q_chunk is None else q_chunk
    if T <= chunk:
        out = _attention_block(qf, q_slots, blocks, sliding_window)
    else:
        n = -(-T // chunk)
        pad = n * chunk - T
        # Padded queries get slot -1 (they see no key: a finite, dropped row).
        qp = jnp.pad(qf, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
        sp = jnp.pad(q_slots, (0, pad), constant_values=-1)
        # [n, B, Hkv, g, chunk, hd]: lax.map walks the chunks.
        qp = jnp.moveaxis(qp.reshape(B, Hkv, Hq // Hkv, n, chunk, hd), 3, 0)

        @functools.partial(jax.checkpoint, prevent_cse=False)
        def one(xs):
            qc, sc = xs
            return _attention_block(qc, sc, blocks, sliding_window)

        out = jax.lax.map(one, (qp, sp.reshape(n, chunk)))  # [n, B, Hkv, g, c, hd]
        out = jnp.moveaxis(out, 0, 3).reshape(B, Hkv, Hq // Hkv, n * chunk, hd)[:, :, :, :T]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(B, T, Hq * hd)


def _visible(q_slots: jax.Array, k_slots: jax.Array, sliding_window: int | None) -> jax.Array:
    """[T, S] bool: query slot t may see key slot s (causal: s <= t; and t - s < window)."""
    ok = k_slots[None, :] <= q_slots[:, None]
    if sliding_window is not None:
        ok &= q_slots[:, None] - k_slots[None, :] < sliding_window
    return ok


def _attention_block(
    qf: jax.Array,
    q_slots: jax.Array,
    blocks: Sequence[tuple[jax.Array, jax.Array, jax.Array, jax.Array]],
    sliding_window: int | None,
) -> jax.Array:
    """`attention` of scaled float32 queries qf [B, Hkv, g, T, hd] -> [B, Hkv, g, T, hd]."""
    scores, allowed = [], []
    for k, _, k_slots, key_mask in blocks:
        scores.append(jnp.einsum("bkgtd,bksd->bkgts", qf, k.astype(jnp.float32)))
        ok = _visible(q_slots, k_slots, sliding_window)  # [T, S_i]
        allowed.append(ok[None, None, None] & key_mask[:, None, None, None, :])  # [B, 1, 1, T, S_i]
    # One select over the concatenated blocks: masking a block on its own lets XLA constant-fold
    # it when the cache is a constant (a prefill from init_cache), which takes seconds to compile.
    scores = jnp.where(jnp.concatenate(allowed, -1), jnp.concatenate(scores, -1), _NEG)
    probs = jax.nn.softmax(scores, axis=-1)
    outs, start = [], 0
    for k, v, _, _ in blocks:
        p = jax.lax.slice_in_dim(probs, start, start + k.shape[2], axis=-1)
        outs.append(jnp.einsum("bkgts,bksd->bkgtd", p, v.astype(jnp.float32)))
        start += k.shape[2]
    return functools.reduce(jnp.add, outs)  # [B, Hkv, g, T, hd]
