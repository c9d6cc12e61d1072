"""A few ESSA generations on a tiny random model over a mesh of every process's devices.

Run as one process (any device count) or under experiments/launch_local.py; test_determinism.py
compares the outputs of 1 device, 1 process x 8 devices and 2 processes x 4 devices. The generation
itself is the library's (essa_jax.population.essa_generation through essa_jax.scaling.probe): shared
population, sharded generation, each process scores its own rows, per-row scores gathered. Two
scores: the mean log-probability of the greedy completion (continuous) and an exact one computed
from the greedy tokens alone (identical on every layout whenever the tokens are).

Saved: the fitness per generation and the CMA-ES search state (mean, sigma, p_sigma, p_c, C, B,
D, ...) at the start ("start_" / "token_start_") and after the last generation ("" / "token_").

usage: essa_worker.py OUT_DIR [GENERATIONS]   (writes OUT_DIR/p<process_id>.npz)
"""

import dataclasses
import os
import sys

import numpy as np

from essa_jax import distributed as D

D.initialize(timeout_s=120, heartbeat_timeout_s=30)

import jax  # noqa: E402

from essa_jax.scaling.probe import make_mesh_essa  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def token_score(rows):
    """An exact score of the greedy tokens alone: (sum of generated ids mod 97) / 97."""
    g = rows.generation
    return ((np.asarray(g.tokens) * np.asarray(g.mask)).sum(axis=-1) % 97 / 97).astype(np.float32)


# Bookkeeping of the strategy state (counters, best-so-far): not search state, not compared.
BOOKKEEPING = {
    "generation",
    "best_member",
    "best_fitness",
    "generation_best_fitness",
    "num_nonfinite",
    "update_norm",
}


def search_state(state, prefix):
    """The CMA-ES search state's fields (mean, sigma, paths, covariance, B, D) as named arrays."""
    return {
        prefix + f.name: np.asarray(getattr(state, f.name))
        for f in dataclasses.fields(state)
        if f.name not in BOOKKEEPING
    }


def run(gens, score=None):
    essa, state = make_mesh_essa(population_size=8, prompts=2)
    start = state
    if score is not None:
        essa.evaluator.score = score
    history = []
    for g in range(gens):
        state, fitness = essa.generation(state, g)
        history.append(fitness)
    return start, state, np.stack(history)


def main():
    out_dir, gens = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    start, state, history = run(gens)
    token_start, token_state, token_history = run(gens, token_score)
    info = D.process_info()
    os.makedirs(out_dir, exist_ok=True)
    np.savez(
        os.path.join(out_dir, f"p{info.process_id}.npz"),
        fitness=history,
        token_fitness=token_history,
        **search_state(start, "start_"),
        **search_state(state, ""),
        **search_state(token_start, "token_start_"),
        **search_state(token_state, "token_"),
        devices=info.global_device_count,
        processes=info.num_processes,
    )
    print(
        f"worker {info.process_id}/{info.num_processes} on {info.global_device_count} devices: "
        f"best fitness per generation {[float(h.max()) for h in history]}",
        flush=True,
    )
    D.shutdown()


if __name__ == "__main__":
    main()
