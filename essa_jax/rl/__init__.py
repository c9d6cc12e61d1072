"""GRPO-family RL: advantage estimators x advantage weightings, policy losses, the trainer step.

The advantages of a step are `estimator(rewards) * weighting(rewards)`, both chosen by name from
registries (`GRPOConfig.advantage`, `GRPOConfig.weighting`):

  * estimators (`essa_jax.rl.advantage`): "group" (GRPO), "batch", "none" (Dr.GRPO); add one with
    `register_estimator(name, fn)`;
  * weightings (`essa_jax.rl.weighting`): "none", "focal" (F-GRPO, (1 - mu)^gamma per prompt group,
    arXiv 2602.06717: F-GRPO's separate transform, on the advantages before the loss, not an optax
    gradient transform); add one (or a group filter) with `register_weighting(name, fn)`;

each registered function being `fn(rewards [B], group_size, cfg) -> [B]`. The loss is
`policy_loss` of kind `GRPOConfig.loss` (`LOSS_KINDS`: "grpo", also DAPO with eps_high = 0.28;
"cispo"), reduced by one of `AGGREGATIONS`. What is trained (LoRA, singular values, ESSA's genome)
is the caller's choice: see `essa_jax.lora.policies`.

`GRPOTrainer.step` returns per-step metrics (floats): reward_mean / reward_std,
zero_variance_frac (groups with no signal), all_right_frac / all_wrong_frac (groups whose every
rollout is right, reward >= r_correct / wrong, reward <= r_wrong: F-GRPO's diagnostics,
`group_outcome_fractions`), focal_weight_mean (mean advantage weight; 1 with weighting "none"),
clip_low_frac / clip_high_frac, ratio_mean / ratio_min / ratio_max, kl (k3, to the base model; 0
when beta = 0 and no reference), entropy (mean token entropy of the sampling policy over the
completion tokens, nats; `rl.outcomes.step_metrics`), loss / pg_loss, adv_*,
completion_len_mean, truncation_rate (no EOS within max_new_tokens), grad_norm (before clipping),
update_norm, tokens_per_s (completion tokens per second of the whole step), rollout_tokens_per_s,
rollout_s, reward_s, score_s, update_s, step_s.
"""

from essa_jax.rl.advantage import (
    estimator_names,
    get_estimator,
    group_advantages,
    register_estimator,
    zero_variance_fraction,
)
from essa_jax.rl.config import GRPOConfig, GRPOConfigError
from essa_jax.rl.losses import AGGREGATIONS, LOSS_KINDS, aggregate, k3_kl, policy_loss
from essa_jax.rl.optimizer import adamw, make_optimizer
from essa_jax.rl.outcomes import compute_advantages, group_outcome_fractions, step_metrics
from essa_jax.rl.placement import on_mesh, one_device_mesh, place_base
from essa_jax.rl.programs import GRPOPrograms
from essa_jax.rl.state import FrozenPolicy, GRPOState, RewardFn, RolloutBatch
from essa_jax.rl.trainer import GRPOTrainer
from essa_jax.rl.weighting import (
    focal_group_advantages,
    focal_weights,
    get_weighting,
    register_weighting,
    success_rate,
    weighting_names,
)

__all__ = [
    "AGGREGATIONS",
    "LOSS_KINDS",
    "FrozenPolicy",
    "GRPOConfig",
    "GRPOConfigError",
    "GRPOPrograms",
    "GRPOState",
    "GRPOTrainer",
    "RewardFn",
    "RolloutBatch",
    "adamw",
    "aggregate",
    "compute_advantages",
    "estimator_names",
    "focal_group_advantages",
    "focal_weights",
    "get_estimator",
    "get_weighting",
    "group_advantages",
    "group_outcome_fractions",
    "k3_kl",
    "make_optimizer",
    "on_mesh",
    "one_device_mesh",
    "place_base",
    "policy_loss",
    "register_estimator",
    "register_weighting",
    "step_metrics",
    "success_rate",
    "weighting_names",
    "zero_variance_fraction",
]
