"""What a step's rewards become: (focal) advantages, and the step's metrics and diagnostics.

GRPO (DeepSeekMath, arXiv 2402.03300, Eq. 3) and F-GRPO (arXiv 2602.06717): the advantages are the
estimator's times the weighting's, both chosen by name from their registries; the diagnostics are
F-GRPO's (all-right / all-wrong prompt groups, the sampling policy's token entropy).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from essa_jax.rl.advantage import _grouped, get_estimator, zero_variance_fraction
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.weighting import get_weighting


def compute_advantages(rewards: jax.Array, cfg: GRPOConfig) -> tuple[jax.Array, jax.Array]:
    """(weights * advantages, weights) per rollout, `[B]` each.

    advantages = `get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)` and weights =
    `get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg)`, both looked up by name in their
    registries (`essa_jax.rl.advantage`, `essa_jax.rl.weighting`): registering a new estimator or
    weighting (e.g. a group filter) needs no change here. The weighting is F-GRPO's separate
    transform: it scales the advantages per prompt group before the loss (weights are 1 with
    weighting "none"), and is a constant for the optimiser.
    """
    adv = get_estimator(cfg.advantage)(rewards, cfg.group_size, cfg)
    weights = jax.lax.stop_gradient(get_weighting(cfg.weighting)(rewards, cfg.group_size, cfg))
    return weights * adv, weights


def group_outcome_fractions(
    rewards: jax.Array, group_size: int, r_correct: float = 1.0, r_wrong: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """(all-right fraction, all-wrong fraction) of a step's prompt groups: F-GRPO's diagnostics
    (arXiv 2602.06717) of how many groups the policy already always solves / never solves.

    A rollout is *right* when its reward is at least `r_correct` (the reward at its maximum: 1.0
    for the binary rewards "arith" / "math") and *wrong* when it is at most `r_wrong` (0.0); a
    group is all-right (all-wrong) when every one of its rollouts is. These are exactly the groups
    whose focal success rate mu (`rl.weighting.success_rate`, same `r_correct` / `r_wrong`) is 1
    (0) when rewards lie in [r_wrong, r_correct]. With a binary reward the two fractions add up to
    `zero_variance_fraction` (a group with equal rewards is all right or all wrong); with a graded
    reward (e.g. "char_match") equal partial rewards count in neither.

    rewards: [num_prompts * group_size], each prompt's group contiguous. Returns two float32
    scalars in [0, 1].
    """
    grouped = _grouped(rewards, group_size)
    all_right = jnp.all(grouped >= r_correct, axis=1)
    all_wrong = jnp.all(grouped <= r_wrong, axis=1)
    return (
        jnp.mean(all_right.astype(jnp.float32)),
        jnp.mean(all_wrong.astype(jnp.float32)),
    )


def step_metrics(
    cfg: GRPOConfig,
    rewards: Any,
    lengths: np.ndarray,
    finished: np.ndarray,
    extra: dict[str, jax.Array],
    times: tuple[float, float, float, float],
    per_update: list[dict[str, Any]],
) -> dict[str, float]:
    """A step's metrics from all rollouts' rewards / lengths / finished flags [R], the seconds of
    its four phases (rollout, reward, score, update) and each update's diagnostics.

    The paper's training diagnostics (F-GRPO, arXiv 2602.06717): all_right_frac /
    all_wrong_frac (`group_outcome_fractions`, right = reward >= cfg.r_correct) split
    zero_variance_frac; `entropy` (from `policy_loss`'s aux) is the mean token entropy, in
    nats, of the sampling distribution (logits / temperature; top-k / top-p not applied) over
    every completion token of the batch (EOS included, padding excluded; pooled, so a longer
    completion weighs more), computed in the update's forward pass: with one update per step
    (epochs = num_minibatches = 1, the default) that is exactly the policy that sampled the
    rollouts, before its update; with several it is the mean over the updates.
    """
    t_roll, t_reward, t_score, t_update = times
    r = np.asarray(rewards)
    num_tokens = float(lengths.sum())
    all_right, all_wrong = group_outcome_fractions(
        rewards, cfg.group_size, cfg.r_correct, cfg.r_wrong
    )
    metrics = {
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()),
        "zero_variance_frac": float(zero_variance_fraction(rewards, cfg.group_size)),
        "all_right_frac": float(all_right),
        "all_wrong_frac": float(all_wrong),
        "focal_weight_mean": float(extra["focal_weight_mean"]),
        "completion_len_mean": float(lengths.mean()),
        "truncation_rate": float(1.0 - finished.mean()),
        "rollout_s": t_roll,
        "reward_s": t_reward,
        "score_s": t_score,
        "update_s": t_update,
        "step_s": t_roll + t_reward + t_score + t_update,
    }
    metrics["tokens_per_s"] = num_tokens / metrics["step_s"]
    metrics["rollout_tokens_per_s"] = num_tokens / max(t_roll, 1e-9)
    # Update diagnostics: mean over the step's updates, except the ratio extremes.
    reduce = {"ratio_min": np.min, "ratio_max": np.max}
    for k in per_update[0]:
        vals = np.asarray([float(m[k]) for m in per_update])
        metrics[k] = float(reduce.get(k, np.mean)(vals))
    return metrics
