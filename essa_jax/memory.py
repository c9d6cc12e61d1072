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
  attention materialises them for c = min(T, `models.transformer.ATTENTION_QUERY_CHUNK`) queries
  at a time), queries / keys / values in float32, the MLP's `[T, I]` activations;
- decode, one layer at a time: the layer's cache keys / values cast to float32 `[Hkv, S, hd]`,
  scores `[Hq, S]`; per step the logits `[V]` float32 and a few copies of them (temperature
  scaling, top-k / top-p filtering, the sort of top-p);
- outputs: tokens, log-probs and mask `[N]`.

Example (Qwen2.5-7B, bf16, T = 384, N = 512): ~51 MB of KV cache per row, so 1,200 rows on a
device need ~60 GB of cache alone; `choose_rows_per_chunk` gives the largest chunk that fits.
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


def param_bytes(config: Any, dtype: Any) -> int:
    """Bytes of the base weights (`models.init_params` layout) with every leaf in `dtype`."""
    c = config
    d, i, hd = c.hidden_size, c.intermediate_size, c.head_dim
    dq, dkv = c.num_heads * hd, c.num_kv_heads * hd
    per_layer = 2 * d + d * dq + 2 * d * dkv + dq * d + 3 * d * i
    if c.attention_bias:
        per_layer += dq + 2 * dkv
    n = c.vocab_size * d + c.num_layers * per_layer + d
    if not c.tie_embeddings:
        n += d * c.vocab_size
    return n * _itemsize(dtype)


def cache_slots(prompt_len: int, max_new_tokens: int) -> int:
    """KV-cache slots per row of `models.generate`: T + N - 1 (the last token is never fed back)."""
    return prompt_len + max_new_tokens - 1


def kv_cache_bytes(config: Any, rows: int, slots: int, cache_dtype: Any) -> int:
    """Bytes of `models.init_cache(config, rows, slots, cache_dtype)`: k and v
    `[L, rows, Hkv, S, hd]`, mask `[rows, S]` bool, next_pos `[rows]` int32, index int32."""
    kv = 2 * config.num_layers * config.num_kv_heads * slots * config.head_dim
    per_row = kv * _itemsize(cache_dtype) + slots + 4
    return rows * per_row + 4


def kv_cache_bytes_per_row(
    config: Any, prompt_len: int, max_new_tokens: int, cache_dtype: Any
) -> int:
    """KV-cache bytes of one row of a generation with `prompt_len` + `max_new_tokens` tokens."""
    return kv_cache_bytes(config, 1, cache_slots(prompt_len, max_new_tokens), cache_dtype) - 4


def activation_bytes_per_row(
    config: Any, prompt_len: int, max_new_tokens: int, dtype: Any = np.float32
) -> int:
    """Transient bytes per row of a generation, besides its KV cache: the larger of the prefill's
    and a decode step's per-layer peak (module docstring), plus the logits copies and the outputs.

    dtype: the activations' dtype (the params dtype); attention runs in float32 whatever it is.
    """
    from essa_jax.models.transformer import ATTENTION_QUERY_CHUNK

    c = config
    t, s, act = prompt_len, cache_slots(prompt_len, max_new_tokens), _itemsize(dtype)
    hd, hq, hkv = c.head_dim, c.num_heads, c.num_kv_heads
    qkv = (hq + 2 * hkv) * hd
    # Prefill: scores + probabilities [Hq, c, T] f32 (c queries at a time), q / k / v in f32, the
    # attention output, the MLP's gate, up and their product [T, I], a few [T, d] stream values.
    prefill = (
        2 * hq * min(t, ATTENTION_QUERY_CHUNK) * t * _F32
        + t * qkv * (act + _F32)
        + t * hq * hd * _F32
        + 3 * t * c.intermediate_size * act
        + 4 * t * c.hidden_size * max(act, _F32)
    )
    # Decode step: the layer's cached k / v cast to f32, scores + probabilities [Hq, S], the MLP.
    decode = (
        2 * hkv * s * hd * _F32
        + 2 * hq * s * _F32
        + 3 * c.intermediate_size * act
        + 4 * c.hidden_size * _F32
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
) -> int:
    """KV cache + transient activations of one row (`dtype` defaults to `cache_dtype`)."""
    dtype = cache_dtype if dtype is None else dtype
    return kv_cache_bytes_per_row(
        config, prompt_len, max_new_tokens, cache_dtype
    ) + activation_bytes_per_row(config, prompt_len, max_new_tokens, dtype)


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
      reserved_bytes: what else the device holds throughout: base weights, SVD basis, ...
      headroom: fraction of `device_memory_bytes` kept free for what the estimate does not count.
      setting: the config field named in the error (e.g. "essa.rows_per_chunk").

    Raises ValueError naming `setting` when not even one row fits.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    per_row = generation_bytes_per_row(config, prompt_len, max_new_tokens, cache_dtype)
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


def tree_bytes(tree: Any) -> int:
    """Bytes of all array leaves of a pytree (arrays or `jax.ShapeDtypeStruct`s)."""
    import jax

    return sum(int(np.prod(x.shape)) * _itemsize(x.dtype) for x in jax.tree.leaves(tree))


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
