"""GRPO on the generated instruction-following task, from the same SFT start as ESSA.

Model, task, reward, LoRA and SFT come from essa_smollm2_instructions.py itself, so both methods
start from the identical SFT adapter and are evaluated on the same held-out prompts. GRPO settings
as grpo_smollm2_arith.py (group N = 8, clip 0.2, token-mean loss, no KL, lr 1e-4 for rank-4 LoRA
on a 135M model); sampled at T = 1 with the same 64-token budget.
"""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "essa_smollm2_instructions.py"))
    c.method = "grpo"
    c.max_wall_seconds = 0.0  # step budget below; compare_instructions.sh sets equal wall-clock
    c.grpo.steps = 60
    c.grpo.batch_size = 32  # 4 prompts x N = 8 rollouts per step
    c.grpo.group_size = 8
    c.grpo.learning_rate = 1e-4
    c.grpo.weight_decay = 0.01
    c.grpo.max_grad_norm = 1.0
    c.grpo.loss = "grpo"
    c.grpo.eps_low = 0.2
    c.grpo.eps_high = 0.2
    c.grpo.agg = "token_mean"
    c.grpo.adv_scale = "group"
    c.grpo.focal_gamma = 0.0
    c.grpo.beta = 0.0
    c.grpo.temperature = 1.0
    c.eval.every = 10
    c.checkpoint.every = 10
    return c
