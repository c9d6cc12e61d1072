"""Llama-family decoder as pure functions over a params pytree.

Pre-norm blocks (RMSNorm, Zhang & Sennrich 2019), rotary position embeddings (RoPE, Su et al. 2021,
with HF's rotate-half layout), grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP
(Shazeer 2020). Layers are stacked on a leading axis and run with `lax.scan`, so compile time does
not grow with depth (`per_layer_params` gives an unrolled alternative for CPU decoding).
Attention is computed in float32 whatever the parameter dtype, except a pass without a cache on a
GPU with 16-bit activations, which runs cuDNN's flash attention (`models.attention`).

Params layout (kernels are `[in, out]`):
    {"embed": [V, d], "layers": {"attn_norm": [L, d], "q": {"kernel": [L, d, Hq*hd], "bias"?},
     "k": {...}, "v": {...}, "o": {"kernel": [L, Hq*hd, d]}, "mlp_norm": [L, d],
     "gate": {"kernel": [L, d, I]}, "up": {...}, "down": {"kernel": [L, I, d]}},
     "final_norm": [d], "lm_head"?: {"kernel": [d, V]}}

Quantised kernels: a projection's "kernel" may be a `quant.QuantizedKernel` (int8 / int4 weights,
`model.quantize`); `_proj` multiplies it with `quant.qmatmul` (docs/ARCHITECTURE.md, "Quantised
inference"), everything else is unchanged.

LoRA hook: `lora = {target: adapter}`; every array leaf of an adapter has a leading layer axis L and
is scanned with the layer params; projection `target` of layer l computes
`y = x @ kernel (+ bias) + adapter_l.delta(x)`. A fused key ("qkv", "gate_up"; see
FUSED_LORA_TARGETS) holds one adapter for projections of the same input, its delta split over them.

Tensor parallelism (docs/ARCHITECTURE.md, "Tensor parallelism"): with params placed by
`essa_jax.mesh.place_params` (heads / MLP columns split over the mesh's Auto ``model`` axis), XLA
propagates the weights' shardings through these functions unchanged: the q/k/v column split gives
head-split attention and a head-split KV cache (Hkv is a multiple of the axis), o / down are
row-parallel (one all-reduce each per layer). No sharding constraint is needed here (checked in
tests/models/test_tensor_parallel.py against the compiled HLO and per-device bytes), so the code
is the same with or without a mesh.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from essa_jax.models.attention import attention
from essa_jax.models.config import PROJECTIONS, ModelConfig
from essa_jax.models.quant import QuantizedKernel, qmatmul

# Fused LoRA keys: one adapter for projections that read the same input, whose delta's output is
# theirs concatenated in this order (e.g. [.., Hq*hd + 2*Hkv*hd] for "qkv"). Low-rank paths are
# thin matmuls; one [in, 3r] matmul instead of three [in, r] ones saves two passes over x and,
# in decode, two dispatches of a matmul too small to keep the cores busy.
FUSED_LORA_TARGETS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
Params = dict[str, Any]
# FSDP's per-layer gather (`hidden_states(gather=)`): one layer's weight shards -> its weights.
LayerGather = Callable[[Params], Params]
# The name of a layer's gathered weights (`jax.ad_checkpoint.checkpoint_name`), which the layer's
# checkpoint policy leaves out of the backward pass's residuals.
GATHERED = "fsdp_gathered_weights"


@flax.struct.dataclass
class KVCache:
    """Key/value cache for incremental decoding.

    k, v: [L, B, Hkv, S, hd] (S = capacity in slots; head-major, `models.attention`); mask: [B, S]
    bool, True where a slot holds a real token; next_pos: [B] int32, RoPE position of each row's
    next real token; index: scalar int32, the next slot to write (shared by all rows: batches are
    left-padded). With per-layer params, k and v may also be tuples of L `[B, Hkv, S, hd]` arrays
    (`per_layer_cache`).
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    next_pos: jax.Array
    index: jax.Array


