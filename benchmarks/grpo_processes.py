"""One data-parallel GRPO step on 1 process vs 2 local processes (CPU, gloo over 127.0.0.1).

A random "small" model (essa_jax.models.tiny; 4 layers, d = 64, character vocabulary), 8 prompts x
group 4 = 32 rollouts of 32 new tokens, LoRA rank 4 on q, k, v, o, one update per step. Each layout
runs the library's `GRPOTrainer(mesh=...).step` on a mesh of every process's devices (one device
per process): the rollout program is sharded over both processes, each process rewards only its
own rows, and per-row rewards are all-gathered. Reported per layout: the median wall time of the
steps after the first (compiling) one, its rollout / update parts, and the rollouts each process
generated and rewarded (the point: no process repeats another's work).

On a 2-core machine two processes share the cores that one process already uses, so the step time
says little about speed-up; the rollout counts say that the work is split.

usage: python benchmarks/grpo_processes.py      (writes experiments/results/grpo_processes.json)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, NEW_TOKENS, STEPS = 8, 4, 32, 4


def worker(out: str) -> None:
    """One layout's steps (run under experiments/launch_local.py, or alone)."""
    from essa_jax import distributed as D

    D.initialize(timeout_s=120, heartbeat_timeout_s=30)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from essa_jax.lora import LoraConfig, init_lora, lora_policy
    from essa_jax.mesh import make_mesh
    from essa_jax.models.tiny import tiny_model
    from essa_jax.rl import FrozenPolicy, GRPOConfig, GRPOTrainer, place_base

    config, params = tiny_model("small", 0)
    lora = init_lora(jax.random.key(1), config, LoraConfig(rank=4, alpha=8.0), jnp.float32)
    trainable, frozen, to_lora = lora_policy(lora)
    mesh = make_mesh(pop=1, data=jax.device_count())
    cfg = GRPOConfig(group_size=GROUP, max_new_tokens=NEW_TOKENS, learning_rate=1e-3)
    rewarded: list[int] = []

    def reward(prompts, completions, **fields):
        rewarded.append(len(completions))
        return [float(len(c) % 2) for c in completions]

    trainer = GRPOTrainer(
        config,
        cfg,
        to_lora=to_lora,
        reward_fn=reward,
        decode=lambda ids: "".join(chr(97 + i % 26) for i in ids),
        mesh=mesh,
    )
    policy = FrozenPolicy(place_base(params, mesh, config), frozen)
    state = trainer.init(trainable, jax.random.key(2))
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(STEPS):
        toks = rng.integers(3, config.vocab_size, (PROMPTS, 16)).astype(np.int32)
        texts = [str(i) for i in range(PROMPTS)]
        state, m = trainer.step(state, policy, toks, np.ones_like(toks), texts)
        rows.append({k: m[k] for k in ("step_s", "rollout_s", "update_s", "local_rollouts")})
    info = D.process_info()
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"p{info.process_id}.json").write_text(
        json.dumps({"steps": rows, "rewarded": sum(rewarded), "processes": info.num_processes})
    )
    D.shutdown()


def run_layout(processes: int, out: Path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out)]
    if processes > 1:
        launcher = ROOT / "experiments" / "launch_local.py"
        cmd = [sys.executable, str(launcher), "-n", str(processes), "--devices-per-process", "1",
               "--timeout", "300", "--", *cmd]  # fmt: skip
    else:
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=330)
    return [json.loads((out / f"p{i}.json").read_text()) for i in range(processes)]


def main() -> None:
    from benchmarks.common import print_table, write_results

    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for processes in (1, 2):
            per_process = run_layout(processes, Path(tmp) / f"n{processes}")
            steps = per_process[0]["steps"][1:]  # the first step compiles
            table.append(
                {
                    "processes": processes,
                    "devices": processes,
                    "step_s": statistics.median(s["step_s"] for s in steps),
                    "rollout_s": statistics.median(s["rollout_s"] for s in steps),
                    "update_s": statistics.median(s["update_s"] for s in steps),
                    "rollouts_per_step": PROMPTS * GROUP,
                    "rollouts_generated_per_process": [
                        int(p["steps"][-1]["local_rollouts"]) for p in per_process
                    ],
                    "rewarded_per_process_all_steps": [p["rewarded"] for p in per_process],
                }
            )
    print_table(table, title="one GRPO step, 1 vs 2 local processes (CPU, one device each)")
    write_results(
        "grpo_processes",
        {
            "setup": {
                "model": "random:small (essa_jax.models.tiny)",
                "prompts": PROMPTS,
                "group_size": GROUP,
                "new_tokens": NEW_TOKENS,
                "timed_steps": STEPS - 1,
            },
            "layouts": table,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        sys.path.insert(0, str(ROOT))
        main()
