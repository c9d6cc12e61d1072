"""Advantage estimators: group-relative advantages and a registry of estimators by name.

Rewards are flat `[num_prompts * group_size]` with each prompt's group of rollouts contiguous
(prompt 0's rollouts first, then prompt 1's, ...): the layout `jnp.repeat(prompts, group_size, 0)`
produces. Every function here is pure, jit-able (`group_size` and the string options are static) and
returns one value per rollout. The trainer's advantages are an estimator's output times a weighting
(`essa_jax.rl.weighting`):

    GRPO    A   = group_advantages(R, N)
    F-GRPO  A^F = focal_weights(R, N, gamma) * group_advantages(R, N)

Rewards are maximised: a positive advantage raises the probability of that rollout.

The registry (`GRPOConfig.advantage` names one entry): an estimator is

    fn(rewards: jax.Array [B], group_size: int, cfg: GRPOConfig) -> jax.Array [B]

reading from `cfg` whatever it needs (the built-ins read `adv_eps` and `adv_ddof`). Built in:
"group" (GRPO, std of each prompt's group), "batch" (std of the whole batch, Lite PPO) and "none"
(Dr.GRPO, no std). Add one with `register_estimator("name", fn)` (or as a decorator); a
hyper-parameter of your own goes in the closure, e.g. `functools.partial`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

from essa_jax.rl.registry import Registry

AdvantageScale = Literal["group", "batch", "none"]
ADVANTAGE_SCALES = ("group", "batch", "none")
# fn(rewards [B], group_size, cfg) -> advantages [B].
Estimator = Callable[[jax.Array, int, Any], jax.Array]


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


def zero_variance_fraction(rewards: jax.Array, group_size: int) -> jax.Array:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    grouped = _grouped(rewards, group_size)
    same = jnp.all(grouped == grouped[:, :1], axis=1)
    return jnp.mean(same.astype(jnp.float32))


# ----------------------------------------------------------------------------- the registry

_ESTIMATORS = Registry("advantage estimator")


def register_estimator(name: str, fn: Estimator | None = None, *, overwrite: bool = False):
    """Register `fn(rewards [B], group_size, cfg) -> [B]` as advantage estimator `name`.

    Use as `register_estimator("rloo", fn)` or as a decorator `@register_estimator("rloo")`;
    returns `fn`. Then `GRPOConfig(advantage="rloo")` selects it. Re-registering a name raises
    unless `overwrite=True`.
    """
    return _ESTIMATORS.register(name, fn, overwrite=overwrite)


def get_estimator(name: str) -> Estimator:
    """The advantage estimator registered as `name` (ValueError naming the valid ones if none)."""
    return _ESTIMATORS.get(name)


def estimator_names() -> tuple[str, ...]:
    """Names of the registered advantage estimators, in registration order."""
    return _ESTIMATORS.names()


def _scaled(scale: AdvantageScale) -> Estimator:
    def estimator(rewards: jax.Array, group_size: int, cfg: Any) -> jax.Array:
        return group_advantages(rewards, group_size, scale, cfg.adv_eps, cfg.adv_ddof)

    estimator.__name__ = f"{scale}_advantages"
    estimator.__doc__ = f"`group_advantages(rewards, group_size, {scale!r}, adv_eps, adv_ddof)`."
    return estimator


for _scale in ADVANTAGE_SCALES:
    register_estimator(_scale, _scaled(_scale))
