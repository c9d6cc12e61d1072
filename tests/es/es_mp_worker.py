"""One process of the two-process seed-distribution test (run by test_distributed.py).

argv: port process_id generations out.npz. Runs CMA-ES with jax.distributed over gloo on CPU,
evaluating only this process's half of every population, and saves the final state's fields.
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_default_matmul_precision", "highest")

from essa_jax.es import CMAES  # noqa: E402
from essa_jax.es.distributed import distributed_generation  # noqa: E402

NUM_DIMS, POPULATION = 6, 10


def toy_fitness(x):
    """-||x - 1||^2 in NumPy: a host-side fitness, as generation + reward would be."""
    return -np.sum((np.asarray(x, np.float64) - 1.0) ** 2, axis=-1)


def run(generations: int, evaluated: list[int]):
    s = CMAES(NUM_DIMS, population_size=POPULATION, sigma_init=0.5)
    state = s.init(jax.random.key(0), jnp.zeros(NUM_DIMS))

    def fitness_fn(shard):
        evaluated.append(int(shard.shape[0]))
        return toy_fitness(shard)

    for g in range(generations):
        state, _ = distributed_generation(
            s, jax.random.fold_in(jax.random.key(1), g), state, fitness_fn
        )
    return state


def main():
    port, pid, generations, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid
    )
    assert jax.process_count() == 2 and jax.process_index() == pid
    evaluated: list[int] = []
    state = run(generations, evaluated)
    fields = {f: np.asarray(getattr(state, f)) for f in type(state).__dataclass_fields__}
    np.savez(out, evaluated=np.asarray(evaluated), **fields)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
