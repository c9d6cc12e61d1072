"""GRPO-family RL: group-relative and focal advantages, policy losses, the trainer step.

GRPO is `group_advantages` + `policy_loss`; F-GRPO multiplies the advantages by `focal_weights`
(arXiv 2602.06717). DAPO and CISPO are loss settings (`GRPOConfig.method`).

`GRPOTrainer.step` returns per-step metrics (floats): reward_mean / reward_std,
zero_variance_frac (groups with no signal), focal_weight_mean, clip_low_frac / clip_high_frac,
ratio_mean / ratio_min / ratio_max, kl (k3, to the base model; 0 when beta = 0 and no reference),
entropy, loss / pg_loss, adv_*, completion_len_mean, truncation_rate (no EOS within
max_new_tokens), grad_norm (before clipping), update_norm, tokens_per_s (completion tokens per
second of the whole step), rollout_tokens_per_s, rollout_s, reward_s, score_s, update_s, step_s.
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
from essa_jax.rl.trainer import (
    FrozenPolicy,
    GRPOState,
    GRPOTrainer,
    RolloutBatch,
    compute_advantages,
    genome_policy,
    lora_policy,
    make_optimizer,
    svd_policy,
)

__all__ = [
    "FrozenPolicy",
    "GRPOConfig",
    "GRPOState",
    "GRPOTrainer",
    "RolloutBatch",
    "compute_advantages",
    "genome_policy",
    "lora_policy",
    "make_optimizer",
    "svd_policy",
    "aggregate",
    "focal_group_advantages",
    "focal_weights",
    "group_advantages",
    "k3_kl",
    "policy_loss",
    "success_rate",
    "zero_variance_fraction",
]
