"""Batched KV-cache generation: one prefill, then a `lax.while_loop` of single-token decode steps.

The loop stops as soon as every row has emitted an EOS token (or after `max_new_tokens`). Rows are
left-padded prompts of different lengths. `generate` is a pure function, usable inside jit, vmap
and shard_map; `generate_jit` is the jitted convenience wrapper (sampling settings static).
`generate_chunked` runs the rows in chunks of a fixed size inside one program (one chunk's KV
cache live at a time), with one key per row so that the samples do not depend on the chunking.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from essa_jax.mesh import pad_to
from essa_jax.models.attention import retraced
from essa_jax.models.config import ModelConfig
from essa_jax.models.sampling import sample_tokens
from essa_jax.models.transformer import (
    Params,
    hidden_states,
    lm_head,
    per_layer_cache,
    per_layer_lora,
    per_layer_params,
    prefill,
)

# How the decode loop runs the layers: None = by the default backend (unrolled over per-layer
# weight copies on CPU, a layer scan elsewhere), or forced "scan" / "unrolled" (`decode_layers`).
_DECODE_LAYERS: str | None = None


def _set_decode_layers(mode: str | None) -> None:
    global _DECODE_LAYERS
    _DECODE_LAYERS = mode


def decode_layers(mode: str) -> contextlib.AbstractContextManager:
    """Within this block, programs traced decode with the layer scan ("scan", the accelerator
    path) or unrolled ("unrolled", the CPU path), whatever the default backend.

    For compiling ahead of time for another platform (`essa_jax.plan` compiles the GPU / TPU
    programs on a CPU machine, where the default would pick the CPU path and its second copy of the
    weights). JAX's trace caches are cleared on entry and exit (`attention.retraced`): a program
    traced under one mode is never reused under the other.
    """
    if mode not in ("scan", "unrolled"):
        raise ValueError(f"decode_layers mode {mode!r}: valid modes are 'scan' and 'unrolled'")
    return retraced(lambda: _DECODE_LAYERS, _set_decode_layers, mode)


def _decode_unrolled() -> bool:
    if _DECODE_LAYERS is not None:
        return _DECODE_LAYERS == "unrolled"
    return jax.default_backend() == "cpu"


@flax.struct.dataclass
class Generation:
    """Output of `generate` (N = max_new_tokens).

    tokens [B, N] int32: generated tokens, pad after a row's EOS; lengths [B] int32: tokens
    generated per row including the EOS; logprobs [B, N] float32: log-prob of each sampled token
    under the temperature-scaled distribution log_softmax(logits / T) (before top-k / top-p
    truncation; 0 where mask is 0); mask [B, N] int32: 1 for generated tokens (EOS included);
    finished [B] bool: the row emitted an EOS (False = truncated at max_new_tokens).
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    finished: jax.Array


