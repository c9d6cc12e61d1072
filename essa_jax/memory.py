"""Analytic per-device memory estimates of generation, and the row chunk they allow.

Pure functions of a `ModelConfig` (any object with its fields), dtypes and shapes: no arrays are
made. The estimate is a first guess: it counts the big buffers (base weights, the KV cache of
`models.generate`, the transient per-row activations of its prefill and decode steps) and leaves
the rest to a headroom fraction. The ahead-of-time plan verifies the choice by compiling the
program (`PopulationEvaluator.lower(...).compile().memory_analysis()`).

Where the bytes go, per row of a generation with T prompt and N new tokens (docs/ARCHITECTURE.md,
"Row chunks"):

- KV cache: `models.generate` prefills into a cache of S = T + N - 1 slots (the last token is never
  fed back): k and v `[L, rows, Hkv, S, hd]` in the cache dtype, a `[rows, S]` bool mask and a
  `[rows]` int32 position (`models.transformer.init_cache`);
- prefill, one layer at a time: attention scores and probabilities `[Hq, c, T]` float32 (the
  attention materialises them for c = min(T, `models.attention.ATTENTION_QUERY_CHUNK`) queries
  at a time), queries / keys / values in float32, the MLP's `[T, I]` activations;
- decode, one layer at a time: the layer's cache keys / values cast to float32 `[Hkv, S, hd]`,
  scores `[Hq, S]`; per step the logits `[V]` float32 and a few copies of them (temperature
  scaling, top-k / top-p filtering, the sort of top-p);
- outputs: tokens, log-probs and mask `[N]`.

Example (Qwen2.5-7B, bf16, T = 384, N = 512): ~51 MB of KV cache per row, so 1,200 rows on a
device need ~60 GB of cache alone; `choose_rows_per_chunk` gives the largest chunk that fits.

Tensor parallelism (`model_shards` = the mesh's ``model`` axis, `essa_jax.mesh.param_specs`): a
device holds 1/model of every kernel, of the embedding / output head and of the KV cache's heads
(norms, the cache mask and positions stay whole), and its per-layer activations of attention and
the MLP shrink with the heads / columns it computes; the residual stream `[d]` and the logits
copies are counted whole (top-k / top-p sort the whole vocabulary).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Copies of a [V] float32 logits row alive at once in a decode step: the logits, logits / T, the
# top-k / top-p filtered logits, and the sorted logits of top-p with their softmax and cumsum.
_LOGIT_COPIES = 6
_F32 = 4


def _itemsize(dtype: Any) -> int:
    return int(np.dtype(dtype).itemsize)


def _bits(dtype: Any) -> int:
    """Bits per value as XLA stores it: 4-bit integers (int4 / uint4 kernels of
    `models.quant`) are packed two per byte, though numpy's itemsize says 1."""
    name = np.dtype(dtype).name
    return 4 if name in ("int4", "uint4") else 8 * _itemsize(dtype)


def param_bytes(config: Any, dtype: Any, model_shards: int = 1) -> int:
    """Bytes of the base weights (`models.init_params` layout) with every leaf in `dtype`, per
    device when split over a ``model`` axis of `model_shards` devices (`mesh.param_specs`: kernels,
    biases, embedding and output head split, norms whole)."""
    c, m = config, model_shards
    d, i, hd = c.hidden_size, c.intermediate_size, c.head_dim
    dq, dkv = c.num_heads * hd, c.num_kv_heads * hd
    split = d * dq + 2 * d * dkv + dq * d + 3 * d * i
    if c.attention_bias:
        split += dq + 2 * dkv
    whole = c.num_layers * 2 * d + d  # the norms
    head = c.vocab_size * d * (1 if c.tie_embeddings else 2)
    # The embedding / head split over V or d when the axis divides one (mesh.param_specs).
    head_split = m == 1 or c.vocab_size % m == 0 or d % m == 0
    n = c.num_layers * split // m + whole + (head // m if head_split else head)
    return n * _itemsize(dtype)


def cache_slots(prompt_len: int, max_new_tokens: int) -> int:
    """KV-cache slots per row of `models.generate`: T + N - 1 (the last token is never fed back)."""
    return prompt_len + max_new_tokens - 1


