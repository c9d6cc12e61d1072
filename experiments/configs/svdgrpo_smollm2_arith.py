"""SVD-GRPO (ESSA's gradient baseline, arXiv 2507.04453 Sec. 5) on the same task.

GRPO gradients on exactly what ESSA evolves: the singular values of the SFT adapter's SVD (U, V
frozen; same rank and alpha as essa_smollm2_arith.py). Singular values are O(0.1-1), so the
learning rate is larger than for the LoRA factors.
"""

import os

from essa_jax.config import load_config_file


def get_config():
    c = load_config_file(os.path.join(os.path.dirname(__file__), "grpo_smollm2_arith.py"))
    c.method = "svdgrpo"
    c.grpo.learning_rate = 1e-3
    c.essa.alpha = 1.0  # fraction of singular values trained, as in ESSA
    return c
