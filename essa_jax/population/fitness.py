"""Fitness of a population: generate on device, decode and score on host, average per member.

ESSA's fitness of a candidate is its mean reward on a mini-batch of training prompts
(arXiv 2507.04453, Sec. 3.2; 100-500 prompts per candidate in the paper). Fitness is MAXIMISED.
Members either share one prompt batch (lower-variance comparison between candidates) or each draw
their own (the paper's "random mini-batch per candidate"); `sample_prompt_indices` does both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from essa_jax.lora.svd import GenomeLayout, SVDBasis
from essa_jax.models import Generation
from essa_jax.population.engine import population_generate
from essa_jax.population.mesh import DATA_AXIS, POP_AXIS

RewardFn = Callable[..., Sequence[float]]


@dataclasses.dataclass
class PopulationEval:
    """Host-side result of `evaluate_population` (P members x B prompts).

    fitness [P]: mean reward per member (maximised). rewards [P, B]. completions [P][B] decoded
    text. generation: the `Generation` as numpy arrays, fields [P, B, ...]. metrics: reward
    mean/std, fraction of members whose rewards are all equal, completion length, truncation.
    """

    fitness: np.ndarray
    rewards: np.ndarray
    completions: list[list[str]]
    generation: Generation
    metrics: dict[str, float]


def sample_prompt_indices(
    key: jax.Array,
    num_examples: int,
    population_size: int,
    prompts_per_member: int,
    *,
    per_member: bool,
) -> np.ndarray:
    """Indices of the prompts each member is scored on: `[P, B]` int.

    per_member=False: one batch of B distinct prompts shared by all members (rows identical).
    per_member=True: member i draws its own B prompts with fold_in(key, i) (the paper's mini-batch
    per candidate). Sampling is without replacement when B <= num_examples, else with.
    """
    if num_examples < 1 or population_size < 1 or prompts_per_member < 1:
        raise ValueError(
            f"num_examples={num_examples}, population_size={population_size} and "
            f"prompts_per_member={prompts_per_member} must all be >= 1"
        )
    replace = prompts_per_member > num_examples

    def draw(k):
        return jax.random.choice(k, num_examples, (prompts_per_member,), replace=replace)

    if per_member:
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(population_size))
        return np.asarray(jax.vmap(draw)(keys))
    return np.tile(np.asarray(draw(key))[None], (population_size, 1))


def decode_completions(
    decode: Any, generation: Generation, eos_token_ids: Sequence[int] = ()
) -> list[list[str]]:
    """Decode `[P, B, N]` generated tokens into text, dropping the pad tail and a final EOS.

    `decode` is a tokenizer (its `.decode(ids, skip_special_tokens=True)` is used) or a callable
    `list[int] -> str`.
    """
    if hasattr(decode, "decode"):
        tok = decode
        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    tokens = np.asarray(generation.tokens)
    lengths = np.asarray(generation.lengths)
    eos = set(int(e) for e in eos_token_ids)
    out = []
    for p in range(tokens.shape[0]):
        row = []
        for b in range(tokens.shape[1]):
            ids = tokens[p, b, : lengths[p, b]].tolist()
            if ids and ids[-1] in eos:
                ids = ids[:-1]
            row.append(decode(ids))
        out.append(row)
    return out


def _per_row(values: Sequence[Any], p: int, b: int, name: str) -> list[Any]:
    """Flatten prompt-aligned values, shared `[B]` or per member `[P][B]`, to P*B member-major."""
    values = list(values)
    if len(values) == b and not (p == b and values and isinstance(values[0], list | tuple)):
        return values * p
    if len(values) == p and all(len(v) == b for v in values):
        return [x for v in values for x in v]
    raise ValueError(
        f"{name} must have B={b} entries (shared) or P={p} lists of B={b} (per member), "
        f"got {len(values)} entries"
    )


def evaluate_population(
    params: dict,
    config: Any,
    basis: SVDBasis,
    layout: GenomeLayout,
    genomes: jax.Array,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    prompts: Sequence[Any],
    reward_fn: RewardFn,
    decode: Any,
    task_fields: Mapping[str, Sequence[Any]] | None = None,
    max_new_tokens: int,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_ids: Sequence[int] | None = None,
    mesh: Mesh | None = None,
) -> PopulationEval:
    """Fitness `[P]` = mean reward of each member over its B prompts (maximised).

    Args:
      genomes: `[P, D]`; prompt_tokens / prompt_mask: `[B, T]` shared or `[P, B, T]` per member.
      prompts: the prompt texts (passed to reward_fn), `[B]` or `[P][B]` like the tokens.
      reward_fn: `fn(prompts, completions, **task_fields) -> list[float]`, called once on host
        with all P*B rows (member-major).
      decode: tokenizer or `list[int] -> str`.
      task_fields: per-prompt columns for the reward (e.g. {"answer": [...]}), `[B]` or `[P][B]`.
      Remaining arguments as `population_generate`.
    """
    gen = population_generate(
        params,
        config,
        basis,
        layout,
        genomes,
        prompt_tokens,
        prompt_mask,
        key,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_ids=eos_token_ids,
        mesh=mesh,
    )
    gen = jax.tree.map(np.asarray, gen)
    p, b = gen.lengths.shape
    eos = config.eos_token_ids if eos_token_ids is None else eos_token_ids
    completions = decode_completions(decode, gen, eos)
    flat_prompts = _per_row(prompts, p, b, "prompts")
    fields = {k: _per_row(v, p, b, k) for k, v in (task_fields or {}).items()}
    flat_completions = [c for row in completions for c in row]
    rewards = np.asarray(reward_fn(flat_prompts, flat_completions, **fields), np.float32)
    if rewards.shape != (p * b,):
        raise ValueError(f"reward_fn returned {rewards.shape[0]} rewards for {p * b} completions")
    rewards = rewards.reshape(p, b)
    fitness = rewards.mean(axis=1)
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "fitness_std": float(fitness.std()),
        "zero_variance_members": float(np.mean(rewards.std(axis=1) == 0)),
        "completion_len": float(gen.lengths.mean()),
        "truncated": float(1.0 - gen.finished.mean()),
    }
    return PopulationEval(fitness, rewards, completions, gen, metrics)


def evaluate_genome(
    params: dict,
    config: Any,
    basis: SVDBasis,
    layout: GenomeLayout,
    genome: jax.Array,
    prompt_tokens: jax.Array,
    prompt_mask: jax.Array,
    key: jax.Array,
    *,
    mesh: Mesh | None = None,
    **kwargs: Any,
) -> PopulationEval:
    """Score one genome (e.g. the CMA-ES mean) on held-out prompts through the same engine.

    genome `[D]`, prompt_tokens `[B, T]`. With a mesh, its devices are re-arranged as a
    (pop=1, data=all) mesh so that the prompts, not copies of the genome, are spread over them.
    Other keyword arguments as `evaluate_population`. Returns a `PopulationEval` with P = 1.
    """
    if jnp.ndim(genome) != 1:
        raise ValueError(f"genome must be [D], got shape {jnp.shape(genome)}")
    if mesh is not None:
        devices = np.asarray(mesh.devices).reshape(1, -1)
        mesh = Mesh(devices, (POP_AXIS, DATA_AXIS), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    return evaluate_population(
        params,
        config,
        basis,
        layout,
        jnp.asarray(genome)[None],
        prompt_tokens,
        prompt_mask,
        key,
        mesh=mesh,
        **kwargs,
    )
