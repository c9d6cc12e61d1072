"""GRPO on the same task as essa_smollm2_arith.py (same SFT warm start), for direct comparison.

LoRA factors trained by GRPO (arXiv 2402.03300): group N = 8, clip 0.2, token-mean loss, no KL.
The learning rate is far above the F-GRPO paper's 1e-6 (that is for full 7B fine-tuning); rank-4
LoRA on a 135M model needs ~1e-4 to move within a CPU budget.

Model, task, prompt format, LoRA and SFT come from essa_smollm2_arith.py itself, so every method
starts from the identical SFT adapter (same seed, same steps) and is evaluated on the same problems.
"""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "essa_smollm2_arith.py"))
    c.method = "grpo"
    c.max_wall_seconds = 0.0  # step budget below; compare_smollm2.sh sets equal wall-clock
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
    # Sampled at T = 1: one token more than the greedy ESSA rollouts, so that a sample that has
    # not stopped after a 3-digit answer shows up as truncated instead of cut.
    c.generation.max_new_tokens = 5
    c.eval.every = 10
    c.eval.pass_k_samples = 16
    c.eval.pass_k = (1, 4, 16)
    c.eval.pass_k_problems = 50
    c.checkpoint.every = 10
    return c
