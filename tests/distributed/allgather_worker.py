"""Run by test_multihost.py under experiments/launch_local.py: one rank of a 2-process run.

Checks, on each process, the fitness gather (process route and in-program route), the global mesh
and process-0-only writing; prints a JSON line the test reads back.
"""

import json
import sys

import numpy as np

from essa_jax import distributed as D

info = D.initialize(timeout_s=60, heartbeat_timeout_s=20)

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from essa_jax.es.distributed import evaluate_across_processes  # noqa: E402

pop = 16
sl = D.local_population_slice(pop)
# Each process "evaluates" only its members: fitness of member m is m**2 / 7.
local = (np.arange(sl.start, sl.stop, dtype=np.float32) ** 2) / 7
gathered = D.allgather_fitness(local)

mesh = D.global_mesh()
sharded = jax.make_array_from_process_local_data(NamedSharding(mesh, P(D.POPULATION_AXIS)), local)
replicated = np.asarray(D.replicate(sharded, mesh).addressable_data(0))

# The loop-side helper of essa_jax.es: each process scores only its members (row sums here).
population = np.arange(pop * 3, dtype=np.float32).reshape(pop, 3)
evaluated = []
via_helper = evaluate_across_processes(
    lambda members: evaluated.append(len(members)) or np.asarray(members).sum(axis=1),
    jax.numpy.asarray(population),
)
via_helper = np.asarray(via_helper)

if D.is_main_process():
    with open(sys.argv[1], "w") as f:
        f.write("written by process 0\n")
print(
    "RESULT "
    + json.dumps(
        {
            "process_id": info.process_id,
            "num_processes": info.num_processes,
            "global_devices": info.global_device_count,
            "local_devices": info.local_device_count,
            "slice": [sl.start, sl.stop],
            "mesh": list(mesh.devices.shape),
            "gathered": gathered.tolist(),
            "replicated": replicated.tolist(),
            "via_helper": via_helper.tolist(),
            "evaluated": evaluated,
        }
    ),
    flush=True,
)
D.shutdown()
