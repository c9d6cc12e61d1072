"""A few ESSA generations on a tiny random model over a mesh of every process's devices.

Run as one process (any device count) or under experiments/launch_local.py; test_determinism.py
compares the outputs of 1 device, 1 process x 8 devices and 2 processes x 4 devices. The generation
itself is essa_jax.scaling.probe (shared population, sharded evaluation, P floats gathered).

usage: essa_worker.py OUT_DIR [GENERATIONS]   (writes OUT_DIR/p<process_id>.npz)
"""

import os
import sys

import numpy as np

from essa_jax import distributed as D

D.initialize(timeout_s=120, heartbeat_timeout_s=30)

import jax  # noqa: E402

from essa_jax.scaling.probe import make_mesh_essa  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def main():
    out_dir, gens = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    essa, state = make_mesh_essa(population_size=8, prompts=2)
    history = []
    for g in range(gens):
        state, fitness = essa.generation(state, g)
        history.append(fitness)
    info = D.process_info()
    os.makedirs(out_dir, exist_ok=True)
    np.savez(
        os.path.join(out_dir, f"p{info.process_id}.npz"),
        fitness=np.stack(history),
        mean=np.asarray(state.mean),
        sigma=np.asarray(state.sigma),
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
