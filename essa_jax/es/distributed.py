"""Seed-based distribution of a generation (ESSA, arXiv 2507.04453, Sec. 3 "Distribution").

Every process (or device) holds the same strategy state and the same key, so `strategy.ask`
produces the identical population everywhere; each evaluates only its contiguous shard of members,
the fitness values alone are all-gathered (a few bytes per member), and every process then runs the
identical `tell`. No population, gradient or weight ever crosses the network.

Shards are contiguous blocks of ceil(P / n) members; when n does not divide P the population is
padded by repeating its last member (the padded rows are evaluated and then dropped), because the
collectives need equal shapes on every participant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec

FitnessFn = Callable[[jax.Array], Any]


def shard_bounds(population_size: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """[start, stop) rows of the padded population that shard `shard_index` of `num_shards` gets."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(
            f"shard_index must lie in [0, num_shards) with num_shards >= 1, got "
            f"shard_index={shard_index}, num_shards={num_shards}"
        )
    per = -(-population_size // num_shards)
    return shard_index * per, (shard_index + 1) * per


def pad_population(population: jax.Array, num_shards: int) -> jax.Array:
    """[P, D] -> [ceil(P / n) * n, D], repeating the last member."""
    p = population.shape[0]
    extra = -p % num_shards
    if extra == 0:
        return population
    return jnp.concatenate([population, jnp.repeat(population[-1:], extra, axis=0)])


def evaluate_across_processes(fitness_fn: FitnessFn, population: jax.Array) -> jax.Array:
    """Evaluate this process's shard with `fitness_fn` and all-gather the full fitness vector.

    `population` [P, D] must be identical on every process (same state and key to `ask`);
    `fitness_fn` maps a [S, D] shard to [S] fitness values (any Python code: it runs eagerly on the
    host, e.g. generation plus reward). Returns fitness [P] in the population's dtype, identical on
    every process.
    Uses jax.experimental.multihost_utils.process_allgather (gloo on CPU); with one process it
    simply evaluates everything.
    """
    n, i = jax.process_count(), jax.process_index()
    p = population.shape[0]
    padded = pad_population(population, n)
    start, stop = shard_bounds(p, n, i)
    local = np.asarray(fitness_fn(padded[start:stop]), dtype=population.dtype)
    if local.shape != (stop - start,):
        raise ValueError(
            f"fitness_fn must return one value per member of its shard, shape ({stop - start},), "
            f"got {local.shape}"
        )
    if n == 1:
        return jnp.asarray(local[:p])
    gathered = multihost_utils.process_allgather(local, tiled=True)
    return jnp.asarray(np.asarray(gathered)[:p])


def evaluate_across_devices(
    fitness_fn: FitnessFn,
    population: jax.Array,
    mesh: jax.sharding.Mesh | None = None,
    axis_name: str = "pop",
) -> jax.Array:
    """Evaluate shards of `population` [P, D] on the devices of `mesh` along `axis_name` with
    shard_map, and all_gather the fitness so that every device holds all of it. -> [P].

    `fitness_fn` must be traceable by JAX ([S, D] -> [S]). By default the mesh is all local
    devices on one axis. The default axis name is the population axis of
    `essa_jax.population.make_population_mesh` and `essa_jax.distributed.global_mesh` ("pop"), so
    their meshes work as they are (other axes, such as "data", see the whole shard). Callable
    eagerly or inside jit.
    """
    if mesh is None:
        mesh = jax.sharding.Mesh(
            np.asarray(jax.local_devices()),
            (axis_name,),
            axis_types=(jax.sharding.AxisType.Auto,),
        )
    if axis_name not in mesh.shape:
        raise ValueError(
            f"axis_name {axis_name!r} is not a mesh axis; mesh axes: {mesh.axis_names}"
        )
    n, p = mesh.shape[axis_name], population.shape[0]

    def local(shard: jax.Array) -> jax.Array:
        return jax.lax.all_gather(fitness_fn(shard), axis_name, tiled=True)

    # all_gather(tiled) makes the output replicated, but the vma checker cannot infer that here.
    gathered = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=PartitionSpec(axis_name),
        out_specs=PartitionSpec(),
        check_vma=False,
    )(pad_population(population, n))
    return gathered[:p]


def distributed_generation(
    strategy: Any,
    key: jax.Array,
    state: Any,
    fitness_fn: FitnessFn,
    evaluate: Callable[[FitnessFn, jax.Array], jax.Array] = evaluate_across_processes,
) -> tuple[Any, jax.Array]:
    """ask -> evaluate this participant's shard -> all-gather fitness -> tell. Fitness MAXIMISED.

    Call it with the same `key` and `state` on every process; returns (new state, fitness [P]),
    identical everywhere. `evaluate` is `evaluate_across_processes` (default) or e.g.
    ``functools.partial(evaluate_across_devices, mesh=mesh)``.
    """
    population = strategy.ask(key, state)
    fitness = evaluate(fitness_fn, population)
    return strategy.tell(state, population, fitness), fitness
