"""GRPO on the generated instruction-following task, from the same SFT start as ESSA.

Model, task, reward, LoRA and SFT come from essa_smollm2_instructions.py, so both methods start
from the identical SFT adapter and are evaluated on the same held-out prompts; the GRPO settings
are grpo_smollm2_arith.py's (group N = 8, clip 0.2, token-mean loss, no KL, lr 1e-4 for rank-4
LoRA on a 135M model), sampled at T = 1 with this task's 64-token budget.
"""

import os

from essa_jax.config import load_config_file


def get_config():
    here = os.path.dirname(__file__)
    c = load_config_file(os.path.join(here, "essa_smollm2_instructions.py"))
    c.method = "grpo"
    c.max_wall_seconds = 0.0  # step budget; compare_instructions.sh sets equal wall-clock
    c.grpo = load_config_file(os.path.join(here, "grpo_smollm2_arith.py")).grpo
    return c
