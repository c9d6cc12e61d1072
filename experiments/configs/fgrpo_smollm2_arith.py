"""F-GRPO (focal GRPO, arXiv 2602.06717) on the same task: grpo_smollm2_arith.py with gamma = 0.5.

Each prompt group's advantages are scaled by (1 - mu)^gamma, mu = the group's success rate, so
prompts the policy already solves push less (the paper's gamma 0.5 is its best setting).
"""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "grpo_smollm2_arith.py"))
    c.method = "fgrpo"
    c.grpo.focal_gamma = 0.5
    return c
