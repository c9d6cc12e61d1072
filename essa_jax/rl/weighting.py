"""Advantage weightings: F-GRPO's focal weight and a registry of weightings by name.

A weighting multiplies the advantages of an estimator (`essa_jax.rl.advantage`), rollout by
rollout, before the policy loss:

    A_i <- w_i * A_i,     w = weighting(rewards, group_size, cfg)

This stage IS F-GRPO's "separate transform" (arXiv 2602.06717): the focal weight (1 - mu)^gamma acts
on the advantages, one scalar per prompt group, before the loss; it is not an optax gradient
transformation (the gradient of a group scales with its weight only through its advantages, and
the optimiser's clipping / Adam normalisation come after). A weighting that returns 0 for some
groups is a group filter (DAPO's dynamic sampling drops groups whose rewards are all equal).

The registry (`GRPOConfig.weighting` names one entry): a weighting is

    fn(rewards: jax.Array [B], group_size: int, cfg: GRPOConfig) -> jax.Array [B]

treated as a constant by the optimiser (the trainer computes it from the rewards only). Built in:
"none" (ones: GRPO, DAPO, CISPO) and "focal" ((1 - mu)^gamma with gamma = `cfg.gamma` and mu the
group's success rate between `cfg.r_wrong` and `cfg.r_correct`: F-GRPO). Add one with
`register_weighting("name", fn)` (or as a decorator); a hyper-parameter of your own goes in the
closure, e.g. `functools.partial`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from essa_jax.rl.advantage import AdvantageScale, _grouped, group_advantages
from essa_jax.rl.registry import Registry

# fn(rewards [B], group_size, cfg) -> weights [B].
Weighting = Callable[[jax.Array, int, Any], jax.Array]


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


# ----------------------------------------------------------------------------- the registry

_WEIGHTINGS = Registry("advantage weighting")


def register_weighting(name: str, fn: Weighting | None = None, *, overwrite: bool = False):
    """Register `fn(rewards [B], group_size, cfg) -> [B]` as advantage weighting `name`.

    Use as `register_weighting("hard_only", fn)` or as a decorator `@register_weighting("...")`;
    returns `fn`. Then `GRPOConfig(weighting="hard_only")` selects it. Re-registering a name raises
    unless `overwrite=True`.
    """
    return _WEIGHTINGS.register(name, fn, overwrite=overwrite)


def get_weighting(name: str) -> Weighting:
    """The advantage weighting registered as `name` (ValueError naming the valid ones if none)."""
    return _WEIGHTINGS.get(name)


def weighting_names() -> tuple[str, ...]:
    """Names of the registered advantage weightings, in registration order."""
    return _WEIGHTINGS.names()


@register_weighting("none")
def no_weighting(rewards: jax.Array, group_size: int, cfg: Any) -> jax.Array:
    """Weight 1 for every rollout (GRPO, DAPO, CISPO)."""
    del cfg
    grouped = _grouped(rewards, group_size)
    return jnp.ones(grouped.size, grouped.dtype)


@register_weighting("focal")
def focal_weighting(rewards: jax.Array, group_size: int, cfg: Any) -> jax.Array:
    """F-GRPO: `focal_weights(rewards, group_size, cfg.gamma, cfg.r_correct, cfg.r_wrong)`."""
    return focal_weights(rewards, group_size, cfg.gamma, cfg.r_correct, cfg.r_wrong)
