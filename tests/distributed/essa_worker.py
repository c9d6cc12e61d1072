"""A few ESSA generations on a tiny random model over a mesh of every process's devices.

Run as one process (any device count) or under experiments/launch_local.py; the determinism test
compares the outputs of 1 device, 1 process x 8 devices and 2 processes x 4 devices.

Each generation follows ESSA's distribution (arXiv 2507.04453, Sec. 3): every process asks the
same strategy state with the same key (identical population), the population is sharded over the
mesh's population axis (each device generates for its members only: one batch of members x
prompts rows against shared weights), the fitness vector is replicated (one all-gather of P floats)
and every process applies the identical `tell`. Fitness = mean log-probability of a member's greedy
completions: continuous, so any member-to-member mix-up or layout dependence shows.

usage: essa_worker.py OUT_DIR [GENERATIONS]   (writes OUT_DIR/p<process_id>.npz)
"""

import os
import sys
from functools import partial

import numpy as np

from essa_jax import distributed as D

D.initialize(timeout_s=120, heartbeat_timeout_s=30)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from essa_jax import lora as lora_lib  # noqa: E402
from essa_jax.es import get_strategy  # noqa: E402
from essa_jax.train.rollouts import Sampler  # noqa: E402
from essa_jax.train.tiny import tiny_model  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

POP, PROMPTS, PROMPT_LEN, NEW_TOKENS = 8, 2, 6, 4


def member_fitness(params, basis, genomes, tokens, mask, key, *, layout, sampler):
    """Fitness of this device's members: genomes [P_local, D] -> [P_local]."""
    p, b = genomes.shape[0], tokens.shape[0]
    lora = lora_lib.population_svd_lora(basis, layout, genomes, b)
    out = sampler(params, jnp.tile(tokens, (p, 1)), jnp.tile(mask, (p, 1)), key, lora=lora,
                  greedy=True)
    lp = jnp.sum(out.logprobs * out.mask, axis=-1) / jnp.maximum(jnp.sum(out.mask, axis=-1), 1)
    return lp.reshape(p, b).mean(axis=-1)


def main():
    out_dir, gens = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    key = jax.random.PRNGKey(0)
    k_lora, k_b, k_prompt, k_init, k_run = jax.random.split(key, 5)
    cfg, params = tiny_model("tiny", 0)
    lcfg = lora_lib.LoraConfig(rank=2, alpha=4.0, targets=("k", "o", "q", "v"))
    lora = lora_lib.init_lora(k_lora, cfg, lcfg)
    # A warm-started adapter (B != 0): a fresh one has s_B = 0 and the genome could not act.
    lora = {t: a.replace(b=0.5 * jax.random.normal(jax.random.fold_in(k_b, i), a.b.shape))
            for i, (t, a) in enumerate(sorted(lora.items()))}
    basis, layout = lora_lib.svd_factorize(lora, 1.0)
    strategy = get_strategy("cma_es", num_dims=layout.size, population_size=POP, sigma_init=0.5)
    state = strategy.init(k_init, jnp.zeros((layout.size,), jnp.float32))
    tokens = jax.random.randint(k_prompt, (PROMPTS, PROMPT_LEN), 3, 99)
    mask = jnp.ones_like(tokens)
    sampler = Sampler(cfg, NEW_TOKENS, (2,), 0)

    mesh = D.global_mesh()
    fn = jax.jit(jax.shard_map(
        partial(member_fitness, layout=layout, sampler=sampler), mesh=mesh,
        in_specs=(P(), P(), P(D.POPULATION_AXIS), P(), P(), P()), out_specs=P(D.POPULATION_AXIS),
        check_vma=False,
    ))
    shared = D.host_to_global((params, basis, tokens, mask), mesh)
    history = []
    for g in range(gens):
        k_ask, k_gen = jax.random.split(jax.random.fold_in(k_run, g))
        z = strategy.ask(k_ask, state)
        z_global = D.host_to_global(z, mesh, P(D.POPULATION_AXIS))
        f = fn(*shared[:2], z_global, *shared[2:], D.host_to_global(k_gen, mesh))
        fitness = np.asarray(D.replicate(f, mesh).addressable_data(0))
        history.append(fitness)
        state = strategy.tell(state, z, jnp.asarray(fitness))
    info = D.process_info()
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, f"p{info.process_id}.npz"), fitness=np.stack(history),
             mean=np.asarray(state.mean), sigma=np.asarray(state.sigma),
             devices=info.global_device_count, processes=info.num_processes)
    print(f"worker {info.process_id}/{info.num_processes} on {info.global_device_count} devices: "
          f"best fitness per generation {[float(h.max()) for h in history]}", flush=True)
    D.shutdown()


if __name__ == "__main__":
    main()
