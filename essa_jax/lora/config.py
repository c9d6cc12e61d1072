"""LoRA configuration: which projections are adapted, with what rank and scale.

The target names are the model's projection names (`essa_jax.models.config.PROJECTIONS`); their
shapes are the model's (`essa_jax.models.config.projection_shape`, for a `ModelConfig` or any
object with the fields `hidden_size, intermediate_size, num_heads, num_kv_heads, head_dim`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from essa_jax.models.config import PROJECTIONS, projection_shape

VALID_TARGETS = PROJECTIONS
# ESSA's default: the attention projections (arXiv 2507.04453, Sec. 3).
ATTENTION_TARGETS = VALID_TARGETS[:4]  # q, k, v, o
MLP_TARGETS = VALID_TARGETS[4:]  # gate, up, down


def target_shape(model_config: Any, target: str) -> tuple[int, int]:
    """(in_features, out_features) of the projection `target` in every layer of `model_config`."""
    if target not in VALID_TARGETS:
        raise ValueError(f"unknown LoRA target {target!r}; valid targets: {VALID_TARGETS}")
    return projection_shape(model_config, target)


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Hyper-parameters of a LoRA adapter (Hu et al. 2021, arXiv 2106.09685; PEFT conventions).

    Attributes:
      rank: r, the inner dimension of delta W = B A (A: r x in, B: out x r).
      alpha: lora_alpha; the update is scaled by alpha / r (or alpha / sqrt(r) with `use_rslora`,
        Kalajdzievski 2023, arXiv 2312.03732), exactly as PEFT does.
      targets: adapted projections, a subset of ("q", "k", "v", "o", "gate", "up", "down").
        ESSA adapts q, k, v, o (arXiv 2507.04453, Sec. 3).
      use_rslora: rank-stabilised scaling alpha / sqrt(r).
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ATTENTION_TARGETS
    use_rslora: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.targets, str) or not isinstance(self.targets, tuple | list):
            raise ValueError(
                f"LoraConfig.targets must be a tuple of target names, got {self.targets!r}; "
                f"valid names: {VALID_TARGETS}"
            )
        object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraConfig.rank must be a positive integer, got {self.rank!r}")
        if not (
            isinstance(self.alpha, int | float) and math.isfinite(self.alpha) and self.alpha > 0
        ):
            raise ValueError(
                f"LoraConfig.alpha must be a positive finite number, got {self.alpha!r}"
            )
        if not self.targets:
            raise ValueError(f"LoraConfig.targets is empty; choose from {VALID_TARGETS}")
        unknown = [t for t in self.targets if t not in VALID_TARGETS]
        if unknown:
            raise ValueError(
                f"LoraConfig.targets has unknown names {unknown}; valid names: {VALID_TARGETS}"
            )
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoraConfig.targets has duplicates: {self.targets}")

    @property
    def scale(self) -> float:
        """The factor PEFT multiplies B A x by: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def validate_for(self, model_config: Any) -> None:
        """Raise ValueError if the rank exceeds min(in, out) of any target of `model_config`."""
        for t in self.targets:
            fan_in, fan_out = target_shape(model_config, t)
            limit = min(fan_in, fan_out)
            if self.rank > limit:
                raise ValueError(
                    f"LoraConfig.rank={self.rank} is larger than min(in, out)={limit} "
                    f"of target {t!r} (in={fan_in}, out={fan_out}); valid ranks: 1..{limit}"
                )
