"""The GRPO-family loop: GRPO, F-GRPO (focal, arXiv 2602.06717) and SVD-GRPO, from the SFT adapter.

"grpo" / "fgrpo" train both LoRA factors of the SFT adapter; "svdgrpo" (ESSA's baseline, arXiv
2507.04453 Sec. 5) trains, by gradient, exactly the parameters ESSA evolves: the genome of offsets
to the SFT singular values (same SVD, same alpha). Each step samples `grpo.batch_size` rollouts
(`batch_size / group_size` prompts x N) and applies `essa_jax.rl.GRPOTrainer.step`, with the
`essa_jax.rl.GRPOConfig` that `essa_jax.config.grpo_config(config)` derives from the experiment
config ("fgrpo" = the advantage weighting "focal" with gamma = grpo.focal_gamma).

On several devices (or processes) the trainer runs data-parallel on `run.mesh`
(`pipeline.data_parallel_mesh`): the base weights are placed on it once (`rl.place_base`),
rollouts / scoring / updates are sharded over ``data``, each process rewards only its own rows.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from essa_jax import lora as lora_lib
from essa_jax.config import grpo_config, search_seed
from essa_jax.lora.full import TrainedWeights, merge_weights, no_lora
from essa_jax.mesh import host_copy
from essa_jax.rl import FrozenPolicy, GRPOState, GRPOTrainer, on_mesh, place_base
from essa_jax.train.rollouts import init_cursor, next_indices

__all__ = ["GRPOLoop", "GRPOLoopState", "grpo_config"]


@flax.struct.dataclass
class GRPOLoopState:
    """The trainer's state (trainable, optimiser, step, key), the frozen adapter part (the SVD
    basis for svdgrpo, else None) and the data cursor."""

    grpo: GRPOState
    frozen: Any
    cursor: dict[str, jax.Array]

    @property
    def step(self) -> jax.Array:
        return self.grpo.step


class GRPOLoop:
    """init_state / step / policy for the GRPO-family methods."""

    def __init__(self, run: Any):
        self.run = run
        c = run.config
        self.name = c.method
        self.total_steps = c.grpo.steps
        self.num_prompts = c.grpo.batch_size // c.grpo.group_size
        self.svd = c.method == "svdgrpo"
        self.layout = lora_lib.GenomeLayout(
            # Sorted: jax orders dict pytrees by key, so an adapter dict that went through jit or a
            # checkpoint comes back sorted, and the genome layout must match that order.
            targets=tuple(sorted(c.lora.targets)),
            num_layers=run.model_config.num_layers,
            rank=c.lora.rank,
            num_free=lora_lib.num_free_values(c.lora.rank, c.essa.alpha),
        )
        # The to_lora of the policy init_state builds (genome_policy / lora_policy); the trainer
        # needs it now, before the SFT adapter exists. train.params = "full" / "projections":
        # the weights are trained (lora.full), the base stays the initial weights (KL reference).
        self.full = c.train.params != "lora"
        if self.full:
            self.to_lora = no_lora
        elif self.svd:
            self.to_lora = lora_lib.genome_to_lora(self.layout)
        else:
            self.to_lora = lora_lib.plain_to_lora
        tok = run.tokenizer
        self.trainer = GRPOTrainer(
            run.model_config,
            grpo_config(c),
            to_lora=self.to_lora,
            reward_fn=run.reward_fn,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            eos_token_ids=run.sampler.eos_token_ids,
            mesh=run.mesh,
            to_params=merge_weights if self.full else None,
        )
        # Placed once: a jitted call would otherwise transfer the weights on every step.
        # The quantised base when model.quantize is set: rollouts, scores and updates all run on
        # it (QLoRA-style: the gradient reaches the adapter through the dequantised kernels), so
        # the policy that samples is the one that is scored (on-policy ratios).
        base = run.infer_params
        if run.mesh is not None:
            base = place_base(base, run.mesh, run.model_config, shard_data=self.full)
        self.base = base

    def init_state(self, key: jax.Array, sft_lora: Any) -> GRPOLoopState:
        if self.full:  # the SFT weights' masters (`pipeline.initial_policy`, `train_sft`)
            trainable, frozen = sft_lora.masters, None
        elif self.svd:
            sft_lora = {t: sft_lora[t] for t in self.layout.targets}
            basis, layout = lora_lib.svd_factorize(sft_lora, self.run.config.essa.alpha)
            assert layout == self.layout, (layout, self.layout)
            trainable, frozen, _ = lora_lib.genome_policy(
                basis, layout, lora_lib.sft_genome(layout)
            )
        else:
            trainable, frozen, _ = lora_lib.lora_policy(sft_lora)
        return GRPOLoopState(
            grpo=self.trainer.init(trainable, key),
            frozen=frozen,
            cursor=init_cursor(len(self.run.train), search_seed(self.run.config) + 2),
        )

    def _local(self, tree: Any) -> Any:
        """A one-device copy of mesh-placed values (held-out evaluation and export run on one
        device); as it is without a mesh."""
        if self.run.mesh is None:
            return tree
        return jax.tree.map(jnp.asarray, host_copy(tree))  # ZeRO state: gathered across processes

    def policy_lora(self, state: GRPOLoopState) -> Any:
        if self.full:
            return TrainedWeights(self._local(state.grpo.params))
        return self.to_lora(self._local(state.grpo.params), self._local(state.frozen))

    def export_lora(self, state: GRPOLoopState) -> Any:
        params, frozen = self._local(state.grpo.params), self._local(state.frozen)
        if self.full:
            return TrainedWeights(params)
        if self.svd:
            return lora_lib.svd_lora_to_lora(frozen, self.layout, params)
        return params

    def step(self, state: GRPOLoopState) -> tuple[GRPOLoopState, dict[str, float], int]:
        run = self.run
        idx, cursor = next_indices(state.cursor, self.num_prompts)
        batch = run.train.take(idx)
        if run.mesh is not None:  # the frozen adapter part (svdgrpo's basis) placed once
            state = state.replace(frozen=on_mesh(state.frozen, run.mesh))
        policy = FrozenPolicy(base=self.base, adapter=state.frozen)
        new, m = self.trainer.step(
            state.grpo,
            policy,
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.mask),
            batch.prompts,
            **batch.fields,
        )
        rollouts = self.num_prompts * self.trainer.cfg.group_size
        tokens = int(round(m["completion_len_mean"] * rollouts))
        metrics = {
            "reward": m.pop("reward_mean"),
            "zero_variance": m.pop("zero_variance_frac"),
            # F-GRPO's diagnostics (arXiv 2602.06717), splitting zero_variance: prompt groups whose
            # every rollout is right (reward >= grpo.r_correct, 1.0 for "arith" / "math") or wrong
            # (<= grpo.r_wrong); `entropy` (kept as is) is the sampling policy's mean token entropy
            # over the completion tokens (`rl.outcomes.step_metrics`).
            "all_right": m.pop("all_right_frac"),
            "all_wrong": m.pop("all_wrong_frac"),
            "completion_len": m.pop("completion_len_mean"),
            "truncated": m.pop("truncation_rate"),
            **m,
        }
        return state.replace(grpo=new, cursor=cursor), metrics, tokens