def init_cache(
    config: ModelConfig, batch_size: int, max_len: int, dtype: Any = jnp.float32
) -> KVCache:
    """An empty cache of `max_len` slots per row."""
    shape = (config.num_layers, batch_size, config.num_kv_heads, max_len, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        mask=jnp.zeros((batch_size, max_len), bool),
        next_pos=jnp.zeros((batch_size,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )


def init_params(key: jax.Array, config: ModelConfig, dtype: Any = jnp.float32) -> Params:
    """Random params (normal, std 0.02; norm weights 1 + small noise) for tests and tiny configs."""
    c = config
    L, d, i, hd = c.num_layers, c.hidden_size, c.intermediate_size, c.head_dim
    dq, dkv = c.num_heads * hd, c.num_kv_heads * hd
    keys = iter(jax.random.split(key, 16))

    def normal(shape, std=0.02):
        return (std * jax.random.normal(next(keys), shape, jnp.float32)).astype(dtype)

    def dense(n_in, n_out, bias=False):
        p = {"kernel": normal((L, n_in, n_out))}
        if bias:
            p["bias"] = normal((L, n_out))
        return p

    layers = {
        "attn_norm": 1.0 + normal((L, d), 0.1),
        "q": dense(d, dq, c.attention_bias),
        "k": dense(d, dkv, c.attention_bias),
        "v": dense(d, dkv, c.attention_bias),
        "o": dense(dq, d),
        "mlp_norm": 1.0 + normal((L, d), 0.1),
        "gate": dense(d, i),
        "up": dense(d, i),
        "down": dense(i, d),
    }
    params = {
        "embed": normal((c.vocab_size, d)),
        "layers": layers,
        "final_norm": 1.0 + normal((d,), 0.1),
    }
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": normal((d, c.vocab_size))}
    return params


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies [hd/2] (float32), with linear or Llama-3 scaling applied.

    theta_j = base^(-2j/hd) (Su et al. 2021, eq. 15); Llama 3 scaling follows transformers'
    `_compute_llama3_parameters`: wavelengths above original_len/low_freq_factor are divided by
    `factor`, those below original_len/high_freq_factor kept, the band between interpolated.
    """
    hd = config.head_dim
    exponent = np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / np.float32(hd)
    inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponent)).astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv_freq
    if s.rope_type == "linear":
        return (inv_freq / np.float32(s.factor)).astype(np.float32)
    old_len = s.original_max_position_embeddings
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, 1, hd] (float32) of the RoPE angles positions [B, T] x inv_freq [hd/2]."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, hd/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, H, hd] by the angles of `_rope_tables` (HF rotate-half convention), in
    float32."""
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019, eq. 4), statistics in float32 as in HF."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight * xf.astype(x.dtype)


def _proj(x: jax.Array, p: Mapping[str, jax.Array], adapter: Any) -> jax.Array:
    # Accumulate in float32 and round once (what a bf16 matmul does on GPU / TPU anyway). Asking
    # for it explicitly also keeps XLA's CPU compiler from upcasting a bfloat16 kernel to a
    # float32 copy for the product (a second, doubled copy of the weights in a program's memory).
    kernel = p["kernel"]
    if isinstance(kernel, QuantizedKernel):
        # int8 / int4 weights (model.quantize, `quant.py`): the same float32 accumulation; the
        # activations, bias and adapter stay in the compute dtype.
        y = qmatmul(x, kernel)
    else:
        y = jnp.matmul(x, kernel, preferred_element_type=jnp.float32)
    y = y.astype(jnp.result_type(x.dtype, kernel.dtype))
    if "bias" in p:
        y = y + p["bias"]
    if adapter is not None:
        y = y + adapter.delta(x).astype(y.dtype)
    return y


def _proj_shared_input(
    x: jax.Array, p: Mapping[str, Any], ad: Mapping[str, Any], fused: str
) -> list[jax.Array]:
    """The projections of FUSED_LORA_TARGETS[fused] of one input x, with per-target adapters or
    one fused adapter `ad[fused]` whose delta is split along the last axis."""
    names = FUSED_LORA_TARGETS[fused]
    ys = [_proj(x, p[n], ad.get(n)) for n in names]
    if fused in ad:
        delta = ad[fused].delta(x)
        cuts = np.cumsum([y.shape[-1] for y in ys])[:-1].tolist()
        deltas = jnp.split(delta, cuts, axis=-1)
        ys = [y + d.astype(y.dtype) for y, d in zip(ys, deltas, strict=True)]
    return ys


def default_positions(attention_mask: jax.Array, offset: jax.Array | None = None) -> jax.Array:
    """RoPE positions for a left-padded batch: cumsum(mask) - 1 (+ offset [B]), clipped at 0."""
    pos = jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1
    if offset is not None:
        pos = pos + offset[:, None]
    return jnp.maximum(pos, 0)


def hidden_states(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    *,
    attention_mask: jax.Array | None = None,
    positions: jax.Array | None = None,
    lora: Mapping[str, Any] | None = None,
    cache: KVCache | None = None,
    remat: bool = False,
    gather: LayerGather | None = None,
) -> jax.Array | tuple[jax.Array, KVCache]:
    """Final (normed) hidden states [B, T, d] in the params dtype; `(h, cache)` with a cache.

    tokens [B, T] int; attention_mask [B, T] (1 = real token, left padding; default all 1);
    positions [B, T] (default cumsum(mask) - 1, continuing from `cache.next_pos`). With a cache the
    T tokens are written at slots `cache.index ... cache.index + T - 1` and attend to everything
    cached before them. params["layers"] is stacked, or the per-layer tuple of `per_layer_params`
    (same result, unrolled layer loop). For a prompt into an empty cache, `prefill` is faster.
    `remat=True` checkpoints each layer (`jax.checkpoint`): a backward pass keeps only each
    layer's input h [B, T, d] and recomputes the layer's activations (same values; about one more
    forward pass of compute). Without a cache only; it changes nothing without differentiation.

    `gather` (FSDP, docs/ARCHITECTURE.md "Full-parameter training"): params["layers"] holds each
    device's shard of the layer weights and `gather(layer)` (one layer's param dict, without the
    layer axis -> the whole layer's; `mesh.gather_outside_layers`) runs inside the layer loop, so
    one layer's whole weights exist at a time. Differentiated, the gathered weights are no
    residual of the backward pass (a layer checkpointed with every value saved but them,
    `GATHERED`): the backward gathers each layer again, as FSDP does. The other leaves (embed,
    final_norm, lm_head) must come whole.
    """
    h, cache, _ = _decoder(
        params, config, tokens, attention_mask, positions, lora, cache, None, remat, gather
    )
    return h if cache is None else (h, cache)


def prefill(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    *,
    max_len: int,
    attention_mask: jax.Array | None = None,
    positions: jax.Array | None = None,
    lora: Mapping[str, Any] | None = None,
    cache_dtype: Any = None,
) -> tuple[jax.Array, KVCache]:
    """The prompt pass into a fresh cache: `(h [B, T, d], cache)` with `max_len` slots per row.

    The same result as `hidden_states(..., cache=init_cache(config, B, max_len, cache_dtype))`
    (cache_dtype defaults to the params dtype), computed without that cache: the prompt attends
    only to itself (an empty cache has nothing to attend to) and its keys/values leave the layer
    loop as the cache itself, each layer's padded to `max_len` slots inside the loop (padding the
    stacked keys/values after it would copy them once more). Attending to `max_len` empty slots
    and writing a zeroed cache took about 7% of a SmolLM2 prompt pass at batch 16 (CPU).
    """
    B, T = tokens.shape
    if max_len < T:
        raise ValueError(f"max_len={max_len} is shorter than the prompt ({T} tokens)")
    if attention_mask is None:
        attention_mask = jnp.ones((B, T), bool)
    attention_mask = attention_mask.astype(bool)
    kv_dtype = cache_dtype or params["embed"].dtype
    h, _, (k, v) = _decoder(
        params, config, tokens, attention_mask, positions, lora, None, (kv_dtype, max_len)
    )
    cache = KVCache(
        k=k,
        v=v,
        mask=jnp.pad(attention_mask, ((0, 0), (0, max_len - T))),
        next_pos=attention_mask.sum(axis=1, dtype=jnp.int32),
        index=jnp.asarray(T, jnp.int32),
    )
    return h, cache


def _decoder(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    attention_mask: jax.Array | None,
    positions: jax.Array | None,
    lora: Mapping[str, Any] | None,
    cache: KVCache | None,
    kv_out: tuple[Any, int] | None,
    remat: bool = False,
    gather: LayerGather | None = None,
) -> tuple[jax.Array, KVCache | None, tuple[jax.Array, jax.Array] | None]:
    """`hidden_states`, returning (h, cache or None, new k/v or None). Without a cache and with
    `kv_out = (dtype, S)`, the new tokens' keys and values (cast to dtype, and attended as cast)
    come back stacked and zero-padded to S slots, [L, B, Hkv, S, hd] each (see `prefill`)."""
    c = config
    B, T = tokens.shape
    if attention_mask is None:
        attention_mask = jnp.ones((B, T), bool)
    attention_mask = attention_mask.astype(bool)
    layers = params["layers"]
    if isinstance(lora, Sequence):
        # Already split per layer (see `per_layer_lora`): only with per-layer params.
        if not isinstance(layers, Sequence) or len(lora) != len(layers):
            raise ValueError(
                f"a per-layer LoRA (a sequence of {len(lora)} dicts) needs per-layer params with "
                "as many layers (`per_layer_params`); pass the stacked {target: adapter} mapping "
                "with stacked params"
            )
        layer_lora = tuple(dict(ad) for ad in lora)
        targets = set().union(*layer_lora)
    else:
        lora = dict(lora or {})
        targets = set(lora)
        if isinstance(layers, Sequence):
            layer_lora = per_layer_lora(lora, len(layers))
    unknown = targets - set(PROJECTIONS) - set(FUSED_LORA_TARGETS)
    if unknown:
        raise ValueError(
            f"unknown LoRA targets {sorted(unknown)}; valid: {PROJECTIONS} or the fused "
            f"{sorted(FUSED_LORA_TARGETS)}"
        )
    for fused, names in FUSED_LORA_TARGETS.items():
        if fused in targets and targets & set(names):
            raise ValueError(
                f"LoRA target {fused!r} already adapts {names}; do not also pass "
                f"{sorted(targets & set(names))}"
            )
    if positions is None:
        positions = default_positions(attention_mask, None if cache is None else cache.next_pos)
    # Every layer rotates by the same angles: their cos/sin are computed once, not per layer.
    cos, sin = _rope_tables(positions, rope_inv_freq(c))
    dtype = params["embed"].dtype
    h = jnp.take(params["embed"], tokens, axis=0)

    cached = cache is not None
    q_slots = cache.index + jnp.arange(T) if cached else jnp.arange(T)
    if cached:
        cache_slots = jnp.arange(_cache_len(cache))
        new_mask = jax.lax.dynamic_update_slice(cache.mask, attention_mask, (0, cache.index))
    # The dtype the new tokens' k/v are stored in, and attended in (None: the activations').
    kv_dtype, kv_slots = kv_out or (None, None)
    kv_cast = jax.tree.leaves(cache.k)[0].dtype if cached else kv_dtype

    def padded(kv):
        """A layer's new (k, v) [B, Hkv, T, hd], zero-padded to kv_slots slots."""
        return tuple(jnp.pad(x, ((0, 0), (0, 0), (0, kv_slots - T), (0, 0))) for x in kv)

    def block(h, p, ad, kv_blocks):
        """One decoder layer; kv_blocks(k, v) -> the key blocks to attend to (`attention`)."""
        x = rms_norm(h, p["attn_norm"], c.rms_norm_eps)
        q, k, v = _proj_shared_input(x, p, ad, "qkv")
        q = q.reshape(B, T, c.num_heads, c.head_dim)
        k = k.reshape(B, T, c.num_kv_heads, c.head_dim)
        v = v.reshape(B, T, c.num_kv_heads, c.head_dim)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, Hkv, T, hd], the cache layout
        if kv_cast is not None:
            # Attend to the new tokens as they are stored (the cache dtype may be narrower).
            k, v = k.astype(kv_cast), v.astype(kv_cast)
        attn = attention(
            q, q_slots, kv_blocks(k, v), c.sliding_window, fusable=kv_blocks is self_only
        ).astype(dtype)
        h = h + _proj(attn, p["o"], ad.get("o"))
        x = rms_norm(h, p["mlp_norm"], c.rms_norm_eps)
        gate, up = _proj_shared_input(x, p, ad, "gate_up")
        gated = jax.nn.silu(gate) * up
        h = h + _proj(gated, p["down"], ad.get("down"))
        return h, (k, v)

    def self_only(k, v):
        return [(k, v, q_slots, attention_mask)]

    def whole(p):
        """A layer's weights as the block reads them: gathered (and named, so that no backward
        pass keeps them) with `gather`, else as they are."""
        return p if gather is None else checkpoint_name(gather(p), GATHERED)

    def self_block(h, p, ad):
        """A layer attending to its own tokens only (no cache): the layer that `remat` wraps."""
        return block(h, whole(p), ad, self_only)

    if remat and not cached:
        # Per-layer activation checkpointing: only h enters each layer's residuals (the layer's
        # params and adapters are inputs already); prevent_cse=False is safe under scan / a
        # straight-line loop and lets XLA fuse the recomputation.
        self_block = jax.checkpoint(self_block, prevent_cse=False)
    elif gather is not None and not cached:
        # FSDP without remat: keep every activation but not the gathered weights, which the
        # scan would otherwise stack into a whole model of residuals; the backward re-gathers.
        self_block = jax.checkpoint(self_block, prevent_cse=False, policy=_save_all_but_gathered)

    if cached and isinstance(cache.k, Sequence) and not isinstance(layers, Sequence):
        raise ValueError(
            "a per-layer cache (`per_layer_cache`) needs per-layer params (`per_layer_params`)"
        )
    if isinstance(layers, Sequence):
        # Per-layer params (see `per_layer_params`): a Python loop, so each matmul reads its kernel
        # where it lies (slicing stacked kernels inside a loop copies every kernel, every step).
        if cached:
            # Each layer's buffer is written and read where it lies; slicing layer i out of a
            # stacked cache would copy it, every layer, every step (`generate` passes a per-layer
            # cache; a stacked one is split here and stacked again at the end).
            stacked_cache = not isinstance(cache.k, Sequence)
            split = per_layer_cache(cache)
            ck, cv = list(split.k), list(split.v)
            if len(ck) != len(layers):
                raise ValueError(f"the cache has {len(ck)} layers, the params {len(layers)}")
        kv_new = []
        for i, p in enumerate(layers):
            ad = layer_lora[i]
            if not cached:
                h, kv = self_block(h, p, ad)
                kv_new.append(padded(kv) if kv_out else None)
                continue

            def write_then_read(k, v, i=i):
                # Write layer i's new k/v first, then read the layer back: the next write to the
                # cache depends (through h) on this read, so XLA updates the loop-carried cache
                # in place. In this unrolled loop, reading first and writing all layers at the end
                # leaves the reads unordered against the write: XLA then copies the whole cache.
                at = (0, 0, cache.index, 0)
                ck[i] = jax.lax.dynamic_update_slice(ck[i], k, at)
                cv[i] = jax.lax.dynamic_update_slice(cv[i], v, at)
                return [(ck[i], cv[i], cache_slots, new_mask)]

            h, _ = block(h, whole(p), ad, write_then_read)
        if cached:
            new_k, new_v = tuple(ck), tuple(cv)
            if stacked_cache:
                new_k, new_v = jnp.stack(new_k), jnp.stack(new_v)
        if not cached and kv_out:
            kv_new = (jnp.stack([k for k, _ in kv_new]), jnp.stack([v for _, v in kv_new]))
    elif not cached:

        def step(h, xs):
            p, ad = xs
            h, kv = self_block(h, p, ad)
            return h, (padded(kv) if kv_out else None)

        h, kv_new = jax.lax.scan(step, h, (layers, lora))
    else:
        # The cache is read-only inside the layer scan (layer l's slice arrives as xs) and the new
        # tokens' k/v leave as ys [L, B, Hkv, T, hd]; one dynamic_update_slice after the scan
        # writes them, in place when the cache buffer is loop-carried or donated. (Carrying the
        # cache through the scan instead costs a slice, a write and a write-back of a whole
        # layer of cache per layer.) Slots at or after cache.index are stale or empty: the new
        # tokens, attended as a second block, stand in for them.
        old_mask = cache.mask & (cache_slots < cache.index)[None, :]

        def step(h, xs):
            p, ad, k_l, v_l = xs

            def cache_then_self(k, v):
                return [(k_l, v_l, cache_slots, old_mask), *self_only(k, v)]

            return block(h, whole(p), ad, cache_then_self)

        h, (k_new, v_new) = jax.lax.scan(step, h, (layers, lora, cache.k, cache.v))
        at = (0, 0, 0, cache.index, 0)
        new_k = jax.lax.dynamic_update_slice(cache.k, k_new, at)
        new_v = jax.lax.dynamic_update_slice(cache.v, v_new, at)
    if cached:
        cache = KVCache(
            k=new_k,
            v=new_v,
            mask=new_mask,
            next_pos=cache.next_pos + attention_mask.sum(axis=1, dtype=jnp.int32),
            index=cache.index + T,
        )
    h = rms_norm(h, params["final_norm"], c.rms_norm_eps)
    return h, cache, (None if cached or not kv_out else kv_new)


