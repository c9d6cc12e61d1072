"""Group-relative advantages and the focal weight of F-GRPO.

Rewards are flat `[num_prompts * group_size]` with each prompt's group of rollouts contiguous
(prompt 0's rollouts first, then prompt 1's, ...): the layout `jnp.repeat(prompts, group_size, 0)`
produces. Every function here is pure, jit-able (`group_size` and the string options are static) and
returns one value per rollout, so they compose by multiplication:

    GRPO    A   = group_advantages(R, N)
    F-GRPO  A^F = focal_weights(R, N, gamma) * group_advantages(R, N)

Rewards are maximised: a positive advantage raises the probability of that rollout.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES = ("group", "batch", "none")


def _grouped(rewards: jax.Array, group_size: int) -> jax.Array:
    """[num_prompts * group_size] -> [num_prompts, group_size], with a clear error on bad shapes."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    rewards = jnp.asarray(rewards)
    if rewards.ndim != 1:
        raise ValueError(
            f"rewards must be flat [num_prompts * group_size], got shape {rewards.shape}"
        )
    n = rewards.shape[0]
    if n == 0 or n % group_size:
        raise ValueError(
            f"group_size={group_size} must divide the number of rewards ({n}): rewards are "
            "[num_prompts * group_size] with each prompt's rollouts contiguous"
        )
    if not jnp.issubdtype(rewards.dtype, jnp.floating):
        rewards = rewards.astype(jnp.float32)
    return rewards.reshape(n // group_size, group_size)


def _std(x: jax.Array, axis, ddof: int) -> jax.Array:
    count = x.size if axis is None else x.shape[axis]
    if ddof >= count:
        raise ValueError(
            f"std with ddof={ddof} needs more than {ddof} values per group, got {count}; "
            "use ddof=0 (population std) or a larger group"
        )
    return jnp.std(x, axis=axis, ddof=ddof, keepdims=axis is not None)


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    scale: AdvantageScale = "group",
    eps: float = 1e-6,
    ddof: int = 1,
) -> jax.Array:
    """Group-relative advantages (GRPO, DeepSeekMath arXiv 2402.03300, eq. 3 outcome supervision).

        A_i = (R_i - mean_g(R)) / (std(R) + eps)

    `scale` chooses the denominator std:
      * "group": std of the prompt's own group (GRPO);
      * "batch": std of all rewards in the batch, the mean still per group (TRL's
        `scale_rewards="batch"`, as in Lite PPO);
      * "none":  no division at all, A_i = R_i - mean_g(R) (Dr.GRPO, arXiv 2503.20783).

    Conventions (the papers are silent; these match TRL's GRPOTrainer): the std is the unbiased,
    Bessel-corrected one (`ddof=1`, like `torch.std`); pass `ddof=0` for the population std. `eps`
    is added to the std *outside* the square root, so a zero-variance group has A = 0 exactly
    (its numerator is zero) rather than 0/0.

    Args:
      rewards: [num_prompts * group_size] rewards, each prompt's group contiguous.
      group_size: rollouts per prompt (N); must divide `rewards.shape[0]`.
      scale: "group" | "batch" | "none".
      eps: added to the std before dividing.
      ddof: delta degrees of freedom of the std (1 = Bessel, 0 = population).

    Returns:
      [num_prompts * group_size] advantages, float.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    grouped = _grouped(rewards, group_size)
    centred = grouped - jnp.mean(grouped, axis=1, keepdims=True)
    if scale == "group":
        adv = centred / (_std(grouped, 1, ddof) + eps)
    elif scale == "batch":
        adv = centred / (_std(grouped, None, ddof) + eps)
    else:
        adv = centred
    return adv.reshape(-1)


def success_rate(
    rewards: jax.Array, group_size: int, r_correct: float = 1.0, r_wrong: float = 0.0
) -> jax.Array:
    """Empirical success rate of each group, broadcast per rollout (F-GRPO, arXiv 2602.06717).

        mu = (mean_g(R) - R_wrong) / (R_correct - R_wrong), clipped to [0, 1]

    With binary rewards this is X / N (X correct rollouts of N). Returns [num_prompts * group_size].
    """
    if r_correct == r_wrong:
        raise ValueError(f"r_correct and r_wrong must differ, both are {r_correct!r}")
    grouped = _grouped(rewards, group_size)
    mu = (jnp.mean(grouped, axis=1) - r_wrong) / (r_correct - r_wrong)
    mu = jnp.clip(mu, 0.0, 1.0)
    return jnp.repeat(mu, group_size)


def focal_weights(
    rewards: jax.Array,
    group_size: int,
    gamma: float | jax.Array,
    r_correct: float = 1.0,
    r_wrong: float = 0.0,
) -> jax.Array:
    """Focal weight of each rollout's group (F-GRPO, arXiv 2602.06717): g = (1 - mu)^gamma.

    `mu` is the group's success rate (`success_rate`). The weight is one scalar per prompt group,
    broadcast to its rollouts, and is a constant for the optimiser (stop_gradient): it rescales the
    advantage, it is not optimised. gamma = 0 gives g = 1 everywhere, including all-correct groups
    (0^0 = 1), so `focal_weights * group_advantages` is exactly GRPO. Harder prompts (lower mu)
    keep more of their advantage: N = 8, gamma = 0.5, X = 1..7 correct gives
    0.935, 0.866, 0.791, 0.707, 0.612, 0.500, 0.354.

    Args:
      rewards: [num_prompts * group_size], each prompt's group contiguous.
      group_size: rollouts per prompt N.
      gamma: focusing exponent, >= 0 (paper: 0.5, 1 or 2; 0.5 usually best).
      r_correct, r_wrong: rewards of a correct / wrong rollout (defining mu for non-binary rewards).

    Returns:
      [num_prompts * group_size] weights in [0, 1].
    """
    if not isinstance(gamma, jax.core.Tracer):
        if jnp.ndim(gamma) != 0 or float(gamma) < 0:
            raise ValueError(f"gamma must be a scalar >= 0, got {gamma!r}")
    mu = success_rate(rewards, group_size, r_correct, r_wrong)
    return jax.lax.stop_gradient(jnp.power(1.0 - mu, jnp.asarray(gamma, mu.dtype)))


def focal_group_advantages(
    rewards: jax.Array,
    group_size: int,
    gamma: float | jax.Array,
    scale: AdvantageScale = "group",
    eps: float = 1e-6,
    ddof: int = 1,
    r_correct: float = 1.0,
    r_wrong: float = 0.0,
) -> jax.Array:
    """F-GRPO advantages A^F_i = g * A_i (arXiv 2602.06717): the composition, nothing more."""
    return focal_weights(rewards, group_size, gamma, r_correct, r_wrong) * group_advantages(
        rewards, group_size, scale, eps, ddof
    )


def zero_variance_fraction(rewards: jax.Array, group_size: int) -> jax.Array:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    grouped = _grouped(rewards, group_size)
    same = jnp.all(grouped == grouped[:, :1], axis=1)
    return jnp.mean(same.astype(jnp.float32))
