"""GRPO-family RL: group-relative and focal advantages, policy losses, the trainer step.

GRPO is `group_advantages` + `policy_loss`; F-GRPO multiplies the advantages by `focal_weights`
(arXiv 2602.06717). DAPO and CISPO are loss settings (`GRPOConfig.method`).
"""

from essa_jax.rl.advantages import (
    focal_group_advantages,
    focal_weights,
    group_advantages,
    success_rate,
    zero_variance_fraction,
)
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.losses import aggregate, k3_kl, policy_loss

__all__ = [
    "GRPOConfig",
    "aggregate",
    "focal_group_advantages",
    "focal_weights",
    "group_advantages",
    "k3_kl",
    "policy_loss",
    "success_rate",
    "zero_variance_fraction",
]
