"""A self-contained ESSA generation over a device mesh, for scaling measurements and tests.

One generation exactly as ESSA distributes it (arXiv 2507.04453, Sec. 3): every process asks the
same strategy state with the same key (the identical population, regenerated locally), the
population is sharded over the mesh's population axis (each device generates for its members only:
one batch of members x prompts rows against shared base weights), the fitness vector is replicated
(one all-gather of P floats) and every process applies the identical `tell`.

Fitness here is the mean log-probability of a member's greedy completions on fixed random prompts:
continuous (so a member mix-up or a layout dependence shows in the numbers) and free of tokenizers
and tasks. The model is `essa_jax.train.tiny` (random weights); the adapter is a LoRA with a random
non-zero B (a fresh LoRA has B = 0, hence s_B = 0, and the genome could not act).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from essa_jax import distributed as D
from essa_jax import lora as lora_lib
from essa_jax.es import get_strategy
from essa_jax.models import forward
from essa_jax.scaling import comm
from essa_jax.train.rollouts import Sampler
from essa_jax.train.tiny import tiny_model


def member_fitness(params, basis, genomes, tokens, mask, key, *, layout, sampler):
    """Fitness of one device's members: genomes [P_local, D] -> [P_local] (maximised)."""
    p, b = genomes.shape[0], tokens.shape[0]
    lora = lora_lib.population_svd_lora(basis, layout, genomes, b)
    out = sampler(
        params, jnp.tile(tokens, (p, 1)), jnp.tile(mask, (p, 1)), key, lora=lora, greedy=True
    )
    lp = jnp.sum(out.logprobs * out.mask, axis=-1) / jnp.maximum(jnp.sum(out.mask, axis=-1), 1)
    return lp.reshape(p, b).mean(axis=-1)


@dataclasses.dataclass
class MeshESSA:
    """The pieces of a mesh-wide ESSA run; `generation(state, g)` advances it by one."""

    strategy: Any
    layout: Any
    mesh: Any
    fitness_fn: Any  # jitted: (params, basis, genomes, tokens, mask, key) -> fitness [P] sharded
    shared: tuple  # global (params, basis, tokens, mask)
    run_key: jax.Array

    def population(self, state: Any, g: int) -> tuple[jax.Array, jax.Array]:
        k_ask, k_gen = jax.random.split(jax.random.fold_in(self.run_key, g))
        return self.strategy.ask(k_ask, state), k_gen

    def fitness(self, z: jax.Array, k_gen: jax.Array) -> np.ndarray:
        params, basis, tokens, mask = self.shared
        z_global = D.host_to_global(z, self.mesh, P(D.POPULATION_AXIS))
        f = self.fitness_fn(
            params, basis, z_global, tokens, mask, D.host_to_global(k_gen, self.mesh)
        )
        return np.asarray(D.replicate(f, self.mesh).addressable_data(0))

    def generation(self, state: Any, g: int) -> tuple[Any, np.ndarray]:
        z, k_gen = self.population(state, g)
        fitness = self.fitness(z, k_gen)
        return self.strategy.tell(state, z, jnp.asarray(fitness)), fitness

    def lowered_fitness(self, state: Any):
        """The compiled-able fitness program (for communication accounting)."""
        z, k_gen = self.population(state, 0)
        params, basis, tokens, mask = self.shared
        return self.fitness_fn.lower(
            params,
            basis,
            D.host_to_global(z, self.mesh, P(D.POPULATION_AXIS)),
            tokens,
            mask,
            D.host_to_global(k_gen, self.mesh),
        )


def make_mesh_essa(
    population_size: int = 8,
    prompts: int = 2,
    *,
    prompt_len: int = 6,
    new_tokens: int = 4,
    preset: str = "tiny",
    rank: int = 2,
    sigma_init: float = 0.5,
    seed: int = 0,
    mesh: Any = None,
) -> tuple[MeshESSA, Any]:
    """(MeshESSA, initial strategy state); the mesh defaults to `D.global_mesh()` (all devices).

    population_size must be a multiple of the mesh's population axis.
    """
    mesh = D.global_mesh() if mesh is None else mesh
    shards = mesh.shape[D.POPULATION_AXIS]
    if population_size % shards:
        raise ValueError(
            f"population_size={population_size} is invalid: must be a multiple of the {shards} "
            "devices on the population axis"
        )
    key = jax.random.PRNGKey(seed)
    k_lora, k_b, k_prompt, k_init, k_run = jax.random.split(key, 5)
    cfg, params = tiny_model(preset, seed)
    lcfg = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank, targets=("k", "o", "q", "v"))
    lora = lora_lib.init_lora(k_lora, cfg, lcfg)
    lora = {
        t: a.replace(b=0.5 * jax.random.normal(jax.random.fold_in(k_b, i), a.b.shape))
        for i, (t, a) in enumerate(sorted(lora.items()))
    }
    basis, layout = lora_lib.svd_factorize(lora, 1.0)
    strategy = get_strategy(
        "cma_es", num_dims=layout.size, population_size=population_size, sigma_init=sigma_init
    )
    state = strategy.init(k_init, jnp.zeros((layout.size,), jnp.float32))
    tokens = jax.random.randint(k_prompt, (prompts, prompt_len), 3, 99)
    mask = jnp.ones_like(tokens)
    sampler = Sampler(cfg, new_tokens, (2,), 0)
    fn = jax.jit(
        jax.shard_map(
            partial(member_fitness, layout=layout, sampler=sampler),
            mesh=mesh,
            in_specs=(P(), P(), P(D.POPULATION_AXIS), P(), P(), P()),
            out_specs=P(D.POPULATION_AXIS),
            # The sampler's while_loop mixes replicated and member-varying carries.
            check_vma=False,
        )
    )
    shared = D.host_to_global((params, basis, tokens, mask), mesh)
    return MeshESSA(strategy, layout, mesh, fn, shared, k_run), state


def lora_gradient_traffic(rank: int = 8, preset: str = "tiny") -> dict:
    """HLO vs by-construction bytes of a data-parallel LoRA gradient of the tiny model (batch
    sharded over every device of `D.global_mesh()`, adapter replicated): the all-reduce GRPO pays
    per optimizer update (essa_jax.scaling.comm)."""
    cfg, params = tiny_model(preset, 0)
    lcfg = lora_lib.LoraConfig(rank=rank, alpha=2.0 * rank, targets=("q", "k", "v", "o"))
    lora = lora_lib.init_lora(jax.random.PRNGKey(1), cfg, lcfg)
    mesh = D.global_mesh()
    n = jax.device_count()
    tokens = jax.device_put(
        jax.random.randint(jax.random.PRNGKey(2), (2 * n, 12), 3, 99),
        NamedSharding(mesh, P(D.POPULATION_AXIS)),
    )

    def loss(lo, params, tokens):
        logits = forward(params, cfg, tokens[:, :-1], lora=lo)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    grad_fn = jax.jit(jax.grad(loss), out_shardings=NamedSharding(mesh, P()))
    got = comm.count_collectives(grad_fn, lora, params, tokens)
    want = comm.grpo_step_bytes(comm.tree_bytes(lora), n)
    return {
        "lora_bytes": comm.tree_bytes(lora),
        "hlo_payload_bytes": got.payload_bytes,
        "hlo_by_kind": got.by_kind,
        "construction_payload_bytes": want.payload_bytes,
        "hlo_wire_bytes_per_device": got.wire_bytes_per_device,
        "construction_wire_bytes_per_device": want.wire_bytes_per_device,
    }