def _save_all_but_gathered(prim: Any, *_: Any, **params: Any) -> bool:
    """The checkpoint policy of a layer with `gather`: every value may be saved for the backward
    pass except the gathered weights, i.e. values named GATHERED and the outputs of an all_gather,
    alone or as the primal of a custom VJP (`mesh.data_gather`'s). Naming alone does not do it:
    `save_anything_except_these_names` would recompute the name from its input, the gather's
    output, which it saves."""
    if prim.name == "name":
        return params["name"] != GATHERED
    if prim.name == "custom_vjp_call":
        return not any(e.primitive.name == "all_gather" for e in params["call_jaxpr"].jaxpr.eqns)
    return prim.name != "all_gather"


def per_layer_params(params: Params) -> Params:
    """`params` with "layers" as a tuple of L per-layer dicts (copies of the stacked slices `[l]`).

    `hidden_states` / `forward` accept either form and compute the same function. This one runs
    the layers as an unrolled Python loop (compile time grows with depth) whose matmuls read each
    kernel where it lies, while `lax.scan` over stacked kernels slices (copies) every kernel on
    every call. `generate` uses it for its decode loop on CPU, where those copies took about a
    quarter of a decode step (SmolLM2-135M, batch 64). Holds a second copy of the layer weights.
    """
    layers = params["layers"]
    if isinstance(layers, Sequence):
        return params
    return {**params, "layers": _unstack(layers, jax.tree.leaves(layers)[0].shape[0])}