def kv_cache_bytes(
    config: Any, rows: int, slots: int, cache_dtype: Any, model_shards: int = 1
) -> int:
    """Bytes of `models.init_cache(config, rows, slots, cache_dtype)`: k and v
    `[L, rows, Hkv, S, hd]`, mask `[rows, S]` bool, next_pos `[rows]` int32, index int32; per
    device when the heads are split over `model_shards` devices (Hkv / model_shards each)."""
    kv = 2 * config.num_layers * (config.num_kv_heads // model_shards) * slots * config.head_dim
    per_row = kv * _itemsize(cache_dtype) + slots + 4
    return rows * per_row + 4


def kv_cache_bytes_per_row(
    config: Any, prompt_len: int, max_new_tokens: int, cache_dtype: Any, model_shards: int = 1
) -> int:
    """KV-cache bytes of one row of a generation with `prompt_len` + `max_new_tokens` tokens (per
    device of a ``model`` axis of `model_shards`)."""
    slots = cache_slots(prompt_len, max_new_tokens)
    return kv_cache_bytes(config, 1, slots, cache_dtype, model_shards) - 4


def activation_bytes_per_row(
    config: Any,
    prompt_len: int,
    max_new_tokens: int,
    dtype: Any = np.float32,
    model_shards: int = 1,
) -> int:
    """Transient bytes per row of a generation, besides its KV cache: the larger of the prefill's
    and a decode step's per-layer peak (module docstring), plus the logits copies and the outputs.

    dtype: the activations' dtype (the params dtype); attention runs in float32 whatever it is.
    model_shards: devices of the ``model`` axis; each computes its share of the heads and MLP
    columns (the residual stream and the logits copies are counted whole).
    """
    from essa_jax.models.attention import ATTENTION_QUERY_CHUNK

    c, m = config, model_shards
    t, s, act = prompt_len, cache_slots(prompt_len, max_new_tokens), _itemsize(dtype)
    hd, hq, hkv, inter = c.head_dim, c.num_heads // m, c.num_kv_heads // m, c.intermediate_size // m
    qkv = (hq + 2 * hkv) * hd
    # Prefill: scores + probabilities [Hq, c, T] f32 (c queries at a time), q / k / v in f32, the
    # attention output, the MLP's gate, up and their product [T, I], a few [T, d] stream values.
    prefill = (
        2 * hq * min(t, ATTENTION_QUERY_CHUNK) * t * _F32
        + t * qkv * (act + _F32)
        + t * hq * hd * _F32
        + 3 * t * inter * act
        + 4 * t * c.hidden_size * max(act, _F32)
    )
    # Decode step: the layer's cached k / v cast to f32, scores + probabilities [Hq, S], the MLP.
    decode = (
        2 * hkv * s * hd * _F32 + 2 * hq * s * _F32 + 3 * inter * act + 4 * c.hidden_size * _F32
    )
    logits = _LOGIT_COPIES * c.vocab_size * _F32
    outputs = max_new_tokens * (4 + 4 + 4) + 8
    return max(prefill, decode) + logits + outputs


def generation_bytes_per_row(
    config: Any,
    prompt_len: int,
    max_new_tokens: int,
    cache_dtype: Any,
    dtype: Any = None,
    model_shards: int = 1,
) -> int:
    """KV cache + transient activations of one row (`dtype` defaults to `cache_dtype`), per device
    of a ``model`` axis of `model_shards`."""
    dtype = cache_dtype if dtype is None else dtype
    return kv_cache_bytes_per_row(
        config, prompt_len, max_new_tokens, cache_dtype, model_shards
    ) + activation_bytes_per_row(config, prompt_len, max_new_tokens, dtype, model_shards)


def choose_rows_per_chunk(
    config: Any,
    *,
    rows: int,
    prompt_len: int,
    max_new_tokens: int,
    cache_dtype: Any,
    device_memory_bytes: int,
    reserved_bytes: int,
    headroom: float = 0.1,
    setting: str = "rows_per_chunk",
    model_shards: int = 1,
) -> int:
    """The chunk of rows a device can generate at once: `rows` when all fit, else the smallest
    chunk with the fewest chunks that fit (i.e. the largest fitting chunk, evened out so that the
    last chunk wastes the fewest padding rows).

    A first guess from `generation_bytes_per_row`; the ahead-of-time plan verifies it by compiling.

    Args:
      rows: rows this device generates (its shard of the population's P x B rows).
      prompt_len, max_new_tokens: T and N of the generation.
      cache_dtype: the KV cache's dtype (the params dtype by default in `models.generate`).
      device_memory_bytes: the device's usable memory (`memory_stats()["bytes_limit"]`).
      reserved_bytes: what else the device holds throughout: base weights, SVD basis, ... (this
        device's shards: `tree_bytes(..., per_device=True)`).
      headroom: fraction of `device_memory_bytes` kept free for what the estimate does not count.
      setting: the config field named in the error (e.g. "essa.rows_per_chunk").
      model_shards: devices of the mesh's ``model`` axis (tensor parallelism): a row's KV cache
        and attention / MLP activations per device shrink with it.

    Raises ValueError naming `setting` when not even one row fits.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    per_row = generation_bytes_per_row(
        config, prompt_len, max_new_tokens, cache_dtype, model_shards=model_shards
    )
    free = int(device_memory_bytes * (1.0 - headroom)) - int(reserved_bytes)
    fit = free // per_row
    if fit < 1:
        gib = 2.0**30
        raise ValueError(
            f"{setting}=0 (chosen from device memory): not even one row fits: a row of "
            f"{prompt_len} + {max_new_tokens} tokens needs ~{per_row / gib:.3f} GiB, but only "
            f"{max(free, 0) / gib:.3f} GiB of the device's {device_memory_bytes / gib:.2f} GiB is "
            f"left after {reserved_bytes / gib:.2f} GiB reserved (weights, basis) and "
            f"{headroom:.0%} headroom; shorten the prompts or max_new_tokens, or use devices "
            f"with more memory"
        )
    if fit >= rows:
        return rows
    num_chunks = math.ceil(rows / fit)
    return math.ceil(rows / num_chunks)


def tree_bytes(tree: Any, per_device: bool = False) -> int:
    """Bytes of all array leaves of a pytree (arrays or `jax.ShapeDtypeStruct`s); with
    `per_device`, of one device's shard of each leaf that has a sharding (e.g. weights split over
    the ``model`` axis by `mesh.place_params`), whole otherwise."""
    import jax

    def shape(x: Any) -> tuple[int, ...]:
        sharding = getattr(x, "sharding", None) if per_device else None
        return tuple(sharding.shard_shape(x.shape)) if sharding is not None else tuple(x.shape)

    return sum(-(-int(np.prod(shape(x))) * _bits(x.dtype) // 8) for x in jax.tree.leaves(tree))


def device_memory_bytes(device: Any = None) -> int | None:
    """Usable memory of `device` (default `jax.devices()[0]`): `memory_stats()["bytes_limit"]`,
    or None where the backend reports none (CPU)."""
    import jax

    device = jax.devices()[0] if device is None else device
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        return None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"])
