"""One data-parallel GRPO step and one SFT step on a tiny random model over every process's devices.

Run as one process (any device count) or under experiments/launch_local.py;
test_grpo_multiprocess.py compares 1 process x 8 devices with 2 processes x 4 devices. The step is
the library's (`GRPOTrainer(mesh=...).step`, `train_sft(mesh=...)`): one sharded rollout program,
each process rewards only its own rows, per-row rewards all-gathered, the update data-parallel.
The reward function counts the completions it is given: each process must score only its share.

usage: grpo_worker.py OUT_DIR [lora|full]   (writes OUT_DIR/p<process_id>.npz)

"full": every weight trained (`lora.full`), the masters, AdamW state and base split over the data
axis (ZeRO), so across the two processes' devices; the result is gathered with `mesh.host_copy`.
"""

import os
import sys
from types import SimpleNamespace

import numpy as np

from essa_jax import distributed as D

D.initialize(timeout_s=120, heartbeat_timeout_s=30)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from essa_jax.lora import LoraConfig, init_lora, lora_policy  # noqa: E402
from essa_jax.lora.full import full_policy, merge_weights  # noqa: E402
from essa_jax.mesh import host_copy, make_mesh  # noqa: E402
from essa_jax.models import init_params  # noqa: E402
from essa_jax.rl import (  # noqa: E402
    FrozenPolicy,
    GRPOConfig,
    GRPOTrainer,
    place_base,
)
from essa_jax.train.rollouts import PromptSet  # noqa: E402
from essa_jax.train.sft import train_sft  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from toy_model import TOY_CONFIG as CONFIG  # noqa: E402

PROMPTS, GROUP = 4, 4  # 16 rollouts
rewarded = []  # completions this process scored


def parity_reward(prompts, completions, **fields):
    rewarded.append(len(completions))
    return [float(sum(map(int, c.split())) % 2 == 0) for c in completions]


def main():
    out_dir = sys.argv[1]
    full = len(sys.argv) > 2 and sys.argv[2] == "full"
    mesh = make_mesh(pop=1, data=jax.device_count())
    params = jax.jit(init_params, static_argnums=1)(jax.random.key(0), CONFIG)
    lora = init_lora(jax.random.key(1), CONFIG, LoraConfig(rank=2, alpha=4.0), jnp.float32)
    lora = {
        t: a.replace(b=0.3 * jax.random.normal(jax.random.key(i), a.b.shape))
        for i, (t, a) in enumerate(lora.items())
    }
    cfg = GRPOConfig(
        group_size=GROUP,
        max_new_tokens=4,
        learning_rate=1e-2,
        temperature=0.9,
        beta=0.05,
        num_minibatches=2,
    )
    trainable, frozen, to_lora = full_policy(params) if full else lora_policy(lora)
    trainer = GRPOTrainer(
        CONFIG,
        cfg,
        to_lora=to_lora,
        reward_fn=parity_reward,
        decode=lambda ids: " ".join(map(str, ids)),
        mesh=mesh,
        to_params=merge_weights if full else None,
    )
    toks = np.asarray(jax.random.randint(jax.random.key(2), (PROMPTS, 3), 3, 16), np.int32)
    texts = [f"p{i}" for i in range(PROMPTS)]
    state = trainer.init(trainable, jax.random.key(3))
    policy = FrozenPolicy(place_base(params, mesh, CONFIG, shard_data=full), frozen)
    new, m = trainer.step(state, policy, toks, np.ones_like(toks), texts, answer=texts)

    rng = np.random.default_rng(0)
    stoks = rng.integers(3, 16, (12, 5)).astype(np.int32)
    targets = [list(rng.integers(3, 16, 1 + i % 4)) + [2] for i in range(12)]
    data = PromptSet([str(i) for i in range(12)], stoks, np.ones_like(stoks), {}, targets)
    sft = SimpleNamespace(
        learning_rate=1e-2, weight_decay=0.0, max_grad_norm=1.0, steps=1, batch_size=6
    )
    sft_lora = train_sft(
        jax.tree.map(jnp.copy, trainable if full else lora),
        params,
        CONFIG,
        data,
        sft,
        seed=0,
        pad_id=0,
        mesh=mesh,
        to_params=merge_weights if full else None,
    )

    info = D.process_info()
    os.makedirs(out_dir, exist_ok=True)
    grpo_leaves = jax.tree.leaves(host_copy(new.params))
    # L2 norm of the LoRA's change over all its leaves: how far the GRPO step moved it.
    delta = zip(grpo_leaves, jax.tree.leaves(jax.device_get(trainable)), strict=True)
    moved = float(np.sqrt(sum(np.sum((a - np.asarray(b)) ** 2) for a, b in delta)))
    sft_leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(sft_lora))]
    np.savez(
        os.path.join(out_dir, f"p{info.process_id}.npz"),
        *grpo_leaves,
        *sft_leaves,
        moved=moved,
        rewarded=sum(rewarded),
        local_rollouts=m["local_rollouts"],
        reward_mean=m["reward_mean"],
        loss=m["loss"],
        devices=info.global_device_count,
        processes=info.num_processes,
    )
    print(
        f"worker {info.process_id}/{info.num_processes}: rewarded {sum(rewarded)} of "
        f"{PROMPTS * GROUP} rollouts, reward {m['reward_mean']:.3f}",
        flush=True,
    )
    D.shutdown()


if __name__ == "__main__":
    main()