def _unstack(tree: Any, num_layers: int) -> tuple[Any, ...]:
    """A pytree of `[L, ...]` leaves -> L pytrees of its layer slices `[...]` (copies)."""
    return tuple(jax.tree.map(lambda a, i=i: a[i], tree) for i in range(num_layers))


def per_layer_cache(cache: KVCache) -> KVCache:
    """`cache` with k and v as tuples of L per-layer `[B, Hkv, S, hd]` arrays (copies).

    Only for per-layer params (`per_layer_params`): the unrolled decode loop then writes and reads
    each layer's buffer in place, without slicing layer l out of the stacked `[L, ...]` cache.
    """
    if isinstance(cache.k, Sequence):
        return cache
    L = cache.k.shape[0]
    return cache.replace(k=_unstack(cache.k, L), v=_unstack(cache.v, L))


def _cache_len(cache: KVCache) -> int:
    """Capacity S in slots of a stacked or per-layer cache."""
    return cache.k[0].shape[2] if isinstance(cache.k, Sequence) else cache.k.shape[3]


def per_layer_lora(lora: Mapping[str, Any] | None, num_layers: int) -> tuple[dict[str, Any], ...]:
    """Stacked `{target: adapter}` (leaves `[L, ...]`) -> L per-layer `{target: adapter_l}` dicts.

    For the unrolled layer loop of `per_layer_params`: `generate` splits the adapters once, before
    its decode loop, rather than slicing every adapter array of every layer at every step.
    """
    return _unstack(dict(lora or {}), num_layers)