def pad_left(
    token_lists: Sequence[Sequence[int]], pad_id: int, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists into (tokens [B, length] int32, mask [B, length] int32).

    `length` defaults to the longest list; a list longer than `length` is an error (truncating a
    prompt silently would change the task).
    """
    longest = max((len(t) for t in token_lists), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"a prompt has {longest} tokens, longer than length={length}")
    tokens = np.full((len(token_lists), length), pad_id, np.int32)
    mask = np.zeros((len(token_lists), length), np.int32)
    for i, t in enumerate(token_lists):
        if len(t):
            tokens[i, length - len(t) :] = np.asarray(t, np.int32)
            mask[i, length - len(t) :] = 1
    return tokens, mask


def _per_row_keys(key: jax.Array, batch: int) -> bool:
    """Whether `key` holds one PRNG key per row ([B] typed keys or [B, 2] raw) rather than one."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    batch_dims = key.shape if typed else key.shape[:-1]
    if not batch_dims:
        return False
    if batch_dims != (batch,):
        raise ValueError(
            f"key must be one PRNG key or one per prompt row ({batch}), got key batch shape "
            f"{batch_dims}"
        )
    return True


def _step_key(key: jax.Array, step: jax.Array | int, per_row: bool) -> jax.Array:
    """The key of decode step `step`: fold_in(key, step), for each row's key when per_row."""
    if per_row:
        return jax.vmap(jax.random.fold_in, (0, None))(key, step)
    return jax.random.fold_in(key, step)


def generate(
    params: Params,
    config: ModelConfig,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    lora: Mapping[str, Any] | None = None,
    eos_token_ids: Sequence[int] | None = None,
    pad_token_id: int | None = None,
    cache_dtype: Any = None,
) -> Generation:
    """Generate up to `max_new_tokens` tokens for a left-padded batch of prompts.

    prompt_tokens, prompt_mask: [B, T] (1 = real token; every row's last slot must be real).
    key: one PRNG key (step i uses fold_in(key, i)), or one key per row ([B] typed or [B, 2] raw:
    row b's step i uses fold_in(key[b], i), so a row samples the same tokens in any batch it is
    put in). greedy=True takes argmax (key unused).
    temperature, top_k (0 = off), top_p (1.0 = off) must be Python numbers for top_k / top_p.
    eos_token_ids default to config.eos_token_ids; tokens after a row's EOS are `pad_token_id`
    (default config.effective_pad_id) with mask 0. Logprobs are under log_softmax(logits / T):
    the behaviour policy at the sampling temperature, which is what importance ratios in GRPO-style
    losses need (see `Generation`).
    Returns `Generation` with arrays of width N = max_new_tokens.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not greedy and isinstance(temperature, int | float) and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}; use greedy")
    eos = tuple(config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    pad = config.effective_pad_id if pad_token_id is None else pad_token_id
    B, T = prompt_tokens.shape
    N = max_new_tokens
    per_row = _per_row_keys(key, B)
    sample = functools.partial(
        sample_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        greedy=greedy,
        per_row=per_row,
    )
    eos_arr = jnp.asarray(eos if eos else (-1,), jnp.int32)

    # The last generated token is never fed back, so N - 1 decode slots suffice.
    h, cache = prefill(
        params,
        config,
        prompt_tokens,
        max_len=T + N - 1,
        attention_mask=prompt_mask,
        lora=lora,
        cache_dtype=cache_dtype,
    )
    logits = lm_head(params, config, h[:, -1])

    def emit(i, tok, lp, state):
        tokens, logprobs, mask, finished = state
        alive = ~finished
        tok = jnp.where(alive, tok, pad)
        tokens = tokens.at[:, i].set(tok)
        logprobs = logprobs.at[:, i].set(jnp.where(alive, lp, 0.0))
        mask = mask.at[:, i].set(alive.astype(jnp.int32))
        finished = finished | (alive & jnp.isin(tok, eos_arr))
        return tok, (tokens, logprobs, mask, finished)

    state = (
        jnp.full((B, N), pad, jnp.int32),
        jnp.zeros((B, N), jnp.float32),
        jnp.zeros((B, N), jnp.int32),
        jnp.zeros((B,), bool),
    )
    tok, lp = sample(_step_key(key, 0, per_row), logits)
    tok, state = emit(0, tok, lp, state)

    def cond(carry):
        i, _, _, state = carry
        return (i < N) & ~jnp.all(state[3])

    # On CPU the decode steps run the layers unrolled over per-layer copies of the weights (made
    # once here): a layer scan would copy every kernel out of the stacked params at every step.
    # Elsewhere keep the scan: no second copy of the weights, compile time flat in depth.
    decode_params, decode_lora = params, lora
    if _decode_unrolled():
        decode_params = per_layer_params(params)
        decode_lora = per_layer_lora(lora, len(decode_params["layers"]))
        cache = per_layer_cache(cache)

    def body(carry):
        i, tok, cache, state = carry
        h, cache = hidden_states(decode_params, config, tok[:, None], lora=decode_lora, cache=cache)
        tok, lp = sample(_step_key(key, i, per_row), lm_head(decode_params, config, h[:, 0]))
        tok, state = emit(i, tok, lp, state)
        return i + 1, tok, cache, state

    _, _, _, state = jax.lax.while_loop(cond, body, (jnp.asarray(1, jnp.int32), tok, cache, state))
    tokens, logprobs, mask, finished = state
    return Generation(
        tokens=tokens,
        lengths=mask.sum(axis=1, dtype=jnp.int32),
        logprobs=logprobs,
        mask=mask,
        finished=finished,
    )


def row_keys(key: jax.Array, num_rows: int) -> jax.Array:
    """Per-row sampling keys [R] (typed): row r gets fold_in(key, r), so a row's tokens depend
    neither on the chunk (`generate_chunked`) nor on the device or process that generates it (the
    data-parallel GRPO rollout). `key`: a typed key or raw key data."""
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(num_rows, dtype=jnp.int32))


def generate_chunked(
    params: Params,
    config: ModelConfig,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    rows_per_chunk: int,
    lora: Mapping[str, Any] | Callable[[Any], Mapping[str, Any] | None] | None = None,
    row_inputs: Any = None,
    **settings: Any,
) -> Generation:
    """`generate` over the B rows in chunks of at most `rows_per_chunk` rows, in one program.

    Only one chunk's KV cache and decode activations are live at a time: the chunks run one
    after the other (`jax.lax.map`), so peak memory scales with the chunk, not with B. The rows
    are padded to a multiple of the chunk with copies of row 0 (`essa_jax.mesh.pad_to`, the one
    padding rule), which are dropped afterwards.

    Every row samples with its own key, so a row's tokens do not depend on the chunk size (nor on
    which chunk it lands in): `key` is one key per row ([B] typed or [B, 2] raw), or one key, in
    which case row r uses fold_in(key, r). (With one key `generate` itself draws the batch
    jointly, so `generate(key)` and `generate_chunked(key)` sample differently; every
    `generate_chunked` call with the same key samples identically, whatever `rows_per_chunk`.)
    Log-probs agree across chunk sizes to float rounding only: XLA's kernels need not round a
    batch of 4 rows like one of 15 (~1e-7 relative on CPU), so a token could flip only where two
    candidates tie to that precision.

    Args:
      prompt_tokens, prompt_mask: [B, T] as for `generate`.
      rows_per_chunk: rows per chunk; 0 or >= B = one chunk (no `lax.map`).
      lora: the adapter shared by every row (`generate`'s `lora`), or a function
        `lora(row_inputs_chunk) -> adapter` building a chunk's per-row adapter from the chunk's
        slice of `row_inputs` (e.g. the population's per-row singular values).
      row_inputs: pytree of [B, ...] arrays cut into chunks alongside the rows (for `lora`).
      settings: `generate`'s keyword arguments (max_new_tokens, temperature, greedy, ...).

    Returns `Generation` of the B rows, as `generate`.
    """
    B, T = prompt_tokens.shape
    if not isinstance(rows_per_chunk, int) or rows_per_chunk < 0:
        raise ValueError(f"rows_per_chunk must be an int >= 0, got {rows_per_chunk!r}")
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    if not _per_row_keys(key, B):
        key = row_keys(key, B)
    make_lora = lora if callable(lora) else (lambda _: lora)
    if rows_per_chunk == 0 or rows_per_chunk >= B:
        return generate(
            params, config, prompt_tokens, prompt_mask, key, lora=make_lora(row_inputs), **settings
        )
    chunk = rows_per_chunk
    num_chunks = -(-B // chunk)

    def split(x: jax.Array) -> jax.Array:
        # Padding rows are copies of row 0; they are computed and dropped below.
        x = pad_to(x, num_chunks * chunk, 0)
        return x.reshape((num_chunks, chunk) + x.shape[1:])

    def one_chunk(xs: tuple) -> Generation:
        tokens, mask, keys, inputs = xs
        return generate(params, config, tokens, mask, keys, lora=make_lora(inputs), **settings)

    xs = jax.tree.map(split, (prompt_tokens, prompt_mask, key, row_inputs))
    out = jax.lax.map(one_chunk, xs)
    return jax.tree.map(lambda z: z.reshape((num_chunks * chunk,) + z.shape[2:])[:B], out)


generate_jit = jax.jit(
    generate,
    static_argnames=(
        "config",
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "greedy",
        "eos_token_ids",
        "pad_token_id",
        "cache_dtype",
    ),
)
generate_jit.__doc__ = "`generate` under jax.jit (config and sampling settings static).\n\n" + (
    generate.__doc__ or ""
)
