"""Run by test_multihost.py under experiments/launch_local.py: one rank of a 2-process run.

A PopulationEvaluator on one mesh over both processes' devices: each process must score only the
rows its own devices generated, and both must end with the identical fitness vector. The score of
row (member m, prompt q) is m * 10 + q, so the gathered fitness is exact. Prints a JSON line the
test reads back, and process 0 alone writes the marker file.
"""

import json
import sys

import numpy as np

from essa_jax import distributed as D

info = D.initialize(timeout_s=60, heartbeat_timeout_s=20)

import jax  # noqa: E402

from essa_jax import lora as lora_lib  # noqa: E402
from essa_jax.mesh import make_mesh  # noqa: E402
from essa_jax.models.tiny import tiny_model  # noqa: E402
from essa_jax.population import PopulationEvaluator, PromptBatch  # noqa: E402

P, B = 16, 2
scored = []


def score(rows):
    scored.extend(sorted(set(rows.members.tolist())))
    return (rows.members * 10 + rows.prompts).astype(np.float32)


config, params = tiny_model("tiny", 0)
lora = lora_lib.init_lora(
    jax.random.PRNGKey(1), config, lora_lib.LoraConfig(rank=2, alpha=4.0, targets=("q", "v"))
)
basis, layout = lora_lib.svd_factorize(lora, 1.0)
mesh = make_mesh()
evaluator = PopulationEvaluator(
    params, config, layout, mesh=mesh, score=score, max_new_tokens=2, greedy=True
)
tokens = np.arange(3, 3 + B * 4, dtype=np.int32).reshape(B, 4)
batch = PromptBatch(tokens, np.ones_like(tokens), ["a", "b"])
res = evaluator(basis, np.zeros((P, layout.size), np.float32), batch, jax.random.PRNGKey(0))

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
            "mesh": dict(mesh.shape),
            "fitness": res.fitness.tolist(),
            "scored_members": scored,
        }
    ),
    flush=True,
)
D.shutdown()