def output_kernel(params: Params, config: ModelConfig) -> jax.Array:
    """The lm_head kernel [d, V] (the transposed embedding when tied)."""
    if config.tie_embeddings:
        return params["embed"].T
    return params["lm_head"]["kernel"]


def lm_head(params: Params, config: ModelConfig, h: jax.Array) -> jax.Array:
    """Logits [..., V] in float32 from final hidden states [..., d]."""
    w = output_kernel(params, config)
    return jnp.matmul(h, w, preferred_element_type=jnp.float32).astype(jnp.float32)


def forward(
    params: Params,
    config: ModelConfig,
    tokens: jax.Array,
    *,
    attention_mask: jax.Array | None = None,
    positions: jax.Array | None = None,
    lora: Mapping[str, Any] | None = None,
    cache: KVCache | None = None,
    remat: bool = False,
    gather: LayerGather | None = None,
) -> jax.Array | tuple[jax.Array, KVCache]:
    """Logits [B, T, V] (float32), or `(logits, cache)` when a cache is given.

    See `hidden_states` for the arguments; `forward = lm_head . hidden_states`.
    """
    out = hidden_states(
        params,
        config,
        tokens,
        attention_mask=attention_mask,
        positions=positions,
        lora=lora,
        cache=cache,
        remat=remat,
        gather=gather,
    )
    if cache is None:
        return lm_head(params, config, out)
    h, cache = out
    return lm_head(params, config, h), cache
