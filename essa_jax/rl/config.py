"""Configuration of the GRPO-family trainer (GRPO, DAPO, CISPO, Dr.GRPO and their focal F-variants).

Defaults are the F-GRPO paper's (arXiv 2602.06717, Sec. 5): beta = 0 (no KL), clip 0.2 / 0.2,
token-mean aggregation, AdamW lr 1e-6, weight decay 0.01, grad clip 1.0, N = 8 rollouts per prompt,
temperature 1.0. The methods are settings of three orthogonal choices:

  * the loss (`loss`, a kind of `essa_jax.rl.losses.LOSS_KINDS`) with its clip range:
      GRPO    loss="grpo", eps_low=0.2, eps_high=0.2 (the defaults);
      DAPO    the "grpo" loss with clip-higher, eps_high=0.28 (arXiv 2503.14476);
      CISPO   loss="cispo", eps_low=1.0, eps_high=5.0 (the F-GRPO paper's setting);
  * the advantage estimator (`advantage`, a name of `essa_jax.rl.advantage`): "group" (GRPO),
    "batch", "none" (Dr.GRPO, with agg="seq_mean_token_sum_norm", arXiv 2503.20783);
  * the advantage weighting (`weighting`, a name of `essa_jax.rl.weighting`): "none", or "focal"
    with gamma > 0 for the F-variants (F-GRPO, F-DAPO, F-CISPO; the paper's gamma is 0.5).

What is trained (LoRA factors, singular values, ESSA's genome) is not part of the config: the caller
chooses it (`essa_jax.lora.policies`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from essa_jax.mesh import rows_per_device_problem
from essa_jax.rl.advantage import estimator_names
from essa_jax.rl.losses import AGGREGATIONS, LOSS_KINDS
from essa_jax.rl.weighting import weighting_names


class GRPOConfigError(ValueError):
    """A `GRPOConfig` field holds an invalid value; `field` names it, `valid` says what is valid."""

    def __init__(self, field: str, value: Any, valid: str, hint: str = ""):
        self.field = field
        self.value = value
        self.valid = valid
        self.hint = hint
        msg = f"GRPOConfig.{field} must be {valid}, got {value!r}"
        super().__init__(msg + (f"; {hint}" if hint else ""))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int_at_least(name: str, v: Any, low: int, hint: str = "") -> None:
    if not (_is_int(v) and v >= low):
        raise GRPOConfigError(name, v, f"an int >= {low}", hint)


def _nonneg(name: str, v: Any) -> None:
    if not (_is_num(v) and v >= 0):
        raise GRPOConfigError(name, v, "a finite number >= 0")


def _positive(name: str, v: Any) -> None:
    if not (_is_num(v) and v > 0):
        raise GRPOConfigError(name, v, "a finite number > 0")


def _choice(name: str, v: Any, valid: tuple[str, ...]) -> None:
    if v not in valid:
        raise GRPOConfigError(name, v, "one of " + " | ".join(map(repr, valid)))


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of one GRPO-family training step (frozen, hashable: a jit static arg).

    Attributes (paper symbols in brackets):
      group_size: rollouts per prompt [N], >= 2 (group-relative advantages).
      loss: policy-loss kind of `essa_jax.rl.losses.policy_loss`: "grpo" (clipped ratio: GRPO,
        and DAPO with eps_high = 0.28) | "cispo" (clipped, detached IS weight).
      eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] of the ratio ("grpo", eps_low < 1)
        or of the weight ("cispo"; the paper's 1.0 / 5.0). No per-loss default: set them.
      agg: loss aggregation, "token_mean" (DAPO / F-GRPO) | "seq_mean_token_mean" (GRPO) |
        "seq_mean_token_sum_norm" (Dr.GRPO).
      max_len: Dr.GRPO's constant normaliser; None = max_new_tokens.
      advantage: name of the advantage estimator (`essa_jax.rl.advantage`): "group" | "batch" |
        "none" (Dr.GRPO) or one registered with `register_estimator`.
      adv_eps: added to the std [eps]. adv_ddof: 1 = Bessel-corrected std (TRL), 0 = population.
      weighting: name of the advantage weighting (`essa_jax.rl.weighting`): "none" | "focal"
        (F-GRPO) or one registered with `register_weighting`.
      weighting_args: the weighting's own parameters as sorted (name, value) pairs (hashable: the
        config is a jit static argument); a weighting reads them as `cfg.weighting_kwargs`.
      gamma: focal exponent [gamma] of weighting "focal"; 0 = plain GRPO, 0.5 = the F-GRPO paper's
        best. Must be 0 with weighting "none".
      r_correct, r_wrong: rewards of a correct / wrong rollout (define the success rate mu).
      beta: k3 KL weight [beta] to the base model (adapter disabled).
      learning_rate, weight_decay, max_grad_norm, adam_b1, adam_b2, adam_eps: AdamW + clipping.
      epochs: optimisation passes over each rollout batch (TRL's num_iterations; > 1 makes the
        ratio differ from 1). num_minibatches: updates per pass (rollouts split evenly).
      max_new_tokens, temperature, top_k, top_p: sampling of the rollouts.
      use_generation_logprobs: use the sampler's per-token log-probs as old_logp instead of
        recomputing them with a teacher-forced forward pass (see trainer docs).
      micro_batch_size: rollouts per gradient micro-batch inside one update (gradient
        accumulation, the same update; `GRPOTrainer.loss_and_grad`); 0 = the whole mini-batch.
        It counts rows *per device*: data-parallel over a mesh's ``data`` axis of size d, each
        device holds ceil(mini-batch / d) rollouts of a mini-batch and accumulates over its own
        micro-batches (one device's activations bound, whatever d). Must divide those rows (on
        one device: the mini-batch, rollouts per step / num_minibatches).
      remat: checkpoint each decoder layer in the training and scoring passes (`jax.checkpoint`;
        the same values, less memory, about one more forward pass of compute).
      rows_per_chunk: rollouts generated at once (`models.generate_chunked`: one chunk's KV cache
        live at a time); 0 = all of them in one batch. Any value > 0 samples row r with
        fold_in(key, r), so every chunk size gives the same rollouts; 0 keeps the one-key batch
        sampling of `models.generate` (different samples from the same key).

    Invalid values raise `GRPOConfigError` (a ValueError) naming the field. The estimator and
    weighting names are checked against the registries, so register before building the config.
    """

    group_size: int = 8
    loss: str = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    agg: str = "token_mean"
    max_len: int | None = None
    advantage: str = "group"
    adv_eps: float = 1e-6
    adv_ddof: int = 1
    weighting: str = "none"
    weighting_args: tuple[tuple[str, Any], ...] = ()
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
    micro_batch_size: int = 0
    remat: bool = False
    rows_per_chunk: int = 0

    def __post_init__(self) -> None:
        _int_at_least("group_size", self.group_size, 2, "group-relative advantages need N >= 2")
        _choice("loss", self.loss, LOSS_KINDS)
        _nonneg("eps_low", self.eps_low)
        _nonneg("eps_high", self.eps_high)
        if self.loss == "grpo" and self.eps_low >= 1.0:
            raise GRPOConfigError(
                "eps_low", self.eps_low, "< 1 for the clipped-ratio loss 'grpo'",
                "the ratio is positive; CISPO's eps_low = 1.0 needs loss='cispo'",
            )  # fmt: skip
        _choice("agg", self.agg, AGGREGATIONS)
        if self.max_len is not None:
            _int_at_least("max_len", self.max_len, 1)
        _choice("advantage", self.advantage, estimator_names())
        _nonneg("adv_eps", self.adv_eps)
        if self.adv_ddof not in (0, 1) or isinstance(self.adv_ddof, bool):
            raise GRPOConfigError("adv_ddof", self.adv_ddof, "0 or 1")
        _choice("weighting", self.weighting, weighting_names())
        if not (
            isinstance(self.weighting_args, tuple)
            and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                    for p in self.weighting_args)
        ):  # fmt: skip
            raise GRPOConfigError(
                "weighting_args", self.weighting_args, "a tuple of (name, value) pairs"
            )
        try:
            hash(self.weighting_args)
        except TypeError:
            raise GRPOConfigError(
                "weighting_args", self.weighting_args, "hashable values (numbers, strings, tuples)"
            ) from None
        _nonneg("gamma", self.gamma)
        if self.weighting == "none" and self.gamma != 0:
            raise GRPOConfigError(
                "gamma", self.gamma, "0 with weighting='none'",
                "the focal exponent acts only with weighting='focal' (F-GRPO)",
            )  # fmt: skip
        for name in ("r_correct", "r_wrong"):
            if not _is_num(getattr(self, name)):
                raise GRPOConfigError(name, getattr(self, name), "a finite number")
        if self.r_correct == self.r_wrong:
            raise GRPOConfigError(
                "r_correct", self.r_correct, f"different from r_wrong={self.r_wrong!r}"
            )
        _nonneg("beta", self.beta)
        _positive("learning_rate", self.learning_rate)
        _nonneg("weight_decay", self.weight_decay)
        if not (isinstance(self.max_grad_norm, int | float) and self.max_grad_norm > 0):
            raise GRPOConfigError("max_grad_norm", self.max_grad_norm, "a number > 0 (inf = none)")
        for name in ("adam_b1", "adam_b2"):
            v = getattr(self, name)
            if not (_is_num(v) and 0 <= v < 1):
                raise GRPOConfigError(name, v, "a number in [0, 1)")
        _positive("adam_eps", self.adam_eps)
        _int_at_least("epochs", self.epochs, 1)
        _int_at_least("num_minibatches", self.num_minibatches, 1)
        _int_at_least("max_new_tokens", self.max_new_tokens, 1)
        if not (_is_num(self.temperature) and self.temperature > 0):
            raise GRPOConfigError(
                "temperature", self.temperature, "> 0",
                "sampling: greedy rollouts have no group variance",
            )  # fmt: skip
        _int_at_least("top_k", self.top_k, 0)
        if not (_is_num(self.top_p) and 0 < self.top_p <= 1):
            raise GRPOConfigError("top_p", self.top_p, "in (0, 1]")
        if not isinstance(self.use_generation_logprobs, bool):
            raise GRPOConfigError("use_generation_logprobs", self.use_generation_logprobs, "a bool")
        _int_at_least("micro_batch_size", self.micro_batch_size, 0, "0 = the whole mini-batch")
        if not isinstance(self.remat, bool):
            raise GRPOConfigError("remat", self.remat, "a bool")
        _int_at_least("rows_per_chunk", self.rows_per_chunk, 0, "0 = all rollouts at once")

    @property
    def weighting_kwargs(self) -> dict[str, Any]:
        """The weighting's own parameters (`weighting_args`) as a dict."""
        return dict(self.weighting_args)

    @property
    def norm_len(self) -> int:
        """Dr.GRPO's constant length normaliser."""
        return self.max_len if self.max_len is not None else self.max_new_tokens

    def check_batch(self, num_rollouts: int, data: int = 1) -> None:
        """Raise if `num_rollouts` is not divisible by group_size and num_minibatches, or if
        micro_batch_size does not divide the rows each of `data` devices holds of a mini-batch."""
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
        self.check_micro_batch(num_rollouts // self.num_minibatches, data)

    def check_micro_batch(self, minibatch: int, data: int = 1) -> None:
        """Raise GRPOConfigError unless micro_batch_size is 0 or divides the rollouts each of
        `data` devices holds of a `minibatch` (ceil(minibatch / data): the mini-batch is padded
        to the data axis, `essa_jax.mesh.pad_to`)."""
        valid = rows_per_device_problem(
            self.micro_batch_size, minibatch, data, "rollouts", f"a mini-batch of {minibatch}"
        )
        if valid is not None:
            raise GRPOConfigError("micro_batch_size", self.micro_batch_size, valid)
