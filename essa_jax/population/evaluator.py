"""Fitness of a population: one sharded generation program, rewards on the host, fitness gathered.

ESSA's fitness of a candidate is its mean reward on a mini-batch of training prompts
(arXiv 2507.04453, Sec. 3.2; 100-500 prompts per candidate in the paper). Fitness is MAXIMISED.

`PopulationEvaluator` owns everything between a population of genomes and its fitness vector
(docs/ARCHITECTURE.md, "The path of a genome"):

1. the mesh (`essa_jax.mesh.make_mesh`, over every process's devices) and the base weights placed
   on it once (`essa_jax.mesh.place_params`: split over its ``model`` axis, tensor parallelism,
   replicated over ``pop`` and ``data``);
2. one compiled generation program for all P x B rows (`population_generate`), sharded over the
   mesh's ``pop`` and ``data`` axes (and tensor-parallel over ``model``), padded by the one
   padding rule of `essa_jax.mesh`;
3. the host side: each process reads back only the rows its own devices generated (no tokens cross
   process boundaries), and scores them with the `score` callback (`text_reward` wraps a task's
   reward function: decode, then `reward_fn(prompts, completions, **fields)`);
4. the gather: per-row rewards, lengths and "finished" flags (a few floats per rollout, never
   weights or tokens) are all-gathered across processes, so every process holds the same fitness
   vector and applies the identical `tell`.

The result does not depend on the layout: a row's sampling key is fold_in(fold_in(key, member),
prompt) with the member's index in the whole population, so 1 device, N devices and N processes
draw the same samples (greedy fitness is layout-independent as long as XLA's per-device arithmetic
is).

Prompts are shared by all members (`PromptBatch` with tokens [B, T]: candidates are ranked on
identical problems) or drawn per candidate (tokens [P, B, T], the paper's mini-batch per candidate).

Memory: each device generates its rows in chunks of `rows_per_chunk` (0 = the largest chunk that
the device's memory allows by `essa_jax.memory`'s estimate; no chunking where the backend reports
no memory, e.g. CPU). `lower` takes abstract inputs (`jax.ShapeDtypeStruct`s, params included), so
a planner can compile the program for a device it does not have (docs/ARCHITECTURE.md, "Row
chunks").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from essa_jax.es.base import SearchError
from essa_jax.lora.svd import GenomeLayout, SVDBasis
from essa_jax.memory import choose_rows_per_chunk, device_memory_bytes, tree_bytes
from essa_jax.mesh import (
    DATA_AXIS,
    MODEL_AXIS,
    POP_AXIS,
    allgather_owned,
    axis_size,
    local_blocks,
    on_mesh,
    padded_size,
    place_params,
)
from essa_jax.models import Generation, decode_completions
from essa_jax.population.engine import population_generate


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """The prompts a population is scored on, shared `[B]` or per candidate `[P, B]`.

    tokens / mask: `[B, T]` (shared) or `[P, B, T]` (per candidate), left-padded int32.
    prompts: prompt texts (what the reward sees), `[B]` or `[P][B]` like the tokens.
    fields: per-prompt task columns for the reward (e.g. {"answer": ...}), `[B]` or `[P][B]`.
    """

    tokens: np.ndarray
    mask: np.ndarray
    prompts: Sequence[Any]
    fields: Mapping[str, Sequence[Any]] = dataclasses.field(default_factory=dict)

    @property
    def per_candidate(self) -> bool:
        return np.ndim(self.tokens) == 3

    @property
    def num_prompts(self) -> int:
        return int(np.shape(self.tokens)[-2])

    def row(self, values: Sequence[Any], member: int, prompt: int) -> Any:
        """Entry of a prompt-aligned column (`prompts` or a field) for one (member, prompt) row."""
        return values[member][prompt] if self.per_candidate else values[prompt]


@dataclasses.dataclass(frozen=True)
class Rows:
    """The rows of a population generation that this process scores (n rows, member-major).

    members / prompts: `[n]` indices into the population and the member's prompts; generation:
    the `Generation` fields as numpy, `[n, N]` / `[n]`; texts / fields: the prompt texts and task
    columns of each row (lists of n), ready for a reward function.
    """

    members: np.ndarray
    prompts: np.ndarray
    generation: Generation
    texts: list[Any]
    fields: dict[str, list[Any]]


ScoreFn = Callable[[Rows], Sequence[float]]


def text_reward(
    reward_fn: Callable[..., Sequence[float]], decode: Any, eos_token_ids: Sequence[int] = ()
) -> ScoreFn:
    """A `ScoreFn` from a task's reward: decode each row's completion (`decode` is a tokenizer or
    `list[int] -> str`), then `reward_fn(prompts, completions, **fields) -> list[float]`."""

    def score(rows: Rows) -> Sequence[float]:
        gen = rows.generation
        completions = decode_completions(decode, gen.tokens, gen.lengths, eos_token_ids)
        return reward_fn(rows.texts, completions, **rows.fields)

    return score


@dataclasses.dataclass
class PopulationEval:
    """One population's evaluation, identical on every process (P members x B prompts).

    fitness [P]: mean reward per member (maximised). rewards, lengths, finished [P, B]: per row.
    metrics: reward mean/std, fitness std, fraction of members whose rewards are all equal,
    completion length, truncation, generated tokens; `skipped_tell` once a step has used it.
    """

    fitness: np.ndarray
    rewards: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray
    metrics: dict[str, float]


_FIELDS = ("tokens", "logprobs", "mask", "lengths", "finished")


def _local_blocks(gen: Generation, num_members: int, num_prompts: int) -> list[tuple]:
    """The blocks of the padded `[P_pad, B_pad]` grid that this process scores, in grid order:
    `(members, prompts, {field: numpy [m, b, ...]})` for each replica-0 shard on its devices,
    clipped to the real rows (`essa_jax.mesh.local_blocks`, the read-back GRPO's rollouts use)."""
    blocks = local_blocks([getattr(gen, n) for n in _FIELDS], (num_members, num_prompts))
    return [
        (
            np.arange(m0, m0 + data[0].shape[0]),
            np.arange(p0, p0 + data[0].shape[1]),
            dict(zip(_FIELDS, data, strict=True)),
        )
        for (m0, p0), data in blocks
    ]


def _empty_rows(gen: Generation) -> dict[str, np.ndarray]:
    """Zero rows of every field (shape [0, 0, ...]), for a process that scores nothing."""
    return {n: np.zeros((0, 0) + getattr(gen, n).shape[2:], getattr(gen, n).dtype) for n in _FIELDS}


def _abstract(x: Any) -> bool:
    return isinstance(x, jax.ShapeDtypeStruct)


def _shape(x: Any) -> tuple[int, ...]:
    """Shape of an array, a `jax.ShapeDtypeStruct` or a nested list."""
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


class PopulationEvaluator:
    """Genomes `[P, D]` -> `PopulationEval`, over a mesh of every process's devices.

    Call it with the same genomes and key on every process (they come from the shared strategy
    state and key); it returns the identical evaluation everywhere.

    Args:
      params: base weights (placed on the mesh once by `essa_jax.mesh.place_params`: split over
        its ``model`` axis, replicated over the others).
      model_config: the model's `ModelConfig`.
      layout: the genome layout of the SVD adapters.
      mesh: a mesh of `essa_jax.mesh.make_mesh` (None: one device, no shard_map).
      score: `ScoreFn` giving one reward per row of this process (`text_reward(...)` for a task).
      max_new_tokens, greedy, temperature, top_k, top_p, eos_token_ids: decoding of the rows.
      rows_per_chunk: each device generates its rows in chunks of at most this many (the KV
        cache of one chunk live at a time); 0 = chosen from the device memory
        (`rows_per_chunk_for`). The results do not depend on it (`population_generate`).
      device_memory_bytes: the device memory that rows_per_chunk=0 plans for; default the first
        device's `memory_stats()["bytes_limit"]` (none on CPU: no chunking). Set it to ask what
        would be chosen on another device (e.g. 80e9 for an 80 GB GPU).

    params may be `jax.ShapeDtypeStruct`s: such an evaluator can only `lower` (planning).
    """

    def __init__(
        self,
        params: Any,
        model_config: Any,
        layout: GenomeLayout,
        *,
        mesh: Mesh | None,
        score: ScoreFn,
        max_new_tokens: int,
        greedy: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        eos_token_ids: Sequence[int] | None = None,
        rows_per_chunk: int = 0,
        device_memory_bytes: int | None = None,
    ):
        if isinstance(rows_per_chunk, bool) or not isinstance(rows_per_chunk, int):
            raise ValueError(f"rows_per_chunk must be an int >= 0, got {rows_per_chunk!r}")
        if rows_per_chunk < 0:
            raise ValueError(f"rows_per_chunk must be an int >= 0, got {rows_per_chunk!r}")
        self.rows_per_chunk = rows_per_chunk
        self.device_memory_bytes = device_memory_bytes
        self.model_config = model_config
        self.layout = layout
        self.mesh = mesh
        self.score = score
        self.settings = dict(
            max_new_tokens=max_new_tokens,
            greedy=bool(greedy),
            temperature=float(temperature),
            top_k=top_k,
            top_p=top_p,
            eos_token_ids=None if eos_token_ids is None else tuple(eos_token_ids),
        )
        self.params = params if mesh is None else place_params(params, mesh, model_config)

    def _inputs(self, basis: SVDBasis, genomes: Any, batch: PromptBatch, key: jax.Array):
        """The program's arguments, as global arrays on the mesh (replicated: the program pads
        and slices its own shards, so nothing but the P genomes' slices moves); abstract inputs
        stay abstract (`lower`)."""

        def arr(x: Any, dtype: Any) -> Any:
            return jax.ShapeDtypeStruct(x.shape, dtype) if _abstract(x) else np.asarray(x, dtype)

        if not _abstract(key):
            key = jnp.asarray(key)
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            # Raw uint32 [2] data: what each process can place from its own copy.
            data = jax.eval_shape if _abstract(key) else (lambda f, k: f(k))
            key = data(jax.random.key_data, key)
        args = (
            basis,
            arr(genomes, np.float32),
            arr(batch.tokens, np.int32),
            arr(batch.mask, np.int32),
            key if _abstract(key) else np.asarray(key),
        )
        return args if self.mesh is None else on_mesh(args, self.mesh)

    def shard_rows(self, num_members: int, num_prompts: int) -> int:
        """Rows each device generates: (P_pad / pop) * (B_pad / data) (`essa_jax.mesh` padding)."""
        pop, data = axis_size(self.mesh, POP_AXIS), axis_size(self.mesh, DATA_AXIS)
        return (padded_size(num_members, pop) // pop) * (padded_size(num_prompts, data) // data)

    def _local_device_memory(self) -> int | None:
        """This process's device memory (`memory.device_memory_bytes` of its first device), the
        smallest over processes: the chunk is a static argument, so every process must derive
        the same one (or they would compile different programs and wait on each other)."""
        if not hasattr(self, "_device_memory"):
            memory = device_memory_bytes(jax.local_devices()[0])
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils

                # In MiB: int32 (JAX's default integers) holds up to 2 PiB.
                mine = np.asarray(-1 if memory is None else memory >> 20, np.int32)
                every = np.asarray(multihost_utils.process_allgather(mine))
                memory = None if (every < 0).any() else int(every.min()) << 20
            self._device_memory = memory
        return self._device_memory

    def rows_per_chunk_for(self, basis: SVDBasis, genomes: Any, batch: PromptBatch) -> int:
        """The chunk the program uses for these inputs (arrays or `jax.ShapeDtypeStruct`s): the
        constructor's `rows_per_chunk` if > 0; else the largest chunk that
        `essa_jax.memory.choose_rows_per_chunk` fits in `device_memory_bytes` next to the
        device's shard of the weights and the basis, with a row's KV cache and activations
        divided over the ``model`` axis (all the device's rows when they fit); 0 (no chunking)
        when the device memory is unknown (CPU). Raises ValueError naming essa.rows_per_chunk
        when not even one row fits."""
        if self.rows_per_chunk:
            return self.rows_per_chunk
        memory = self.device_memory_bytes
        if memory is None:
            memory = self._local_device_memory()
        if memory is None:
            return 0
        tokens_shape = _shape(batch.tokens)
        dtype = jax.tree.leaves(self.params)[0].dtype
        if isinstance(self.params, Mapping) and "embed" in self.params:
            dtype = self.params["embed"].dtype  # the cache dtype `models.generate` defaults to
        return choose_rows_per_chunk(
            self.model_config,
            rows=self.shard_rows(_shape(genomes)[0], tokens_shape[-2]),
            prompt_len=tokens_shape[-1],
            max_new_tokens=self.settings["max_new_tokens"],
            cache_dtype=dtype,
            device_memory_bytes=memory,
            reserved_bytes=tree_bytes(self.params, per_device=True) + tree_bytes(basis),
            setting="essa.rows_per_chunk",
            model_shards=axis_size(self.mesh, MODEL_AXIS),
        )

    def generate(self, basis: SVDBasis, genomes: Any, batch: PromptBatch, key: jax.Array):
        """The padded generation `[P_pad, B_pad, ...]`, sharded over the mesh (global arrays)."""
        num_members = int(np.shape(genomes)[0])
        if batch.per_candidate and np.shape(batch.tokens)[0] != num_members:
            raise ValueError(
                f"per-candidate prompts are [P, B, T] with P={np.shape(batch.tokens)[0]}, but the "
                f"population has P={num_members} members"
            )
        chunk = self.rows_per_chunk_for(basis, genomes, batch)
        basis, genomes, tokens, mask, key = self._inputs(basis, genomes, batch, key)
        return population_generate(
            self.params,
            self.model_config,
            basis,
            self.layout,
            genomes,
            tokens,
            mask,
            key,
            mesh=self.mesh,
            keep_padding=True,
            rows_per_chunk=chunk,
            **self.settings,
        )

    def lower(self, basis: SVDBasis, genomes: Any, batch: PromptBatch, key: jax.Array):
        """The lowered generation program (for cost, memory and communication accounting).

        Every input may be abstract (`jax.ShapeDtypeStruct`): basis leaves, genomes `[P, D]`,
        `batch.tokens` / `batch.mask` `[B, T]` or `[P, B, T]` (prompts and fields unused), key
        (uint32 `[2]` or a typed key); with the params abstract too, nothing is allocated, e.g.
        `lower(...).compile().memory_analysis()` for a device of `device_memory_bytes`.
        """
        from essa_jax.population.engine import _population_generate

        chunk = self.rows_per_chunk_for(basis, genomes, batch)
        basis, genomes, tokens, mask, key = self._inputs(basis, genomes, batch, key)
        return _population_generate.lower(
            self.params,
            basis,
            genomes,
            tokens,
            mask,
            key,
            config=self.model_config,
            layout=self.layout,
            mesh=self.mesh,
            keep_padding=True,
            rows_per_chunk=chunk,
            **self.settings,
        )

    def __call__(
        self, basis: SVDBasis, genomes: Any, batch: PromptBatch, key: jax.Array
    ) -> PopulationEval:
        """Fitness `[P]` = mean reward of each member over its B prompts (maximised)."""
        num_members, num_prompts = int(np.shape(genomes)[0]), batch.num_prompts
        gen = self.generate(basis, genomes, batch, key)
        blocks = _local_blocks(gen, num_members, num_prompts)
        if not blocks:  # this process's devices hold padding only (P < devices on the pop axis)
            blocks = [(np.zeros(0, int), np.zeros(0, int), _empty_rows(gen))]
        members = np.concatenate([np.repeat(m, len(q)) for m, q, _ in blocks])
        prompts = np.concatenate([np.tile(q, len(m)) for m, q, _ in blocks])
        # Member-major order, whatever the blocks: the score sees rows as one device would.
        order = np.lexsort((prompts, members))
        members, prompts = members[order], prompts[order]
        rows = Generation(
            **{
                n: np.concatenate([d[n].reshape((-1,) + d[n].shape[2:]) for _, _, d in blocks])[
                    order
                ]
                for n in _FIELDS
            }
        )
        pairs = list(zip(members.tolist(), prompts.tolist(), strict=True))
        local = Rows(
            members=members,
            prompts=prompts,
            generation=rows,
            texts=[batch.row(batch.prompts, m, q) for m, q in pairs],
            fields={k: [batch.row(v, m, q) for m, q in pairs] for k, v in batch.fields.items()},
        )
        rewards = np.asarray(self.score(local) if pairs else [], np.float32)
        if rewards.shape != (len(pairs),):
            raise ValueError(
                f"the score function returned {rewards.shape[0] if rewards.ndim else rewards} "
                f"rewards for {len(pairs)} completions; it must return one per completion"
            )
        grid = np.zeros((3, num_members, num_prompts), np.float32)
        owned = np.zeros((num_members, num_prompts), bool)
        grid[0, members, prompts] = rewards
        grid[1, members, prompts] = rows.lengths
        grid[2, members, prompts] = rows.finished
        owned[members, prompts] = True
        rewards, lengths, finished = allgather_owned(grid, owned)
        lengths, finished = lengths.astype(np.int32), finished > 0
        fitness = rewards.mean(axis=1)
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "fitness_std": float(fitness.std()),
            "zero_variance_members": float(np.mean(rewards.std(axis=1) == 0)),
            "completion_len": float(lengths.mean()),
            "truncated": float(1.0 - finished.mean()),
            "tokens": int(lengths.sum()),
        }
        return PopulationEval(fitness, rewards, lengths, finished, metrics)


def essa_generation(
    strategy: Any,
    state: Any,
    key: jax.Array,
    evaluate: Callable[[jax.Array, jax.Array], PopulationEval],
    *,
    skip_flat: bool = False,
    name: str | None = None,
) -> tuple[Any, PopulationEval]:
    """One ESSA generation (arXiv 2507.04453, Alg. 1): ask -> evaluate -> tell. Fitness MAXIMISED.

    Every process calls it with the same `state` and `key`, so `ask` regenerates the identical
    population everywhere (only seeds travel); `evaluate(z [P, D], key) -> PopulationEval` (a
    `PopulationEvaluator` behind the search-space map of the caller) returns the same fitness on
    every process, so `tell` leaves the same state everywhere.

    skip_flat: leave the state as it is when every member has the same fitness. Equal fitness
      carries no ranking; CMA-ES would still move its mean (ties broken by index), a random walk of
      sigma * ||z|| / sqrt(mu_eff) per generation. Reported as metrics["skipped_tell"].
    name: the strategy's registry name, for the errors below (default: its class name).

    The strategy's points are checked where they enter the loop: a non-finite genome from `ask`
    (before any rollout: NaN weights would generate garbage that scores as a flat population)
    or a non-finite mean / sigma from `tell` raises `SearchError` naming the strategy.

    Returns (new strategy state, the evaluation).
    """
    who = repr(name) if name else type(strategy).__name__
    k_ask, k_eval = jax.random.split(key)
    z = strategy.ask(k_ask, state)
    if getattr(z, "ndim", 0) != 2:
        raise SearchError(
            f"strategy {who}: ask returned an array of shape {getattr(z, 'shape', None)}; it "
            "must return the population as [population_size, num_dims]"
        )
    bad = int(np.sum(~np.all(np.isfinite(np.asarray(z, np.float32)), axis=-1)))
    if bad:
        raise SearchError(
            f"strategy {who}: ask returned {bad} of {z.shape[0]} candidates with non-finite "
            "values (NaN / inf); a strategy must return finite points (check its sampling and "
            "its sigma / covariance update)"
        )
    ev = evaluate(z, k_eval)
    flat = bool(skip_flat) and float(np.ptp(ev.fitness)) == 0.0
    new = state if flat else strategy.tell(state, z, jnp.asarray(ev.fitness))
    if not flat:
        for field in ("mean", "sigma"):
            value = getattr(new, field, None)
            if value is not None and not bool(np.all(np.isfinite(np.asarray(value)))):
                raise SearchError(
                    f"strategy {who}: tell returned a non-finite {field} (NaN / inf) from "
                    f"finite fitness in [{float(np.min(ev.fitness)):g}, "
                    f"{float(np.max(ev.fitness)):g}]; its update divides by zero or overflows"
                )
    ev.metrics["skipped_tell"] = float(flat)
    return new, ev
