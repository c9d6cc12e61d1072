"""One compiled program for a whole population: P members x B prompts as P*B rows.

The hot path of ESSA (docs/ARCHITECTURE.md, "Population"; arXiv 2507.04453 Sec. 3): every member
shares the base weights W and the frozen SVD basis (V_A, M, U_B); only the singular values differ.
Rows are stacked member-major (row n = member n // B, prompt n % B) and carry their member's
singular values, so a layer computes

    y = x W + scale * ((((x V_A) * s_A[row]) M) * s_B[row]) U_B^T

for all rows at once: no per-member weight matrix, no Python loop over members. Across devices,
`jax.shard_map` over the (pop, data) axes of the mesh of `essa_jax.mesh` gives each group of
devices a slice of members and prompts. The ``model`` axis stays Auto inside (a partially-manual
shard_map): the base weights, placed once with `essa_jax.mesh.place_params`, stay split over it
(tensor parallelism; XLA partitions each shard's program from the weights' shardings, so the KV
cache's heads are split too) and replicated over (pop, data); the SVD basis is replicated.

Decoding runs as one flat batch of P*B rows through `essa_jax.models.generate`, greedy (ESSA's
default, also Qiu et al. 2025) or sampled. Sampling passes one PRNG key per row,
fold_in(fold_in(key, member), prompt), so a member's samples do not depend on how rows are split
over devices, nor into chunks: with `rows_per_chunk` > 0 a device generates its rows in chunks of
at most that many (`jax.lax.map` over the chunks inside the one program, rows padded by the one
padding rule), so that only one chunk's KV cache is live (docs/ARCHITECTURE.md, "Row chunks").

Population or prompt counts that do not divide the mesh are padded by the one rule of
`essa_jax.mesh` (copies of member 0 / prompt 0, dropped afterwards; `keep_padding=True` returns the
padded rows as they lie on the mesh, which is what the multi-process evaluator reads).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from essa_jax.lora.svd import (
    GenomeLayout,
    SVDBasis,
    fuse_shared_input,
    population_svd_lora,
)
from essa_jax.mesh import DATA_AXIS, POP_AXIS, axis_size, pad_to, padded_size
from essa_jax.models import Generation, forward
from essa_jax.models.generate import generate_chunked


def _check_inputs(layout: GenomeLayout, genomes: jax.Array, tokens: jax.Array) -> None:
    if jnp.ndim(genomes) != 2 or genomes.shape[1] != layout.size:
        raise ValueError(
            f"genomes must be [P, D] with D = layout.size = {layout.size}, got {jnp.shape(genomes)}"
        )
    if jnp.ndim(tokens) == 3 and tokens.shape[0] != genomes.shape[0]:
        raise ValueError(
            f"per-member prompts [P, B, T] have P={tokens.shape[0]} but genomes have "
            f"P={genomes.shape[0]}"
        )
    if jnp.ndim(tokens) not in (2, 3):
        raise ValueError(
            f"prompt tokens must be [B, T] (shared by all members) or [P, B, T] (per member), "
            f"got shape {jnp.shape(tokens)}"
        )


def _run(body, mesh: Mesh | None, params, basis, genomes, tokens, mask, key, keep_padding=False):
    """Pad to the mesh, run `body` per shard (or once without a mesh), drop the padding unless
    `keep_padding` (then the outputs are [P_pad, B_pad, ...], sharded (pop, data) on the mesh).

    body(params, basis, genomes [p, D], tokens [p, b, T], mask, member_ids [p], prompt_ids [b],
    key) -> pytree of [p, b, ...] arrays.
    """
    num_members, num_prompts = genomes.shape[0], tokens.shape[-2]
    tokens = jnp.broadcast_to(tokens, (num_members,) + tokens.shape[-2:])
    mask = jnp.broadcast_to(mask, tokens.shape)
    pp = padded_size(num_members, axis_size(mesh, POP_AXIS))
    bp = padded_size(num_prompts, axis_size(mesh, DATA_AXIS))
    genomes = pad_to(genomes, pp, 0)
    tokens = pad_to(pad_to(tokens, pp, 0), bp, 1)
    mask = pad_to(pad_to(mask, pp, 0), bp, 1)
    # Padded members/prompts reuse index 0: they are copies and are discarded by the caller.
    member_ids = pad_to(jnp.arange(num_members, dtype=jnp.int32), pp, 0)
    prompt_ids = pad_to(jnp.arange(num_prompts, dtype=jnp.int32), bp, 0)
    args = (params, basis, genomes, tokens, mask, member_ids, prompt_ids, key)
    if mesh is None:
        out = body(*args)
    else:
        rows = P(POP_AXIS, DATA_AXIS)
        out = jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(P(), P(), P(POP_AXIS), rows, rows, P(POP_AXIS), P(DATA_AXIS), P()),
            out_specs=rows,
            # Manual over (pop, data) only: ``model`` stays Auto in the body, so params split over
            # it (`mesh.place_params`) stay split and XLA partitions the model over it (TP).
            axis_names=frozenset({POP_AXIS, DATA_AXIS}),
            # The model allocates its KV cache with jnp.zeros (mesh-invariant) and then writes
            # per-shard values into it inside scan / while_loop; vma checking rejects that carry.
            check_vma=False,
        )(*args)
    if keep_padding:
        return out
    return jax.tree.map(lambda z: z[:num_members, :num_prompts], out)


@functools.partial(jax.jit, static_argnames=("config", "layout", "mesh"))
def _population_forward(params, basis, genomes, tokens, mask, *, config, layout, mesh):
    def body(params, basis, genomes, tokens, mask, member_ids, prompt_ids, key):
        del member_ids, prompt_ids, key
        p, b, t = tokens.shape
        lora = fuse_shared_input(population_svd_lora(basis, layout, genomes, b))
        logits = forward(
            params,
            config,
            tokens.reshape(p * b, t),
            attention_mask=mask.reshape(p * b, t),
            lora=lora,
        )
        return logits.reshape(p, b, t, -1)

    return _run(body, mesh, params, basis, genomes, tokens, mask, jax.random.key(0))


def population_forward(
    params: dict,
    config: Any,
    basis: SVDBasis,
    layout: GenomeLayout,
    genomes: jax.Array,
    tokens: jax.Array,
    attention_mask: jax.Array | None = None,
    *,
    mesh: Mesh | None = None,
) -> jax.Array:
    """Logits of every member on its prompts: `[P, B, T, V]` float32, one jitted program.

    Args:
      genomes: `[P, D]` offsets to the SFT singular values (zero = SFT adapter).
      tokens: `[B, T]` shared by all members, or `[P, B, T]` per member; left-padded.
      attention_mask: same shape as tokens (1 = real token); default all ones.
      mesh: optional mesh of `essa_jax.mesh.make_mesh`; with a ``model`` axis > 1, params
        placed by `essa_jax.mesh.place_params` run tensor-parallel over it.
    """
    _check_inputs(layout, genomes, tokens)
    tokens = jnp.asarray(tokens, jnp.int32)
    mask = jnp.ones_like(tokens) if attention_mask is None else jnp.asarray(attention_mask)
    return _population_forward(
        params,
        basis,
        jnp.asarray(genomes),
        tokens,
        mask.astype(jnp.int32),
        config=config,
        layout=layout,
        mesh=mesh,
    )


def _generate_rows(
    params,
    config,
    basis,
    layout,
    genomes,
    tokens,
    mask,
    member_ids,
    prompt_ids,
    key,
    *,
    rows_per_chunk: int,
    **settings,
) -> Generation:
    """Generation for p members x b prompts on one device: fields `[p, b, N]`.

    The p*b rows run in chunks of at most `rows_per_chunk` (0 = all at once;
    `models.generate_chunked`): each chunk builds the adapter of its own rows (row -> member ->
    singular values), so only one chunk's KV cache and per-row adapter values are live.
    """
    p, b, t = tokens.shape
    flat_tokens, flat_mask = tokens.reshape(p * b, t), mask.reshape(p * b, t)
    # One key per row, fold_in(fold_in(key, member), prompt): a row samples the same tokens
    # whichever device, batch and chunk it lands in. (Unused when greedy.)
    keys = jax.vmap(
        lambda m: jax.vmap(lambda q: jax.random.fold_in(jax.random.fold_in(key, m), q))(prompt_ids)
    )(member_ids).reshape(p * b)
    local_member = jnp.repeat(jnp.arange(p, dtype=jnp.int32), b)  # row n -> member n // b

    def lora(rows_member: jax.Array) -> dict:
        return fuse_shared_input(population_svd_lora(basis, layout, genomes[rows_member], 1))

    out = generate_chunked(
        params,
        config,
        flat_tokens,
        flat_mask,
        keys,
        rows_per_chunk=rows_per_chunk,
        lora=lora,
        row_inputs=local_member,
        **settings,
    )
    return jax.tree.map(lambda z: z.reshape((p, b) + z.shape[1:]), out)


@functools.partial(
    jax.jit,
    static_argnames=(
        "config",
        "layout",
        "mesh",
        "max_new_tokens",
        "greedy",
        "temperature",
        "top_k",
        "top_p",
        "eos_token_ids",
        "keep_padding",
        "rows_per_chunk",
    ),
)
def _population_generate(
    params,
    basis,
    genomes,
    tokens,
    mask,
    key,
    *,
    config,
    layout,
    mesh,
    keep_padding,
    rows_per_chunk=0,
    **settings,
):
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)  # raw uint32 [2] data (a key placed across hosts)

    def body(params, basis, genomes, tokens, mask, member_ids, prompt_ids, key):
        return _generate_rows(
            params,
            config,
            basis,
            layout,
            genomes,
            tokens,
            mask,
            member_ids,
            prompt_ids,
            key,
            rows_per_chunk=rows_per_chunk,
            **settings,
        )

    return _run(body, mesh, params, basis, genomes, tokens, mask, key, keep_padding)


def population_generate(
    params: dict,
    config: Any,
    basis: SVDBasis,
    layout: GenomeLayout,
    genomes: jax.Array,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_ids: Sequence[int] | None = None,
    mesh: Mesh | None = None,
    keep_padding: bool = False,
    rows_per_chunk: int = 0,
) -> Generation:
    """Generate for every member on its prompts in one jitted program.

    Args:
      genomes: `[P, D]` candidate offsets to the SFT singular values.
      prompt_tokens, prompt_mask: `[B, T]` shared by all members or `[P, B, T]` per member
        (left-padded; every row's last slot real, as `models.generate` requires).
      key: PRNG key (typed, or raw uint32 [2] data); row (member i, prompt j) samples with
        fold_in(fold_in(key, i), j), so the samples do not depend on the mesh. Unused when greedy.
      mesh: optional mesh of `essa_jax.mesh.make_mesh`; P and B need not divide it (padding).
        With a ``model`` axis > 1, params placed by `essa_jax.mesh.place_params` (split over it)
        run tensor-parallel; replicated params run replicated over it (each model shard then
        computes the same rows).
      keep_padding: return the rows padded to the mesh, [P_pad, B_pad, ...], as they lie on it.
      rows_per_chunk: each device generates its (P_pad / pop) * (B_pad / data) rows in chunks of
        at most this many (one chunk's KV cache live at a time; `models.generate_chunked`);
        0 = all at once. The random draws do not depend on it (per-row keys), so greedy and
        sampled tokens are the same for every chunk size; log-probs agree to float rounding
        (XLA's kernels may round a batch of 4 rows differently from one of 15, ~1e-7 relative;
        a token could flip only at an exact tie). Choosing it from the device memory is the
        caller's (`PopulationEvaluator`, `essa_jax.memory`).

    Returns: `Generation` with fields `[P, B, N]` (tokens, logprobs, mask) and `[P, B]` (lengths,
    finished), N = max_new_tokens.
    """
    _check_inputs(layout, genomes, prompt_tokens)
    if jnp.shape(prompt_mask) != jnp.shape(prompt_tokens):
        raise ValueError(
            f"prompt_mask {jnp.shape(prompt_mask)} must match prompt_tokens "
            f"{jnp.shape(prompt_tokens)}"
        )
    return _population_generate(
        params,
        basis,
        jnp.asarray(genomes),
        jnp.asarray(prompt_tokens, jnp.int32),
        jnp.asarray(prompt_mask, jnp.int32),
        key,
        config=config,
        layout=layout,
        mesh=mesh,
        keep_padding=bool(keep_padding),
        rows_per_chunk=int(rows_per_chunk),
        max_new_tokens=max_new_tokens,
        greedy=bool(greedy),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_ids=None if eos_token_ids is None else tuple(eos_token_ids),
    )
