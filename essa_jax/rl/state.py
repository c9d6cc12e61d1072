"""The values a GRPO-family step passes around: its state, the frozen policy, a rollout batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax

# Host reward `fn(prompts, completions, **task_fields) -> list[float]`, maximised.
RewardFn = Callable[..., Sequence[float]]


@flax.struct.dataclass
class GRPOState:
    """Everything that changes during training (a pytree; checkpoint / resume it as is).

    params: the trainable pytree; opt_state: the optax state; step: int32 scalar;
    key: raw PRNG key data (uint32 [2]), split once per step.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array


@flax.struct.dataclass
class FrozenPolicy:
    """What the optimiser does not touch: base weights and the frozen part of the adapter."""

    base: Any
    adapter: Any = None


@flax.struct.dataclass
class RolloutBatch:
    """One optimisation batch of B = prompts x group_size rollouts (Tp prompt, N new tokens).

    tokens [B, Tp + N] (left-padded prompt, then completion); attention_mask [B, Tp + N];
    completion_mask [B, N] float (1 = sampled token, EOS included); advantages [B];
    old_logp [B, N] or None (on-policy: the current log-probs, detached); ref_logp [B, N] or None.
    On a mesh the rows are sharded over ``data`` and padded to it (`essa_jax.mesh.pad_to`), the
    padding rows with completion mask and advantage 0.
    """

    tokens: jax.Array
    attention_mask: jax.Array
    completion_mask: jax.Array
    advantages: jax.Array
    old_logp: jax.Array | None = None
    ref_logp: jax.Array | None = None
