"""Full-parameter training: the model's own weights as what a gradient method trains.

Beside the adapters of `lora.policies` (LoRA factors, singular values, ESSA's genome), the
`(trainable, frozen, to_lora)` triple of `full_policy` trains the weights themselves, as both
papers' GRPO baselines do (ESSA arXiv 2507.04453, Sec. 5; F-GRPO arXiv 2602.06717, Sec. 5: verl,
AdamW lr 1e-6 on every weight of Qwen2.5-7B). A trainer then runs the model on
`merge_weights(trainable, base)` with no adapter (`to_lora` = `no_lora`); the base it is given
stays the frozen initial weights, which is exactly GRPO's KL reference (beta > 0: the reference
pass is the base with no adapter, so the reference costs no second copy of anything).

`TRAINED_WEIGHTS` (`config.train.params`) is the one vocabulary:

  * "lora": the adapter (`lora.policies`: the method's own choice, LoRA / SVD values / genome);
  * "full": every weight (embedding, norms, projections, untied head);
  * "projections": the seven projections' kernels and biases (q k v o gate up down); embedding,
    head and norms frozen (a subset commonly picked to keep the vocabulary rows fixed).

Mixed precision (Micikevicius et al. 2018, arXiv 1710.03740, Sec. 3.1): the trainers keep the
trainable as a float32 master copy (`lora.master_weights`) and so is the AdamW state;
`merge_weights` casts each master leaf to the base leaf's dtype at use, so the model computes in
its own dtype (bfloat16 on accelerators) and the gradient arrives in float32 through the cast. A
bfloat16 master would round an AdamW step of lr 1e-6 away (tests/rl/test_full_params.py shows it),
hence float32: 2 + 4 + 4 + 4 = 14 bytes per trained weight (bf16 base, f32 master, AdamW m and v).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax

from essa_jax.lora.adapter import ToLora, master_weights, merge_lora
from essa_jax.models.config import PROJECTIONS
from essa_jax.models.quant import QuantizedKernel

# What a gradient method trains (`config.train.params`): the adapter or the model's weights.
TRAINED_WEIGHTS = ("lora", "full", "projections")
# What SFT trains in a full-parameter run (`config.train.sft_params`): "same" = the weights
# `train.params` names; "lora" = a LoRA adapter, then folded into them (`merged_masters`).
SFT_PARAMS = ("same", "lora")

# (trainable, base weights) -> the weights the model runs with; None in a trainer = the base.
ToParams = Callable[[Any, Any], Any]


def select_weights(params: Mapping[str, Any], subset: str) -> dict[str, Any]:
    """The trained part of a params pytree: every leaf ("full") or the projections' kernels and
    biases under "layers" ("projections"), as a nested dict of the same keys (leaves shared, not
    copied). Raises ValueError for another subset or a quantised kernel (integer weights have no
    gradient: train full-precision weights, `model.quantize = "none"`)."""
    if subset == "full":
        chosen = dict(params)
    elif subset == "projections":
        chosen = {"layers": {p: params["layers"][p] for p in PROJECTIONS}}
    else:
        raise ValueError(f"weights subset {subset!r}: valid are {TRAINED_WEIGHTS[1:]}")
    for leaf in jax.tree.leaves(chosen, is_leaf=lambda x: isinstance(x, QuantizedKernel)):
        if isinstance(leaf, QuantizedKernel):
            raise ValueError("full-parameter training needs float weights, not quantised kernels")
    return jax.tree.map(lambda x: x, chosen)


def compute_copy(trainable: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """`trainable` (a nested sub-dict of `base`) with each leaf cast to the base leaf's dtype:
    the compute weights of float32 masters (bfloat16 on accelerators)."""
    return {
        k: compute_copy(v, base[k]) if isinstance(v, Mapping) else v.astype(base[k].dtype)
        for k, v in trainable.items()
    }


def merge_weights(trainable: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with the leaves of `trainable` (a nested sub-dict of it) in their place, each cast
    to the base leaf's dtype (the compute dtype: float32 masters -> bfloat16 weights at use).

    Differentiable in `trainable`: d loss / d master = d loss / d weight, cast back to float32.
    """

    def merge(t: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        return {**b, **{k: merge(v, b[k]) if isinstance(v, Mapping) else v for k, v in t.items()}}

    return merge(compute_copy(trainable, base), base)


def model_weights(trainable: Any, base: Any, to_params: ToParams | None) -> Any:
    """The weights a trainer's model runs with: `base` when the trainable is an adapter
    (`to_params` None), else `to_params(trainable, base)` (`merge_weights`)."""
    return base if to_params is None else to_params(trainable, base)


def no_lora(trainable: Any, frozen_adapter: Any) -> None:
    """`to_lora` of `full_policy`: the model runs without an adapter (the weights are trained)."""
    del trainable, frozen_adapter
    return None


def full_policy(params: Mapping[str, Any], subset: str = "full") -> tuple[Any, Any, ToLora]:
    """Train the model's weights: (trainable = `select_weights(params, subset)`, frozen adapter
    None, `no_lora`). Give the trainer `to_params=merge_weights` and the initial weights as its
    base (the frozen reference). The trainable is the weights as they are (no copy): the trainers
    make its float32 masters (`GRPOTrainer.init`, `train_sft`; under ZeRO directly on their shards,
    `rl.placement.zero_init`, so no device holds a whole float32 copy)."""
    return select_weights(params, subset), None, no_lora


def merged_masters(params: Mapping[str, Any], adapter: Mapping[str, Any], subset: str) -> Any:
    """The float32 masters of `select_weights(params, subset)` with a LoRA `adapter` folded into
    its kernels (W <- W + scale (B A)^T, `merge_lora`, in float32 so that a bfloat16 base does not
    round the delta away): a full-parameter run that starts from the LoRA SFT model
    (`train.sft_params = "lora"`, the same SFT start as the adapter methods). Shapes as `params`."""
    return merge_lora(master_weights(select_weights(params, subset)), dict(adapter))


@flax.struct.dataclass
class TrainedWeights:
    """A full-parameter run's policy as the pipeline passes it around (evaluation, checkpoints,
    export), where a LoRA run passes its adapter dict: the float32 masters of the trained
    weights (`select_weights`' tree)."""

    masters: Any


def policy_inputs(policy: Any, base: Any) -> tuple[Any, Any]:
    """(weights, lora) the model runs a pipeline policy with: a `TrainedWeights` merged into
    `base` with no adapter; an adapter (or None) on `base` as it is."""
    if isinstance(policy, TrainedWeights):
        return merge_weights(policy.masters, base), None
    return base, policy
