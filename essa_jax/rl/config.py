"""Configuration of the GRPO-family trainer (GRPO, DAPO, CISPO and their focal F-variants).

Defaults are the F-GRPO paper's (arXiv 2602.06717, Sec. 5): beta = 0 (no KL), clip 0.2 / 0.2,
token-mean aggregation, AdamW lr 1e-6, weight decay 0.01, grad clip 1.0, N = 8 rollouts per prompt,
temperature 1.0. `gamma = 0` (the default) is plain GRPO; the paper's focal setting is gamma = 0.5.
`GRPOConfig.preset(name)` gives each method of the paper with its settings.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from essa_jax.rl.advantages import ADVANTAGE_SCALES
from essa_jax.rl.losses import AGGREGATIONS

METHODS = ("grpo", "dapo", "cispo")
# Clip ranges (eps_low, eps_high) per method: GRPO symmetric 0.2; DAPO "clip-higher" 0.2 / 0.28
# (arXiv 2503.14476); CISPO clips the IS weight to [1 - 1.0, 1 + 5.0] (F-GRPO paper, Sec. 5).
DEFAULT_CLIP = {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "cispo": (1.0, 5.0)}
PRESETS = ("grpo", "dapo", "cispo", "f-grpo", "f-dapo", "f-cispo", "dr-grpo", "svd-grpo")


def _positive_int(name: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"GRPOConfig.{name} must be a positive int, got {v!r}")


def _nonneg(name: str, v: Any) -> None:
    if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
        raise ValueError(f"GRPOConfig.{name} must be a finite number >= 0, got {v!r}")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of one GRPO-family training step (frozen, hashable: a jit static arg).

    Attributes (paper symbols in brackets):
      group_size: rollouts per prompt [N].
      method: "grpo" | "dapo" | "cispo". DAPO is the GRPO loss with clip-higher; the loss kind
        follows from the method (grpo/dapo -> clipped ratio, cispo -> clipped detached weight).
      eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; None = the method's default
        (DEFAULT_CLIP).
      agg: loss aggregation, "token_mean" (DAPO / F-GRPO) | "seq_mean_token_mean" (GRPO) |
        "seq_mean_token_sum_norm" (Dr.GRPO).
      max_len: Dr.GRPO's constant normaliser; None = max_new_tokens.
      adv_scale: advantage std, "group" | "batch" | "none" (Dr.GRPO).
      adv_eps: added to the std [eps]. adv_ddof: 1 = Bessel-corrected std (TRL), 0 = population.
      gamma: focal exponent [gamma]; 0 = plain GRPO, 0.5 = the F-GRPO paper's best.
      r_correct, r_wrong: rewards of a correct / wrong rollout (define the success rate mu).
      beta: k3 KL weight [beta] to the base model (adapter disabled).
      learning_rate, weight_decay, max_grad_norm, adam_b1, adam_b2, adam_eps: AdamW + clipping.
      epochs: optimisation passes over each rollout batch (TRL's num_iterations; > 1 makes the
        ratio differ from 1). num_minibatches: updates per pass (rollouts split evenly).
      max_new_tokens, temperature, top_k, top_p: sampling of the rollouts.
      use_generation_logprobs: use the sampler's per-token log-probs as old_logp instead of
        recomputing them with a teacher-forced forward pass (see trainer docs).
    """

    group_size: int = 8
    method: str = "grpo"
    eps_low: float | None = None
    eps_high: float | None = None
    agg: str = "token_mean"
    max_len: int | None = None
    adv_scale: str = "group"
    adv_eps: float = 1e-6
    adv_ddof: int = 1
    gamma: float = 0.0
    r_correct: float = 1.0
    r_wrong: float = 0.0
    beta: float = 0.0
    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    adam_eps: float = 1e-8
    epochs: int = 1
    num_minibatches: int = 1
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    use_generation_logprobs: bool = False

    def __post_init__(self) -> None:
        _positive_int("group_size", self.group_size)
        if self.method not in METHODS:
            raise ValueError(f"GRPOConfig.method must be one of {METHODS}, got {self.method!r}")
        lo, hi = DEFAULT_CLIP[self.method]
        if self.eps_low is None:
            object.__setattr__(self, "eps_low", lo)
        if self.eps_high is None:
            object.__setattr__(self, "eps_high", hi)
        _nonneg("eps_low", self.eps_low)
        _nonneg("eps_high", self.eps_high)
        if self.method != "cispo" and self.eps_low >= 1.0:
            raise ValueError(
                f"GRPOConfig.eps_low={self.eps_low} must be < 1 for the clipped-ratio loss of "
                f"{self.method!r} (the ratio is positive)"
            )
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"GRPOConfig.agg must be one of {AGGREGATIONS}, got {self.agg!r}")
        if self.max_len is not None:
            _positive_int("max_len", self.max_len)
        if self.adv_scale not in ADVANTAGE_SCALES:
            raise ValueError(
                f"GRPOConfig.adv_scale must be one of {ADVANTAGE_SCALES}, got {self.adv_scale!r}"
            )
        _nonneg("adv_eps", self.adv_eps)
        if self.adv_ddof not in (0, 1):
            raise ValueError(f"GRPOConfig.adv_ddof must be 0 or 1, got {self.adv_ddof!r}")
        if self.adv_scale != "none" and self.adv_ddof >= self.group_size:
            raise ValueError(
                f"GRPOConfig.group_size={self.group_size} is too small for a std with "
                f"adv_ddof={self.adv_ddof}; use group_size >= 2 or adv_ddof=0"
            )
        _nonneg("gamma", self.gamma)
        if self.r_correct == self.r_wrong:
            raise ValueError(
                f"GRPOConfig.r_correct and r_wrong must differ, both are {self.r_correct!r}"
            )
        _nonneg("beta", self.beta)
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"GRPOConfig.learning_rate must be > 0, got {self.learning_rate!r}")
        _nonneg("weight_decay", self.weight_decay)
        if not self.max_grad_norm > 0:
            raise ValueError(f"GRPOConfig.max_grad_norm must be > 0, got {self.max_grad_norm!r}")
        _positive_int("epochs", self.epochs)
        _positive_int("num_minibatches", self.num_minibatches)
        _positive_int("max_new_tokens", self.max_new_tokens)
        if not self.temperature > 0:
            raise ValueError(
                f"GRPOConfig.temperature must be > 0 (sampling; greedy rollouts have no group "
                f"variance), got {self.temperature!r}"
            )
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"GRPOConfig.top_k must be an int >= 0, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"GRPOConfig.top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def loss_kind(self) -> str:
        """The `policy_loss` kind of the method: "cispo" for CISPO, else "grpo"."""
        return "cispo" if self.method == "cispo" else "grpo"

    @property
    def norm_len(self) -> int:
        """Dr.GRPO's constant length normaliser."""
        return self.max_len if self.max_len is not None else self.max_new_tokens

    def check_batch(self, num_rollouts: int) -> None:
        """Raise if `num_rollouts` is not divisible by group_size and num_minibatches."""
        if num_rollouts % self.group_size:
            raise ValueError(
                f"{num_rollouts} rollouts are not a whole number of groups of "
                f"group_size={self.group_size}"
            )
        if num_rollouts % self.num_minibatches:
            raise ValueError(
                f"GRPOConfig.num_minibatches={self.num_minibatches} must divide the number of "
                f"rollouts per step ({num_rollouts} = prompts x group_size)"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GRPOConfig:
        """The paper settings of a method (F-GRPO arXiv 2602.06717, Sec. 5), with overrides.

        "grpo" / "dapo" / "cispo": gamma = 0; "f-grpo" / "f-dapo" / "f-cispo": gamma = 0.5;
        "dr-grpo": no std scaling, constant-length aggregation (arXiv 2503.20783);
        "svd-grpo": GRPO (the ESSA paper's baseline; the trainable parameters are chosen by the
        caller, not by the config).
        """
        table: dict[str, dict[str, Any]] = {
            "grpo": {"method": "grpo"},
            "dapo": {"method": "dapo"},
            "cispo": {"method": "cispo"},
            "f-grpo": {"method": "grpo", "gamma": 0.5},
            "f-dapo": {"method": "dapo", "gamma": 0.5},
            "f-cispo": {"method": "cispo", "gamma": 0.5},
            "dr-grpo": {"method": "grpo", "adv_scale": "none", "agg": "seq_mean_token_sum_norm"},
            "svd-grpo": {"method": "grpo"},
        }
        if name not in table:
            raise ValueError(f"unknown GRPO preset {name!r}; valid presets: {PRESETS}")
        return cls(**{**table[name], **overrides})
