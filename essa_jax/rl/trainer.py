"""The GRPO-family training step on the host: rollouts, rewards, (focal) advantages, optax updates.

One step (GRPO, arXiv 2402.03300, Alg. 1; F-GRPO, arXiv 2602.06717):
  1. rollouts: each prompt repeated `group_size` times (groups contiguous) and sampled with the
     current adapter (`essa_jax.models.generate`, temperature T);
  2. rewards from a host function `reward_fn(prompts, completions, **task_fields) -> list[float]`;
  3. advantages: `compute_advantages` = the estimator `cfg.advantage` (`essa_jax.rl.advantage`:
     "group" = GRPO) times the weighting `cfg.weighting` (`essa_jax.rl.weighting`: "focal" =
     F-GRPO's (1 - mu)^gamma per prompt group, applied to the advantages before the loss);
  4. old log-probs (the behaviour policy) and, when beta > 0, reference log-probs: the *base model
     with the adapter disabled* (lora=None), so no second copy of the weights exists;
  5. `epochs` passes of `num_minibatches` AdamW updates, each one jitted call of
     `update_step(policy, trainable, opt_state, batch)`.

What is trained is decided by the caller through two inputs, so GRPO on a LoRA and the ESSA paper's
SVD-GRPO baseline (gradients on the singular values only, U and V frozen) share all the code:
  * `trainable`: the pytree the optimiser updates (LoRA dict, singular values, or a genome);
  * `to_lora(trainable, frozen_adapter) -> {target: adapter}`: the model's LoRA hook argument;
  * `to_params(trainable, base) -> weights` (full-parameter training, `essa_jax.lora.full`: the
    trained weights cast to the base's dtype; the base stays the KL reference), or None.
`essa_jax.lora.policies` (`lora_policy`, `svd_policy`, `genome_policy`) builds the standard choices;
this module knows nothing of them (the default `to_lora` passes `trainable` through as the LoRA).

Old log-probs: by default they are recomputed with a teacher-forced pass (`sequence_logprobs`), the
same code path as the training log-probs, so at the first update the ratio is exactly 1. The
sampler's own log-probs (KV-cache decode) agree only to float rounding (~1e-6 in float32; more in
bf16), so they are used only with `use_generation_logprobs=True`. When the batch is used for exactly
one update (epochs = num_minibatches = 1) the policy that sampled is the one being differentiated,
so old_logp = stop_gradient(logp) and the extra forward pass is skipped (as TRL does).

State = `GRPOState(params, opt_state, step, key)`, a pytree: checkpoint it and a resumed run is
bit-identical. Rewards are maximised; the loss is minimised.

One step, always on a mesh (`mesh=`, docs/ARCHITECTURE.md, "Data-parallel GRPO and SFT"; none
given = a mesh of this process's first device): the rollouts, scoring passes and updates are the
programs of `essa_jax.rl.programs`, `jax.shard_map` over ``data`` (``model`` stays Auto). Each
process reads back and rewards only its own rows (`essa_jax.mesh.local_blocks`); the per-row
rewards, lengths and finished flags are all-gathered (`essa_jax.mesh.allgather_owned`), so every
process computes the same advantages and the same update. Row r samples with fold_in(key, r)
whatever the layout (on one device with rows_per_chunk = 0: the one batch key), so 1 device with
rows_per_chunk > 0, d devices and several processes draw the same rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from essa_jax.lora.adapter import ToLora, master_weights, plain_to_lora
from essa_jax.lora.full import ToParams
from essa_jax.mesh import allgather_owned, local_blocks, padded_size
from essa_jax.models.config import ModelConfig
from essa_jax.models.generate import Generation
from essa_jax.models.tokenizer import decode_completions
from essa_jax.rl.config import GRPOConfig
from essa_jax.rl.optimizer import make_optimizer
from essa_jax.rl.outcomes import compute_advantages, step_metrics
from essa_jax.rl.placement import on_mesh, one_device_mesh, zero_init
from essa_jax.rl.programs import GRPOPrograms
from essa_jax.rl.state import FrozenPolicy, GRPOState, RewardFn, RolloutBatch


class GRPOTrainer(GRPOPrograms):
    """Compiled GRPO-family step for one model config, `GRPOConfig` and parameterisation.

    Holds no training state (that is `GRPOState`); it holds the jitted functions, built once.

    Args:
      model_config: the model's `ModelConfig`.
      cfg: `GRPOConfig`.
      to_lora: `(trainable, frozen_adapter) -> {target: adapter}` (see `essa_jax.lora.policies`);
        default: `trainable` is the LoRA dict.
      reward_fn: host reward `fn(prompts, completions, **task_fields) -> list[float]`, maximised.
      decode: token ids -> text of a completion (EOS already stripped).
      optimizer: optax transformation; default `make_optimizer(cfg)`.
      eos_token_ids: end-of-sequence ids for generation (default: the model config's).
      mesh: run data-parallel over this mesh's ``data`` axis (`essa_jax.mesh.make_mesh(pop=1,
        data=d, model=m)`, every process's devices; see the module docstring); None = a mesh of
        this process's first device (`rl.placement.one_device_mesh`). `rollout`, `score` and
        `update_step` are the programs of `GRPOPrograms` (rows sharded over ``data``, padded to it
        by `essa_jax.mesh.pad_to`); `update_step` takes `num_rows` (static: the real rows of the
        batch, the rest padding).
      to_params: full-parameter training (`lora.full`): `(trainable, base) -> weights`
        (`merge_weights`), with `to_lora=no_lora`; the policy's base stays the initial weights,
        the KL reference. None = the base as it is (adapter training).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        cfg: GRPOConfig,
        *,
        to_lora: ToLora = plain_to_lora,
        reward_fn: RewardFn,
        decode: Callable[[list[int]], str],
        optimizer: optax.GradientTransformation | None = None,
        eos_token_ids: Sequence[int] | None = None,
        mesh: Mesh | None = None,
        to_params: ToParams | None = None,
    ):
        super().__init__(
            model_config,
            cfg,
            to_lora,
            optimizer or make_optimizer(cfg),
            model_config.eos_token_ids if eos_token_ids is None else eos_token_ids,
            one_device_mesh() if mesh is None else mesh,
            to_params,
        )
        self.reward_fn = reward_fn
        self.decode = decode

    # -- state

    def init(self, trainable: Any, key: jax.Array) -> GRPOState:
        """Initial state; `key` may be a typed key or raw key data.

        The trainable and the optimiser state are float32 masters (`lora.master_weights`: bfloat16
        leaves are upcast) whatever the model dtype; the adapters cast to the activations' dtype
        at use. Abstract state for a planner: `jax.eval_shape(self.init, trainable, key)`.
        """
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        if self.shard_weights and not isinstance(jax.tree.leaves(trainable)[0], jax.core.Tracer):
            # ZeRO: masters and AdamW state made on their shards (`rl.placement.zero_init`).
            trainable, opt_state = zero_init(
                trainable, self.optimizer, self.mesh, self.model_config
            )
        else:
            trainable = master_weights(trainable)
            opt_state = self.optimizer.init(trainable)
        return GRPOState(
            params=trainable,
            opt_state=opt_state,
            step=jnp.zeros((), jnp.int32),
            key=jnp.asarray(key),
        )

    # -- the host step

    def make_batch(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        gen: Generation,
        rewards: jax.Array,
    ) -> tuple[RolloutBatch, dict[str, jax.Array]]:
        """The optimisation batch of a rollout `gen` [R_pad] and its rewards [R] (advantages, old /
        reference log-probs), sharded over ``data``, and {"focal_weight_mean"}."""
        advantages, weights = compute_advantages(rewards, self.cfg)
        tokens, attn, comp_mask, advantages = self.assemble(
            prompt_tokens, prompt_mask, gen, on_mesh(advantages, self.mesh)
        )
        batch = self._batch(policy, trainable, gen, tokens, attn, comp_mask, advantages)
        return batch, {"focal_weight_mean": jnp.mean(weights)}

    def _batch(
        self,
        policy: FrozenPolicy,
        trainable: Any,
        gen: Generation,
        tokens: jax.Array,
        attn: jax.Array,
        comp_mask: jax.Array,
        advantages: jax.Array,
    ) -> RolloutBatch:
        """The optimisation batch of assembled rollout rows (one device or data-sharded): old
        log-probs scored when several updates follow one rollout (or the generation's, with
        use_generation_logprobs), reference log-probs when there is a KL term."""
        cfg = self.cfg
        multi_update = cfg.epochs * cfg.num_minibatches > 1
        need_old = multi_update and not cfg.use_generation_logprobs
        need_ref = cfg.beta > 0
        old = ref = None
        if need_old or need_ref:
            old, ref = self.score(
                policy,
                trainable,
                tokens,
                attn,
                with_policy=need_old,
                with_ref=need_ref,
                last=gen.tokens.shape[1],
            )
        if cfg.use_generation_logprobs:
            old = gen.logprobs
        return RolloutBatch(
            tokens=tokens,
            attention_mask=attn,
            completion_mask=comp_mask,
            advantages=advantages,
            old_logp=old,
            ref_logp=ref,
        )

    def step(
        self,
        state: GRPOState,
        policy: FrozenPolicy,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        prompts: Sequence[Any],
        **task_fields: Sequence[Any],
    ) -> tuple[GRPOState, dict[str, float]]:
        """One GRPO-family step on P prompts: P * group_size rollouts, then the updates.

        Args:
          state: `GRPOState`.
          policy: `FrozenPolicy(base params, frozen adapter)`.
          prompt_tokens, prompt_mask: [P, Tp] left-padded prompts (keep Tp fixed across steps
            to avoid recompiling).
          prompts: the P prompts as the reward function expects them (text or chat messages).
          task_fields: per-prompt fields passed to the reward function (e.g. answer=[...]).

        Returns:
          (new state, metrics): floats, see the module docstring of `essa_jax.rl`.

        Every process calls it with the same state and prompts: one rollout program over every
        process's devices; each process decodes and rewards only the rows its devices generated
        (metrics["local_rollouts"] counts them); per-row rewards, lengths and finished flags are
        all-gathered, so the advantages, the batch and the updates are the same everywhere.
        """
        cfg, mesh = self.cfg, self.mesh
        n = cfg.group_size
        num_prompts = int(np.shape(prompt_tokens)[0])
        if len(prompts) != num_prompts:
            raise ValueError(f"{len(prompts)} prompts for {num_prompts} rows of prompt_tokens")
        for name, vals in task_fields.items():
            if len(vals) != num_prompts:
                raise ValueError(f"task field {name!r} has {len(vals)} values for {num_prompts}")
        num_rollouts = num_prompts * n
        cfg.check_batch(num_rollouts, self.data)
        key = jax.random.wrap_key_data(state.key)
        key, k_roll, k_shuffle = jax.random.split(key, 3)
        # Host values every process holds identically -> global arrays (nothing travels); the
        # base weights should come placed already (`place_base`), then this keeps them.
        policy = on_mesh(policy, mesh)
        params, opt_state = self.place_state(state.params, state.opt_state)
        tokens, mask, k_roll = on_mesh(
            (
                np.asarray(prompt_tokens, np.int32),
                np.asarray(prompt_mask, np.int32),
                np.asarray(jax.random.key_data(k_roll)),
            ),
            mesh,
        )

        t0 = time.perf_counter()
        gen = jax.block_until_ready(self.rollout(policy, params, tokens, mask, k_roll))
        t_roll = time.perf_counter() - t0

        t0 = time.perf_counter()
        fields = ("tokens", "lengths", "finished")
        blocks = local_blocks([getattr(gen, f) for f in fields], (num_rollouts,))
        rows = np.asarray([r for (r0,), b in blocks for r in range(r0, r0 + len(b[0]))], np.int64)
        mine = {
            f: np.concatenate([b[i] for _, b in blocks]) if blocks else np.zeros(0, np.int32)
            for i, f in enumerate(fields)
        }
        groups = (rows // n).tolist()
        local_rewards: Sequence[float] = []
        if groups:
            completions = decode_completions(
                self.decode, mine["tokens"], mine["lengths"], self.eos_token_ids
            )
            local_rewards = self.reward_fn(
                [prompts[g] for g in groups],
                completions,
                **{k: [v[g] for g in groups] for k, v in task_fields.items()},
            )
        if len(local_rewards) != len(rows):
            raise ValueError(f"reward_fn returned {len(local_rewards)} rewards for {len(rows)}")
        per_row = np.zeros((3, num_rollouts), np.float32)
        owned = np.zeros(num_rollouts, bool)
        per_row[:, rows] = [
            np.asarray(local_rewards, np.float32).reshape(-1),
            *(mine[f] for f in fields[1:]),
        ]
        owned[rows] = True
        rewards, lengths, finished = allgather_owned(per_row, owned)
        lengths, finished = lengths.astype(np.int32), finished > 0
        rewards = jnp.asarray(rewards)
        t_reward = time.perf_counter() - t0

        t0 = time.perf_counter()
        batch, extra = self.make_batch(policy, params, tokens, mask, gen, rewards)
        jax.block_until_ready(batch)
        t_score = time.perf_counter() - t0

        t0 = time.perf_counter()
        mb = num_rollouts // cfg.num_minibatches
        padded = padded_size(mb, self.data)
        valid = on_mesh((np.arange(padded) < mb).astype(np.float32), mesh)
        per_update = []
        for epoch in range(cfg.epochs):
            perm = None
            if cfg.num_minibatches > 1:
                # The permutation of the one-device step, the same on every process.
                perm = np.asarray(
                    jax.random.permutation(jax.random.fold_in(k_shuffle, epoch), num_rollouts)
                )
            for j in range(cfg.num_minibatches):
                if perm is None:
                    sub = batch  # rows >= num_rollouts are padding already
                else:
                    idx = perm[j * mb : (j + 1) * mb]
                    idx = np.concatenate([idx, np.full(padded - mb, idx[0])]).astype(np.int32)
                    sub = self.take(batch, on_mesh(idx, mesh), valid)
                params, opt_state, m = self.update_step(policy, params, opt_state, sub, num_rows=mb)
                per_update.append(m)
        per_update = jax.device_get(per_update)
        t_update = time.perf_counter() - t0

        new_state = GRPOState(
            params=params,
            opt_state=opt_state,
            step=state.step + 1,
            key=jax.random.key_data(key),
        )
        times = (t_roll, t_reward, t_score, t_update)
        metrics = step_metrics(cfg, rewards, lengths, finished, extra, times, per_update)
        metrics["local_rollouts"] = float(len(rows))
        return new_state, metrics
